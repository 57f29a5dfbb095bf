"""GPU-time findings from the breakdown and the idle account, per step: exposed communication, and the GPU idle
of each cause the host can fix (a sync stall, a blocking copy, the allocator, a CPU-bound host, launch
overhead), each naming the calls and operators behind it.

Rules (each per step, then the mean over steps; a trace without step markers is one window, each GPU's):
- exposed_comm (jobs without a pipeline; a pipeline's sends and receives are ``exposed_p2p``): the exposed
  communication of the GPU with the least of it. A GPU's exposed communication holds its spin waiting for
  late peers as well as the transfer; overlapping the transfer with compute shortens the step by at most
  what every GPU pays, and the GPU with the least exposed communication bounds that (the spin of the
  others only moves to a wait elsewhere). One GPU traced alone gives its own, spin included: an upper bound.
- sync_stall, blocking_copy, allocator, cpu_bound (operators and Python), launch_bound (the launch API and its
  latency): the idle of those causes (``Breakdown.idle_causes``, the idle account's sums) on the busiest GPU
  of the step (the most time in work, window minus idle): the GPU that sets the step, whose gaps lie on the
  step's critical path; for a single GPU the step is that GPU's. The calls and operators named are the
  account's biggest on that GPU over its window (``Report.idle``).
"""

from __future__ import annotations

from dataclasses import replace

from pipebubble.analysis.findings.common import Step, finding, gpu_step, gpus, mean, ms, step_rows
from pipebubble.analysis.findings.per_lane import busiest as busiest_gpus
from pipebubble.report import Breakdown, Report
from pipebubble.report.findings import Finding, Where
from pipebubble.report.idle import WORDS, IdleCause

#: kind -> the idle causes it sums.
KINDS = {
    "sync_stall": ("sync_stall",),
    "blocking_copy": ("blocking_copy",),
    "allocator": ("allocator",),
    "cpu_bound": ("cpu_ops", "python"),
    "launch_bound": ("launch",),
}
#: kind -> its idle, as the worth's ``how`` says it.
_IDLE = {"sync_stall": "in and after synchronizes (the refill)", "blocking_copy": "in blocking copies",
         "allocator": "in the allocator", "cpu_bound": "while its launching thread ran operators or Python",
         "launch_bound": "in launch calls and their latency"}
#: Operators named in a finding.
TOP_OPS = 3


def findings(report: Report) -> list[Finding]:
    """The breakdown's findings (none without breakdown rows)."""
    groups = step_rows(report)
    step = gpu_step(groups)
    if step is None:
        return []
    frees = gpus(report)
    found = [idle_cause(groups, step, frees, kind, report) for kind in KINDS]
    if report.pipeline is None:
        found.append(exposed_comm(groups, step, frees))
    return [f for f in found if f is not None]


def exposed_comm(groups: list[list[Breakdown]], step: Step, frees: int) -> Finding | None:
    """The least exposed communication over the GPUs of each step, the mean over steps (module docstring)."""
    least = [min(rows, key=lambda b: b.comm_exposed_ns) for rows in groups]
    worth = mean([b.comm_exposed_ns for b in least])
    if worth <= 0:
        return None
    lanes = sorted({b.lane for rows in groups for b in rows})
    per_gpu = {lane: mean([b.comm_exposed_ns for rows in groups for b in rows if b.lane == lane]) for lane in lanes}
    return finding(
        "exposed_comm", f"communication not overlapped with compute: {ms(worth)} {step.per_words} on every GPU",
        Where(gpus=lanes), "collectives run while no compute runs beside them",
        {"comm_exposed_ns": per_gpu, "least_gpus": sorted({b.lane for b in least}), "gpus_compared": len(lanes)},
        worth, frees, step, "overlap communication with compute (DDP buckets, FSDP prefetch, a side stream)",
        step.how("the exposed communication of the GPU with the least of it"),
    )


def idle_cause(groups: list[list[Breakdown]], step: Step, frees: int, kind: str, report: Report) -> Finding | None:
    """``kind``'s idle (``KINDS``) on each step's busiest GPU, the mean over steps, with the calls and
    operators behind it on those GPUs."""
    causes = KINDS[kind]
    busiest = busiest_gpus(groups)
    worth = mean([sum(b.idle_causes.get(c, 0) for c in causes) for b in busiest])
    if worth <= 0:
        return None
    lanes = list(dict.fromkeys(b.lane for b in busiest))
    behind = [row for row in report.idle if row.lane in lanes and row.cause in causes]
    evidence = {"idle_ns": mean([b.idle_ns for b in busiest]), "busiest_gpus": lanes,
                "by_cause_ns": {c: mean([b.idle_causes.get(c, 0) for b in busiest]) for c in causes},
                "behind": [_behind(r) for r in sorted(behind, key=lambda r: -r.ns)[:TOP_OPS]]}
    whole = [b for b in report.breakdown if b.step is None and b.lane in lanes]
    title, why, action = _WORDS[kind](_scaled(behind, whole, evidence["by_cause_ns"]), report)
    return finding(
        kind, f"the busiest GPU ({', '.join(lanes)}) idles {ms(worth)} {step.per_words} {title}", Where(gpus=lanes),
        why, {f"idle_{kind}_ns": worth, **evidence, **_host_evidence(kind, report)}, worth, frees, step, action,
        step.how(f"the busiest GPU's idle {_IDLE[kind]} (the GPU that sets the {step.per}); the calls"
                 " and operators named: the idle account's biggest on those GPUs, each cause's in proportion to its"
                 " part"
                 " of the worth"),
    )


