"""Communication on the compute stream (``comm_on_compute_stream``): NCCL/RCCL kernels queued on the stream that
runs a GPU's compute, where by construction they cannot overlap it.

A GPU's compute stream is its stream with the most compute-kernel time; the finding holds where that stream
also runs communication kernels (streams the trace names; a GPU whose operations carry no stream is left
out). Worth, per step: on each such GPU, its communication time on the compute stream (whole window, brought
to the step at the rate it ran), at most its exposed communication (``Breakdown.comm_exposed_ns``): queued
behind and before the compute, that communication is exposed unless another stream's compute runs beside it;
the least over those GPUs (as ``exposed_comm``: overlapping shortens the step by what every GPU pays, a late
peer's spin only moves), the mean over steps. An upper bound: on their own stream the collectives hide only
under compute that does not need their result.
"""

from __future__ import annotations

from pipebubble.analysis.findings import framework as fw
from pipebubble.analysis.findings.common import finding, gpu_step, gpus, mean, ms, step_rows
from pipebubble.analysis.findings.per_lane import on_step, whole_windows
from pipebubble.report import Report
from pipebubble.report.breakdown import StreamStat
from pipebubble.report.findings import Finding, Where


def findings(report: Report) -> list[Finding]:
    """The finding (none where every GPU runs its communication off its compute stream)."""
    groups = step_rows(report)
    step = gpu_step(groups)
    if step is None or report.host is None:
        return []
    shared = sharing(report.host.facts.streams)
    whole = whole_windows(report)
    rows = [[b for b in group if b.lane in shared] for group in groups]

    def exposed(b) -> int:  # the GPU's communication on its compute stream in the step, at most its exposed
        return min(b.comm_exposed_ns, on_step(shared[b.lane]["comm_ns"], b, whole, len(groups)))

    least = [min(group, key=exposed) for group in rows if group]
    worth = mean([exposed(b) for b in least])
    if worth <= 0:
        return []
    lanes = sorted(shared)
    streams = ", ".join(f"{lane} stream {shared[lane]['stream']}" for lane in lanes)
    evidence = {
        "compute_streams": shared,
        "comm_exposed_ns": {lane: mean([b.comm_exposed_ns for g in rows for b in g if b.lane == lane])
                            for lane in lanes},
        "least_gpus": sorted({b.lane for b in least}),
        "frameworks": fw.seen(report),  # the names the action's frameworks were told from
    }
    return [finding(
        "comm_on_compute_stream",
        f"communication kernels run on the compute stream ({streams}): {ms(worth)} {step.per_words} of them"
        " exposed",
        Where(gpus=lanes),
        "collectives queued on the stream that runs the compute cannot overlap it: each waits for the compute"
        " before it, and the compute after waits for it",
        evidence, worth, gpus(report), step, action(fw.comm_frameworks(report)),
        f"per {step.per}, on each GPU that runs collectives on its compute stream, their time there (at the rate they"
        f" ran), at most its exposed communication; the least over those GPUs, mean over {step.per}s. An upper"
        " bound: on their own stream the collectives hide only under compute that does not need their result",
    )]


def sharing(streams: list[StreamStat]) -> dict[str, dict]:
    """Per GPU lane whose compute stream (the stream with the most compute time) runs communication too: that
    stream, its compute and communication time, and its share of the lane's communication time."""
    compute: dict[str, dict[int, int]] = {}
    comm: dict[str, dict[int, int]] = {}
    for s in streams:
        if s.stream is not None and s.kind in ("compute", "comm"):
            into = compute if s.kind == "compute" else comm
            per = into.setdefault(s.lane, {})
            per[s.stream] = per.get(s.stream, 0) + s.total_ns
    out = {}
    for lane, per in compute.items():
        main = max(per, key=lambda k: (per[k], -k))
        on = comm.get(lane, {}).get(main, 0)
        if on > 0:
            out[lane] = {"stream": main, "compute_ns": per[main], "comm_ns": on,
                         "comm_share": on / sum(comm[lane].values())}
    return out


def action(frameworks: set[str]) -> str:
    """Put the collectives on their own stream; then the framework's overlap advice (``framework.comm_action``)."""
    return ("run the collectives on their own stream: torch.distributed's NCCL process groups do, unless a"
            " collective is issued on torch.cuda.current_stream() (a custom launch, a blocking collective:"
            " async_op=False may run on the current stream); issue them with async_op=True and wait on the work"
            " handle only where the result is needed; then " + fw.comm_action(frameworks))
