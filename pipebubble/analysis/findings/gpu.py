"""GPU-time findings from the breakdown, per profiler step: exposed communication, launch-bound and
sync-stalled GPUs.

Rules (each per step, then the mean over steps; a trace without steps is one step, each GPU's window):
- exposed_comm (jobs without a pipeline; a pipeline's sends and receives are ``exposed_p2p``): the exposed
  communication of the GPU with the least of it. A GPU's exposed communication holds its spin waiting for
  late peers as well as the transfer; overlapping the transfer with compute shortens the step by at most
  what every GPU pays, and the GPU with the least exposed communication bounds that (the spin of the
  others only moves to a wait elsewhere). One GPU traced alone gives its own, spin included: an upper bound.
- launch_bound / sync_stall: the idle of that cause (``Breakdown.idle_causes`` host_launch / sync) on the
  busiest GPU of the step (the most time in work, window minus idle): the GPU that sets the step, whose
  gaps lie on the step's critical path; for a single GPU the step is that GPU's.
"""

from __future__ import annotations

import re

from pipebubble.analysis.findings.common import Step, finding, gpu_step, gpus, mean, ms, step_rows
from pipebubble.report import Breakdown, Host, Report
from pipebubble.report.findings import Finding, Where

SYNC_CALL = re.compile(r"synchron|\bsync\b", re.IGNORECASE)  # cudaStreamSynchronize, nsys "Stream sync"; not *Async


def findings(report: Report) -> list[Finding]:
    """The breakdown's findings (none without breakdown rows)."""
    groups = step_rows(report)
    step = gpu_step(groups)
    if step is None:
        return []
    frees = gpus(report)
    found = [idle_cause(groups, step, frees, "host_launch", report.host),
             idle_cause(groups, step, frees, "sync", report.host)]
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
        "exposed_comm", f"communication not overlapped with compute: {ms(worth)} a step on every GPU",
        Where(gpus=lanes), "collectives run while no compute runs beside them",
        {"comm_exposed_ns": per_gpu, "least_gpus": sorted({b.lane for b in least}), "gpus_compared": len(lanes)},
        worth, frees, step.ns, "overlap communication with compute (DDP buckets, FSDP prefetch, a side stream)",
        "per step, the exposed communication of the GPU with the least of it; mean over steps",
    )


def idle_cause(groups: list[list[Breakdown]], step: Step, frees: int, cause: str, host: Host | None) -> Finding | None:
    """``cause``'s idle on each step's busiest GPU, the mean over steps, as a launch_bound or sync_stall."""
    busiest = [max(rows, key=lambda b: b.window_ns - b.idle_ns) for rows in groups]
    worth = mean([b.idle_causes.get(cause, 0) for b in busiest])
    if worth <= 0:
        return None
    lanes = list(dict.fromkeys(b.lane for b in busiest))
    evidence = {f"idle_{cause}_ns": worth, "idle_ns": mean([b.idle_ns for b in busiest]), "busiest_gpus": lanes}
    kind, title, why, action = _WORDS[cause]
    return finding(
        kind, f"the busiest GPU ({', '.join(lanes)}) idles {ms(worth)} a step {title}", Where(gpus=lanes), why,
        {**evidence, **_host_evidence(cause, host)}, worth, frees, step.ns, action,
        f"per step, the {cause} idle of the busiest GPU (the one that sets the step); mean over steps",
    )


_WORDS = {
    "host_launch": ("launch_bound", "waiting for the host to launch work",
                    "the host launches kernels slower than the GPU runs them",
                    "launch less often: CUDA graphs, torch.compile, fused or fewer short kernels, bigger batches"),
    "sync": ("sync_stall", "while the host waits in a synchronize",
             "the host blocks on the GPU, then the GPU waits for the host's next launches",
             "drop synchronizations from the step (.item(), .cpu(), torch.cuda.synchronize(), nonzero)"),
}


def _host_evidence(cause: str, host: Host | None) -> dict:
    """The host's side of the cause: short kernels and launch delay, or the synchronize calls' totals."""
    if host is None:
        return {}
    if cause == "host_launch":
        return {"launches": host.launches, "short_kernels": host.short_kernels, "short_kernel_ns": host.short_kernel_ns,
                "launch_delay_median_ns": host.launch_delay_median_ns}
    return {"sync_calls": {c.name: {"count": c.count, "total_ns": c.total_ns} for c in host.api
                           if c.name is not None and SYNC_CALL.search(c.name)}}