def _scaled(rows: list[IdleCause], whole: list[Breakdown], worth: dict[str, int]) -> list[IdleCause]:
    """The account's rows (totals over the busiest GPUs' whole windows, ``whole``) as parts of the worth: the
    same cause, operator and call summed over those GPUs, then each cause's rows scaled by the worth's part of
    that cause (``worth``, a step's) over the cause's total on those GPUs, so a cause named whole says the
    worth's own figure."""
    merged: dict[tuple, IdleCause] = {}
    for r in rows:
        key = (r.cause, r.op, r.call)
        had = merged.get(key)
        merged[key] = r if had is None else replace(had, ns=had.ns + r.ns, gaps=had.gaps + r.gaps)
    totals = {c: sum(b.idle_causes.get(c, 0) for b in whole) for c in worth}
    return [replace(r, ns=r.ns * worth.get(r.cause, 0) // totals[r.cause] if totals.get(r.cause) else 0)
            for r in merged.values()]


def _behind(row: IdleCause) -> dict:
    return {"cause": row.cause, "op": row.op, "call": row.call, "ns": row.ns, "gaps": row.gaps}


def _named(rows: list[IdleCause], with_call: bool = True) -> str:
    """The biggest rows' calls and operators as words: ``cudaStreamSynchronize in aten::to (23.6 ms)``."""
    parts = []
    for r in sorted(rows, key=lambda r: -r.ns)[:TOP_OPS]:
        what = " in ".join(x for x in ((r.call if with_call else None), r.op) if x) or (
            f"{WORDS.get(r.cause, r.cause)}, no call named")
        parts.append(f"{what} ({ms(r.ns)})")
    return ", ".join(parts)


def _sync(rows: list[IdleCause], report: Report) -> tuple[str, str, str]:
    named = _named(rows)
    return (f"while the host blocks in a synchronize and then refills the GPU's queue: {named}{_calls(rows, report)}",
            "a synchronize drains the GPU's queue; the GPU then idles while the host launches the next work",
            "drop the synchronizations from the step: .item(), .cpu(), .tolist(), printing or branching on a GPU"
            " value, tensor.to('cpu'), torch.cuda.synchronize(), nonzero() / boolean masks (data-dependent shapes);"
            " keep such values on the GPU or read them once every N steps")


def _copy(rows: list[IdleCause], report: Report) -> tuple[str, str, str]:
    named = _named(rows) + _calls(rows, report)
    return (f"while the host is in a blocking copy: {named}",
            "a copy that returns only once done (cudaMemcpy, or a copy to or from pageable memory) holds the host,"
            " so nothing is queued behind it",
            "copy from pinned memory with non_blocking=True (pin_memory=True in the DataLoader, tensor.pin_memory());"
            " build tensors on the host and copy once, not torch.tensor(python_list, device='cuda') in the step")


def _allocator(rows: list[IdleCause], report: Report) -> tuple[str, str, str]:
    return (f"while the host is in the allocator: {_named(rows)}",
            "cudaMalloc / cudaFree synchronize the device; the caching allocator calls them when its cache misses",
            "keep the caching allocator warm: no torch.cuda.empty_cache() in the loop, steady tensor shapes,"
            " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; profile steady steps, not the first ones")


def _cpu(rows: list[IdleCause], report: Report) -> tuple[str, str, str]:
    ops = [r for r in rows if r.cause == "cpu_ops"]
    python = sum(r.ns for r in rows if r.cause == "python")
    named = _named(ops, with_call=False)
    tail = (f"; Python or untraced time {ms(python)}" if python else "")
    return (f"while its host thread runs operators, not launching: {named}{tail}" if named else
            "while its host thread runs Python or untraced code, not launching",
            "the host is CPU-bound: the launching thread spends the gaps in operators' host code (or Python),"
            " not in the launch API",
            "cut the host's work per step: torch.compile or CUDA graphs for the operator overhead, fewer and larger"
            " operators (bigger batches), move host-side work (data preparation, metrics) off the launching"
            " thread; profile with with_stack=True to see the Python behind these operators")


def _launch(rows: list[IdleCause], report: Report) -> tuple[str, str, str]:
    from pipebubble.analysis.findings.framework import framework

    graphs = "cuda_graphs" in framework(report)
    action = ("the engine already replays CUDA graphs: launch less outside them (fuse the eager steps between"
              " graph replays, capture more of the step)" if graphs else
              "launch less often: CUDA graphs, torch.compile, fused or fewer short kernels, bigger batches")
    return (f"in the launch API itself: {_named(rows)}",
            "launching costs the host more than the kernels cost the GPU", action)


def _calls(rows: list[IdleCause], report: Report) -> str:
    """How often the host made the biggest row's call, and how long each took, from the host API table."""
    call = max(rows, key=lambda r: r.ns).call if rows else None
    stat = next((c for c in (report.host.api if report.host else []) if c.name == call), None) if call else None
    if stat is None or not stat.count:
        return ""
    return f"; {call}: {stat.count:,} calls in the job, {ms(stat.total_ns / stat.count)} each on average"


_WORDS = {"sync_stall": _sync, "blocking_copy": _copy, "allocator": _allocator, "cpu_bound": _cpu,
          "launch_bound": _launch}


def _host_evidence(kind: str, report: Report) -> dict:
    """The host's side of the cause: short kernels and launch delay, or the synchronize calls' totals."""
    host = report.host
    if host is None:
        return {}
    if kind == "launch_bound":
        return {"launches": host.launches, "short_kernels": host.short_kernels, "short_kernel_ns": host.short_kernel_ns,
                "launch_delay_median_ns": host.launch_delay_median_ns}
    return {}
