"""The memory finding: the fastest what-if does not fit.

Where allocator events were measured and a memory limit is known (``--memory-limit`` or the GPUs' capacity),
every what-if row says whether its predicted peak fits (``analysis/memory/fit.py``). When the row that replays
shortest is predicted not to fit, its gain is out of reach until memory is freed: the finding's worth is what
it would give back beyond the best row that fits (both replay gains over the current setup, per step), and
its action is to free the memory it needs (activation checkpointing, a smaller micro-batch, offload).
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import finding, job_step, ms
from pipebubble.report import Report
from pipebubble.report.findings import Finding, Where


def findings(report: Report) -> list[Finding]:
    pipe, step = report.pipeline, job_step(report)
    if pipe is None or step is None or report.memory is None:
        return []
    current = next((r for r in pipe.recommendations if r.label.startswith("current:")), None)
    judged = [r for r in pipe.recommendations if r.fits is not None]
    if current is None or not judged:
        return []
    fastest = min(judged, key=lambda r: r.step_time_ns)
    fitting = [r for r in judged if r.fits]
    best_fit = min(fitting, key=lambda r: r.step_time_ns) if fitting else None
    if fastest.fits or best_fit is None or fastest.step_time_ns >= current.step_time_ns:
        return []  # the fastest fits, or nothing does (the limit is below what runs today)
    reach = min(best_fit.step_time_ns, current.step_time_ns)
    worth = reach - fastest.step_time_ns
    if not worth:
        return []
    change = fastest.label.split(" → ")[0]
    limits = sorted({s.capacity_bytes for s in report.memory.stages if s.capacity_bytes})
    return [finding(
        "memory", f"{change} would replay {ms(worth)} shorter a step than the best setup that fits, but is "
        f"predicted to need {fastest.peak_memory_bytes / 2**20:,.1f} MiB on its largest stage",
        Where(stages=[s.stage for s in report.memory.stages]), "the fastest what-if runs out of memory",
        {"change": change, "replayed_ns": fastest.step_time_ns, "peak_memory_bytes": fastest.peak_memory_bytes,
         "best_fitting": best_fit.label.split(" → ")[0], "best_fitting_ns": best_fit.step_time_ns,
         "capacities_bytes": limits},
        worth, pipe.stages, step.ns,
        f"free memory on the largest stage (activation checkpointing, offload) to run {change}",
        "the best fitting row's replay (or the current setup's, if faster) minus the fastest row's, per step",
    )]
