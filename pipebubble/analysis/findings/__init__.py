"""Findings: a ranked diagnosis computed from a ``Report``, biggest worth first (``report.findings``).

Pure functions over an existing report (no I/O, no polars): each group of kinds has its module, each
module's docstring says how its worths are computed (``pipeline``: replays and the steady-state bound;
``gpu``: the breakdown per step; ``ranks``: the straggler at collectives; ``serving``: interference;
``preemption``: served requests' preemptions and prefill-heavy steps in the TTFT tail;
``copies``, ``streams``, ``kernels``: exposed copies, communication on the compute stream, tiny kernels and
layout conversions; ``warmup``: a profile of start-up; ``framework`` tells DDP, FSDP, TorchRec and CUDA-graph
replays apart for their actions).
Every worth is the step time a fix gives back (ARCHITECTURE.md, "Worth"), never a sum of idle;
``worth_gpu_ns`` = worth x the GPUs a shorter step frees; ``cost_per_hour`` = gpu_cost x worth_gpu_ns /
step_ns (GPU-hours saved per hour, priced), when a GPU price is given. One exception to the order: a
profile mostly of start-up (``warmup``, evidence ``leads``) opens the list, since its other findings measure
start-up too. In a DP × PP job (``pipeline.replicas``) a rank is late at its stage's gradient sync because
its replica's pipeline runs longer, which the replicas' replay explains and measures (``slow_worker``,
``imbalance``): there the late ranks' findings (``late_rank``) are left out, the data loader's kept.
"""

from __future__ import annotations

from dataclasses import replace

from pipebubble.analysis.findings import (
    copies,
    gpu,
    kernels,
    memory,
    pipeline,
    preemption,
    ranks,
    serving,
    streams,
    warmup,
)
from pipebubble.analysis.findings.common import gpus, job_step
from pipebubble.analysis.requests import findings as requests
from pipebubble.analysis.rootcause import findings as late_rank_findings  # a module: it imports this package
from pipebubble.analysis.rootcause.result import LateRank
from pipebubble.report import Report
from pipebubble.report.findings import KINDS, THRESHOLD, Finding

GROUPS = (pipeline.findings, ranks.findings, gpu.findings, serving.findings, memory.findings,
          lambda r: requests.findings(r.requests), preemption.findings, copies.findings, streams.findings,
          kernels.findings, warmup.findings)


def findings(report: Report, gpu_cost: float | None = None, threshold: float = THRESHOLD,
             late: list[LateRank] | None = None) -> list[Finding]:
    """Every finding worth more than ``threshold`` x its step, priced at ``gpu_cost`` dollars per GPU-hour,
    sorted by worth (biggest first; ties in ``KINDS`` order; a profile mostly of start-up first, ``leads``).
    ``late``: the job's late ranks and why (``rootcause``): their ``late_rank`` / ``data_loader`` findings
    replace the straggler's alone."""
    groups = GROUPS if late is None else tuple(g for g in GROUPS if g is not ranks.findings)
    found = [f for group in groups for f in group(report)] + (_late(report, late) if late else [])
    if report.pipeline is not None and report.pipeline.replicas is not None:
        found = [f for f in found if f.kind != "late_rank"]
    kept = [priced(f, gpu_cost) for f in found if f.worth_ns > threshold * f.evidence["step_ns"]]
    return sorted(kept, key=lambda f: (not leads(f), -f.worth_ns, KINDS.index(f.kind)))


def leads(found: Finding) -> bool:
    """Whether ``found`` opens the findings whatever its worth: a profile mostly of start-up (``warmup``)."""
    return found.kind == "warmup_profile" and bool(found.evidence.get("leads"))


def _late(report: Report, late: list[LateRank]) -> list[Finding]:
    step = job_step(report)
    return [] if step is None else late_rank_findings.findings(late, step.ns, step.count, gpus(report),
                                                                report.collectives, step.per)


def priced(found: Finding, gpu_cost: float | None) -> Finding:
    """``found`` with its cost per hour: the GPU-hours a shorter step saves per hour, at ``gpu_cost``."""
    if gpu_cost is None:
        return found
    return replace(found, cost_per_hour=gpu_cost * found.worth_gpu_ns / found.evidence["step_ns"])
