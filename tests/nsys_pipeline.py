"""A pipeline in one Nsight Systems export: one process per stage, each on its own GPU.

Each pass is one kernel on the stage's GPU (stream 7), launched from the process's main thread inside an
NVTX range named like the pass (``forward-mb{j}`` / ``backward-mb{j}`` by default); every activation and
gradient handed to a neighbour is an ``ncclDevKernel_SendRecv`` kernel on stream 20 of both GPUs (as torch's
NCCL backend runs a send and a receive): the sender's over the end of its pass, the receiver's from then on.
Written with ``nsys_fixtures`` in any of its layouts; times are those of ``synth.simulate``.
"""

from __future__ import annotations

from pathlib import Path

import nsys_fixtures as fx

PID = 2030  #: stage s runs in process PID - 10 s, on GPU s
STREAM, COMM_STREAM = 7, 20
LAUNCH_NS = 1_000  #: the NVTX range opens this long before its kernel starts
SEND_NS = 500  #: each SendRecv kernel's length
SENDRECV = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
DASHED = ("forward-mb{}", "backward-mb{}")


def pid_of(stage: int) -> int:
    """Process ids fall as stages rise: only the GPUs' order puts the stages in pipeline order."""
    return PID - 10 * stage


def write_pipeline(path: Path, sim, names: tuple[str, str] = DASHED, layout: str = "2026") -> Path:
    """``sim`` (``synth.simulate``) as one export at ``path``; ``names`` formats the forward and backward
    ranges with the micro-batch index."""
    trace = fx.Trace(processes={pid_of(s): f"python3 stage{s}" for s in range(sim.schedule.stages)})
    for act in (a for stage in sim.actions for a in stage):
        s, a = act.stage, act.action
        pid, name = pid_of(s), names[0] if a.phase == "F" else names[1]
        trace.nvtx.append(fx.Nvtx(pid, pid, act.start_ns - LAUNCH_NS, act.end_ns, name.format(a.microbatch)))
        trace.gpu.append(_launched(trace, s, STREAM, act.start_ns, act.end_ns, f"gemm_{a.phase}"))
        peer = s + 1 if a.phase == "F" else s - 1
        if 0 <= peer < sim.schedule.stages:  # the sender's at its pass's end, the receiver's from there
            trace.gpu.append(_launched(trace, s, COMM_STREAM, act.end_ns - SEND_NS, act.end_ns, SENDRECV))
            trace.gpu.append(_launched(trace, peer, COMM_STREAM, act.end_ns, act.end_ns + SEND_NS, SENDRECV))
    return fx.write(trace, path, layout)


def _launched(trace: fx.Trace, stage: int, stream: int, start: int, end: int, name: str) -> fx.Gpu:
    """A kernel launched from the stage's main thread, with the next correlation id of its process: CUPTI
    numbers each process's launches from 1, so the same ids recur in every process of the export."""
    pid = pid_of(stage)
    corr = 1 + sum(g.pid == pid for g in trace.gpu)
    return fx.Gpu(pid, stage, stream, start, end, name=name, correlation=corr, launch_tid=pid)


def write_named_passes(path: Path, names: list[str], layout: str = "2026") -> Path:
    """One process on GPU 0: one 10 µs pass per name, one after another, an NVTX range of that name on the
    main thread around the launch of one 8 µs kernel on stream 7."""
    trace = fx.Trace(processes={PID: "python3"})
    for i, name in enumerate(names):
        start = 20_000 * i
        trace.nvtx.append(fx.Nvtx(PID, PID, start, start + 10_000, name))
        trace.gpu.append(fx.Gpu(PID, 0, STREAM, start + 2_000, start + 10_000, name=f"gemm_{i}", correlation=i + 1,
                                launch_tid=PID))
    return fx.write(trace, path, layout)
