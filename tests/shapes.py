"""Multi-rank job shapes that are not pipelines (or are only one rank of one), written as Kineto files.

Every GPU kernel is launched by a ``cudaLaunchKernel`` on the rank's main thread (correlation ids link
them), a collective's launch sits inside the ranges torch records for it (``c10d::allreduce_`` around
``nccl:all_reduce``), and each step is a ``ProfilerStep#k`` range: the shapes real DDP, FSDP and
expert-parallel traces have. Times are given in ns and written in µs, as Kineto writes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MS = 1_000_000
THREAD = 100


@dataclass
class Rank:
    """One rank's events, built call by call."""

    rank: int
    world: int
    events: list[dict] = field(default_factory=list)
    info: dict = field(default_factory=dict)
    corr: int = 0

    def x(self, cat: str, name: str, start: int, dur: int, pid: int = THREAD, tid: int = THREAD, **args) -> None:
        event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start / 1000, "dur": dur / 1000}
        if args:
            event["args"] = args
        self.events.append(event)

    def kernel(self, name: str, start: int, dur: int, stream: int = 7, ranges: tuple[tuple[str, str], ...] = ()):
        """A kernel launched 2 µs before it starts, its launch inside ``ranges`` ((cat, name), outermost first)."""
        self.corr += 1
        launch = start - 2_000
        for depth, (cat, rname) in enumerate(ranges):
            self.x(cat, rname, launch - 500 + 100 * depth, 1_000 - 200 * depth)
        self.x("cuda_runtime", "cudaLaunchKernel", launch, 300, correlation=self.corr)
        self.x("kernel", name, start, dur, pid=0, tid=stream, correlation=self.corr, device=0, stream=stream)

    def step(self, k: int, start: int, dur: int) -> None:
        self.x("user_annotation", f"ProfilerStep#{k}", start, dur)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        info = {"rank": self.rank, "world_size": self.world, "backend": "nccl", **self.info}
        path = folder / f"rank{self.rank}.json"
        path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": info, "traceEvents": self.events}))
        return path


ALL_REDUCE = (("cpu_op", "c10d::allreduce_"), ("user_annotation", "nccl:all_reduce"))
ALL_REDUCE_KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
ALL_TO_ALL = (("cpu_op", "c10d::alltoall_base_"), ("user_annotation", "nccl:all_to_all"))
SEND_RECV_KERNEL = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"


def data_parallel(folder: Path, compute_ms: list[float], steps: int = 2, transfer_ms: float = 1.0) -> Path:
    """Ranks that compute for ``compute_ms[r]`` then all-reduce, ``steps`` times, 10 ms apart. The all-reduce
    kernel of every rank starts when its compute ends and ends ``transfer_ms`` after the slowest rank's
    began: rank r spins max(compute) − compute[r] waiting for it."""
    world = len(compute_ms)
    slowest = max(compute_ms)
    for r, c in enumerate(compute_ms):
        rank = Rank(r, world)
        for k in range(steps):
            base = MS + 10 * MS * k
            rank.step(k, base - 50_000, 9 * MS)
            rank.kernel("sm90_xmma_gemm_f32", base, int(c * MS))
            rank.kernel(ALL_REDUCE_KERNEL, base + int(c * MS), int((slowest - c + transfer_ms) * MS), 20, ALL_REDUCE)
        rank.write(folder)
    return folder


def all_to_all(folder: Path, world: int = 2, steps: int = 3, late_rank: int = 1, late_ms: float = 2.0) -> Path:
    """Expert parallel: every rank computes 1 ms, then exchanges tokens with ``all_to_all``, which NCCL runs
    as ``SendRecv`` kernels; ``late_rank`` computes ``late_ms`` longer."""
    for r in range(world):
        rank = Rank(r, world)
        c = 1.0 + (late_ms if r == late_rank else 0.0)
        for k in range(steps):
            base = MS + 10 * MS * k
            rank.step(k, base - 50_000, 9 * MS)
            rank.kernel("moe_expert_gemm", base, int(c * MS))
            rank.kernel(SEND_RECV_KERNEL, base + int(c * MS), int((1 + late_ms + 0.5 - c) * MS), 20, ALL_TO_ALL)
        rank.write(folder)
    return folder


def one_rank(folder: Path, rank: int = 5, world: int = 64, labels: str | None = None, groups: list | None = None,
             microbatches: int = 4) -> Path:
    """One rank's file of a ``world``-rank job: forward passes of ``microbatches`` micro-batches then their
    backward passes, each 1 ms (backward 2 ms) with 0.5 ms gaps, under ``labels`` ranges (a format string
    of phase letter and micro-batch, e.g. ``"PP:1{phase}{mb}"``; None: unlabelled)."""
    r = Rank(rank, world, info={"pg_config": groups} if groups is not None else {})
    at = MS
    r.step(0, at - 50_000, 20 * MS)
    for phase, dur in (("F", MS), ("B", 2 * MS)):
        for mb in range(microbatches):
            if labels is not None:
                r.x("user_annotation", labels.format(phase=phase, mb=mb), at - 5_000, dur + 5_000)
            r.kernel(f"gemm_{phase}", at, dur)
            at += dur + MS // 2
    return r.write(folder)
