"""Synthetic pipeline traces: a schedule simulated exactly, written as one Kineto file per rank.

Each pass is a kernel on GPU 0, stream 7, launched by a ``cudaLaunchKernel`` inside a
``PP:{virtual stage}{F|B|W}{mb}`` range on the rank's main thread (as torch.distributed.pipelining labels
them). Options add spinning NCCL kernels in front of passes, or leave the labels out.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipebubble.analysis.schedule import schedules, whatif

LAUNCH_NS = 1_000  # the launch call starts this long before its kernel


def simulate(schedule: str, p: int, m: int, forward, backward, chunks: int = 1, weight=None):
    """Timed actions of ``schedule`` with per-stage forward/backward(/weight) ns (same for every micro-batch)."""
    times = whatif.StageTimes(
        tuple((f,) * m for f in forward),
        tuple((b,) * m for b in backward),
        tuple((w,) * m for w in weight) if weight else None,
    )
    return whatif.simulate(schedules.make_schedule(schedule, p, m, chunks), times)


def write_pipeline(
    folder: Path,
    sim,
    *,
    labels: bool = True,
    spin_before_forward: int = 0,
    spin_before_every_pass: int = 0,
    context: bool = False,
    offset_ns: int = 1_000_000,
    rank_of=None,
    world: int | None = None,
    groups: list | None = None,
    p2p: bool = True,
    kernels: int = 1,
) -> Path:
    """One ``rank{s}.json`` per stage. ``spin_before_forward`` ns of ``ncclDevKernel_SendRecv`` end where
    each forward of stages > 0 starts (a receive spinning while it waits for its activation). ``rank_of``
    maps a stage to its rank and ``groups`` is written as ``distributedInfo.pg_config``. With ``p2p`` (the
    default), each activation and gradient handed to a neighbour is an ``nccl:send`` range on the sender's
    thread at the pass's end and an ``nccl:recv`` range on the receiver's (as torch's NCCL backend records
    them): the send/recv evidence that makes unlabelled ranks a pipeline. ``kernels`` > 1 runs each pass as
    that many back-to-back kernels, each launched by its own call (and, with ``context``, operator), as a
    real stage's layers do."""
    folder.mkdir(parents=True, exist_ok=True)
    p = sim.schedule.stages
    per_stage: dict[int, list[dict]] = {s: [] for s in range(p)}
    for i, act in enumerate(a for stage in sim.actions for a in stage):
        s, a = act.stage, act.action
        start, end = act.start_ns + offset_ns, act.end_ns + offset_ns
        corr = 10 * i * kernels + 1
        vstage = a.chunk * p + s
        label = f"PP:{vstage}{a.phase}{a.microbatch}"
        events = per_stage[s]
        if labels:
            events.append(_x("user_annotation", label, 100, 100, start - LAUNCH_NS, end))
        events.append(_x("cuda_runtime", "cudaLaunchKernel", 100, 100, start - LAUNCH_NS, 500, corr=corr))
        if context:  # the operator that launched the kernel, as autograd names it
            op = "aten::linear" if a.phase == "F" else "autograd::engine::evaluate_function: AddmmBackward0"
            events.append(_x("cpu_op", op, 100, 100, start - LAUNCH_NS - 100, 800))
        spin = min(spin_before_every_pass, start - offset_ns)
        if spin > 0:
            events.append(
                _x("kernel", "ncclDevKernel_SendRecv(ncclDevComm*)", 0, 20, start - spin, spin, corr=corr + 2)
            )
        cuts = [start + (end - start) * k // kernels for k in range(kernels + 1)]
        events.append(_x("kernel", f"gemm_{a.phase}", 0, 7, start, cuts[1] - start, corr=corr))
        for k in range(1, kernels):  # the pass's other kernels, each after the one before
            at, more = cuts[k], corr + 10 * k
            events.append(_x("cuda_runtime", "cudaLaunchKernel", 100, 100, at - LAUNCH_NS, 500, corr=more))
            if context:
                events.append(_x("cpu_op", op, 100, 100, at - LAUNCH_NS - 100, 800))
            events.append(_x("kernel", f"gemm_{a.phase}", 0, 7, at, cuts[k + 1] - at, corr=more))
        peer = s + 1 if a.phase == "F" else s - 1 if a.phase == "B" else None
        if p2p and peer is not None and 0 <= peer < p:
            events.append(_x("user_annotation", "nccl:send", 100, 100, end, 100))
            per_stage[peer].append(_x("user_annotation", "nccl:recv", 100, 100, end, 100))
        if spin_before_forward and a.phase == "F" and s > 0:
            spin = min(spin_before_forward, start - offset_ns)
            events.append(
                _x("kernel", "ncclDevKernel_SendRecv(ncclDevComm*)", 0, 20, start - spin, spin, corr=corr + 1)
            )
    for s, events in per_stage.items():
        rank = rank_of(s) if rank_of else s
        info = {"rank": rank, "world_size": world or p, "backend": "nccl"}
        if groups is not None:
            info["pg_config"] = groups
        doc = {"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}
        (folder / f"rank{rank}.json").write_text(json.dumps(doc))
    return folder


def _x(cat: str, name: str, pid: int, tid: int, start_ns: int, dur_ns: int, corr: int | None = None) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start_ns / 1000, "dur": dur_ns / 1000}
    if corr is not None:
        event["args"] = {"correlation": corr}
    return event
