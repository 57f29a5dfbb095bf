"""The critical path of each step across ranks (analysis/critical): hand-built timelines whose path is known
(stream order, launch, event waits, a collective's last arrival, send → recv), on 2 and 4 ranks, and the real
2-rank Kineto job and Nsight torchrun export: every path's length is its step's, and so is the sum of its
segments and of its ranks' shares."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pipebubble import spans
from pipebubble.analysis.comm import p2p
from pipebubble.analysis.comm.collectives import match
from pipebubble.analysis.critical import CriticalPath, critical_part, critical_paths, median_path
from pipebubble.analysis.critical import part as critical
from pipebubble.analysis.registry import comm_of

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
US = 1_000  # the timelines are written in µs


class Rank:
    """One rank's spans, written as a timeline: a main thread, one GPU, launches joined by correlation."""

    def __init__(self, rank: int) -> None:
        self.rank, self.rows, self.corr = rank, [], rank * 1000

    def cpu(self, kind: str, name: str, start: int, end: int, corr: int | None = None) -> Rank:
        self.rows.append({"kind": kind, "name": name, "start": start * US, "end": end * US, "correlation": corr,
                          "tid": 1, "lane": f"rank{self.rank}/cpu/1"})
        return self

    def gpu(self, kind: str, name: str, start: int, end: int, launch: int | None, stream: int = 7) -> Rank:
        """An operation on ``stream`` launched at ``launch`` (a 3 µs runtime call; None: no launch traced)."""
        self.corr += 1
        if launch is not None:
            self.cpu("runtime", "cudaLaunchKernel", launch, launch + 3, self.corr)
        self.rows.append({"kind": kind, "name": name, "start": start * US, "end": end * US, "correlation": self.corr,
                          "device": self.rank, "stream": stream, "lane": f"rank{self.rank}/gpu{self.rank}"})
        return self

    def step(self, start: int, end: int, n: int = 1) -> Rank:
        return self.cpu("step", f"ProfilerStep#{n}", start, end)

    def table(self) -> pl.DataFrame:
        frame = pl.DataFrame(self.rows).with_columns(source=pl.lit(f"rank{self.rank}.json"), rank=pl.lit(self.rank),
                                                     pid=pl.lit(self.rank + 100))
        return spans.conform(frame)


def paths(ranks: list[pl.DataFrame], stages: dict[int, int] | None = None) -> list[CriticalPath]:
    """Map each rank's table, match its collectives and send/recv pairs as the reduce does, walk the paths."""
    comms = [comm_of(t) for t in ranks]
    matched, _ = match(pl.concat([c.calls for c in comms]))
    ops = pl.concat([c.p2p for c in comms])
    pairs = p2p.pair(ops, stages) if ops.height else None
    return critical_paths([critical_part(t) for t in ranks], matched, pairs)


def shares(path: CriticalPath) -> dict[int, dict[str, int]]:
    """Each rank's ns by kind (in µs), without the kinds it spent nothing in."""
    kinds = ("compute", "memory", "comm", "host", "waiting")
    return {s.rank: {k: getattr(s, f"{k}_ns") // US for k in kinds if getattr(s, f"{k}_ns")} for s in path.by_rank}


def tiles(path: CriticalPath) -> None:
    """The path's length is its step's, and its segments and shares add up to it without gaps."""
    total = sum(s.compute_ns + s.memory_ns + s.comm_ns + s.host_ns + s.waiting_ns for s in path.by_rank)
    assert total == path.length_ns
    if path.segments_total == len(path.segments):
        assert sum(s.end_ns - s.start_ns for s in path.segments) == path.length_ns
        assert all(a.end_ns == b.start_ns for a, b in zip(path.segments, path.segments[1:], strict=False))
        assert path.segments[0].start_ns == path.start_ns


def all_reduce_rank(rank: int, compute_end: int, step_end: int) -> pl.DataFrame:
    """Compute until ``compute_end``, an all_reduce ending at 700 (queued behind it), a synchronize that
    returns at 710, host work until the step ends."""
    r = Rank(rank).step(0, step_end).gpu("kernel", "gemm", 20, compute_end, launch=10)
    r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", compute_end, 700, launch=20)
    return r.cpu("sync", "cudaDeviceSynchronize", 30, 710).table()


def test_two_ranks_path_jumps_to_the_last_arrival() -> None:
    """Rank 0 ends the step; its all_reduce waited for rank 1 (which computed until 500): the path is rank
    0's host and its collective from rank 1's arrival, then rank 1's compute and launch."""
    (path,) = paths([all_reduce_rank(0, 300, 1000), all_reduce_rank(1, 500, 990)])
    tiles(path)
    assert (path.step, path.start_ns, path.length_ns) == (1, 0, 1000 * US)
    assert shares(path) == {0: {"comm": 200, "host": 290, "waiting": 10}, 1: {"compute": 480, "host": 20}}
    kinds = [(s.rank, s.kind) for s in path.segments]
    assert kinds == [(1, "host"), (1, "compute"), (0, "comm"), (0, "waiting"), (0, "host")]


def test_last_arrival_ending_the_step_keeps_the_path_on_its_rank() -> None:
    (path,) = paths([all_reduce_rank(0, 300, 990), all_reduce_rank(1, 500, 1000)])
    tiles(path)
    assert shares(path) == {1: {"compute": 480, "comm": 200, "host": 310, "waiting": 10}}


def test_four_ranks_follow_each_collectives_last_arrival() -> None:
    """Two all_reduces on 4 ranks: rank 2 is last to the first, rank 3 to the second; the path runs
    rank 2's first compute, the first collective from rank 2's arrival on (on rank 3, which the second
    collective's chain leads back to), rank 3's second compute, the second collective on the rank that
    ended the step (rank 0), its host."""
    first = {0: 200, 1: 250, 2: 400, 3: 300}
    second = {0: 600, 1: 650, 2: 620, 3: 800}
    tables = []
    for rank in range(4):
        r = Rank(rank).step(0, 1000 if rank == 0 else 980).gpu("kernel", "gemm", 20, first[rank], launch=10)
        r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", first[rank], 450, launch=12)
        r.gpu("kernel", "gemm", 450, second[rank], launch=14)
        r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", second[rank], 900, launch=16)
        tables.append(r.cpu("sync", "cudaDeviceSynchronize", 30, 905).table())
    (path,) = paths(tables)
    tiles(path)
    assert shares(path) == {0: {"comm": 100, "host": 95, "waiting": 5}, 2: {"compute": 380, "host": 20},
                            3: {"comm": 50, "compute": 350}}


def test_recv_waits_for_its_send() -> None:
    """A 2-stage pipeline: rank 1's receive was posted at 100, its send began at 400 on rank 0: the path
    runs rank 0's compute and launch, then rank 1's transfer, compute and host."""
    r0 = Rank(0).step(0, 990).gpu("kernel", "fwd", 20, 400, launch=10)
    r0.cpu("annotation", "PP:0SEND_F0", 28, 40).gpu("comm", "ncclDevKernel_SendRecv", 400, 450, launch=30)
    r1 = Rank(1).step(0, 1000).cpu("annotation", "PP:1RECV_F0", 28, 40)
    r1.gpu("comm", "ncclDevKernel_SendRecv", 100, 450, launch=30).gpu("kernel", "fwd", 450, 900, launch=35)
    r1.cpu("sync", "cudaDeviceSynchronize", 40, 905)
    (path,) = paths([r0.table(), r1.table()], stages={0: 0, 1: 1})
    tiles(path)
    assert shares(path) == {0: {"compute": 380, "host": 20}, 1: {"comm": 50, "compute": 450, "host": 95,
                                                                 "waiting": 5}}


def test_launch_bound_and_event_waits() -> None:
    """One rank without steps: a kernel launched after its stream went idle is released by its launch (the
    thread, never blocked, is host back to the start: the kernel before is off the path); one queued early
    on a side stream but starting 40 µs after the main stream's kernel ended waited for it (an event)."""
    r = Rank(0).gpu("kernel", "a", 0, 100, launch=None).gpu("kernel", "b", 300, 400, launch=290)
    r.gpu("kernel", "c", 440, 500, launch=5, stream=9)
    (path,) = paths([r.table()])
    tiles(path)
    assert (path.step, path.length_ns) == (None, 500 * US)
    assert [(s.lane, s.kind, s.start_ns // US) for s in path.segments] == [
        ("rank0/cpu/1", "host", 0), ("rank0/gpu0/stream7", "compute", 300), ("rank0/gpu0/stream9", "waiting", 400),
        ("rank0/gpu0/stream9", "compute", 440)]


def test_blocking_copy_releases_the_host() -> None:
    """A copy call that returned after its copy ended waited for it: the host's path goes to the copy, and
    through stream order to the kernel before it."""
    r = Rank(0).step(0, 400).gpu("kernel", "k", 10, 200, launch=5).gpu("memcpy", "Memcpy DtoH", 200, 250, launch=8)
    r.rows[-2]["end"] = 252 * US  # the cudaMemcpyAsync call returned at 252
    (path,) = paths([r.table()])
    tiles(path)
    assert shares(path) == {0: {"compute": 190, "memory": 50, "host": 158, "waiting": 2}}


def test_runs_are_bounded_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Many launch-bound kernels: over the cap, the shortest gaps merge into runs that keep them as host."""
    r = Rank(0).step(0, 10_000)
    for k in range(200):
        r.gpu("kernel", "tiny", 10 + 40 * k, 20 + 40 * k + k % 3, launch=5 + 40 * k)
    table = r.table()
    assert critical_part(table).nodes.height == 200
    monkeypatch.setattr(critical, "RUNS_PER_STEP", 10)
    nodes = critical_part(table).nodes
    assert nodes.height <= 10
    busy = sum(10 + k % 3 for k in range(200)) * US
    assert int((nodes["end"] - nodes["start"]).sum()) == int(nodes["host_ns"].sum()) + busy
    (path,) = critical_paths([critical_part(table)])
    tiles(path)


def test_degenerate_tables() -> None:
    """An empty table and one span give empty parts (a kernel alone: one run, a path of its length)."""
    assert critical_paths([critical_part(spans.empty())]) == [] and critical_paths([]) == []
    cpu_only = Rank(0).cpu("cpu_op", "x", 0, 10).table()
    assert critical_part(cpu_only).nodes.is_empty() and critical_paths([critical_part(cpu_only)]) == []
    (path,) = critical_paths([critical_part(Rank(0).gpu("kernel", "k", 100, 250, launch=None).table())])
    assert (path.length_ns, shares(path)) == (150 * US, {0: {"compute": 150}})
    assert median_path([]) is None and median_path([path]) is path


def test_shifted_moves_every_time() -> None:
    part = critical_part(all_reduce_rank(0, 300, 1000))
    moved = part.shifted(5)
    for name, cols in critical.TIMES.items():
        for c in cols:
            assert (getattr(moved, name)[c] + 5).equals(getattr(part, name)[c])


def real(paths_: list[Path]) -> list[CriticalPath]:
    from pipebubble.ingest import read_file

    tables = [read_file(p, position=k, use_cache=False).spans for k, p in enumerate(paths_)]
    return paths(tables)


def test_real_two_rank_kineto_job() -> None:
    """recsys ranks 0 and 1: two steps, each path as long as the step across both ranks."""
    files = [TRACES / "kineto" / f"recsys_128rank_sampled_rank-{r}.json.gz" for r in (0, 1)]
    found = real(files)
    assert [p.step for p in found] == [551, 552]
    from pipebubble.ingest import read_file

    steps = pl.concat([read_file(f, use_cache=False).spans.filter(pl.col("kind") == "step") for f in files])
    for path in found:
        mine = steps.filter(pl.col("name") == f"ProfilerStep#{path.step}")
        assert path.length_ns == mine["end"].max() - mine["start"].min()
        tiles(path)
    assert median_path(found).step == 551


def test_real_nsys_torchrun() -> None:
    """Two rankless processes without steps: one path over the whole window that crosses between them at
    their collectives."""
    (path,) = real([TRACES / "nsys" / "torchrun_2xh100_nccl.sqlite"])
    tiles(path)
    assert {s.pid for s in path.by_rank} == {144, 145}
    assert sum(s.comm_ns for s in path.by_rank) > 0 and sum(s.compute_ns for s in path.by_rank) > 0


def test_a_batch_split_by_rank_gives_the_same_paths() -> None:
    """map_together maps ranks' tables at once and splits the parts by participant: the same paths."""
    tables = [all_reduce_rank(0, 300, 1000), all_reduce_rank(1, 500, 990)]
    batch = critical_part(pl.concat(tables))
    frames = critical.CriticalPart.FRAMES
    split = [critical.CriticalPart(*(getattr(batch, f).filter(pl.col("who") == r) for f in frames)) for r in (0, 1)]
    comms = [comm_of(t) for t in tables]
    matched, _ = match(pl.concat([c.calls for c in comms]))
    assert critical_paths(split, matched) == paths(tables)


def test_a_batch_bounds_each_files_runs_as_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run bound is a file's own: two files of 8 runs each, under a bound of 10 a step, keep all 16 in a
    batch (the bound over the batch's one step would merge them), and one over it is merged as alone."""
    monkeypatch.setattr(critical, "RUNS_PER_STEP", 10)

    def launch_bound(rank: int, kernels: int) -> pl.DataFrame:
        r = Rank(rank)
        for k in range(kernels):
            r.gpu("kernel", "tiny", 10 + 40 * k, 20 + 40 * k + k % 3, launch=5 + 40 * k)
        return r.table()

    tables = [launch_bound(0, 8), launch_bound(1, 8), launch_bound(2, 30)]
    batch = critical_part(pl.concat(tables))
    alone = [critical_part(t) for t in tables]
    assert [p.nodes.height for p in alone] == [8, 8, 10]
    for rank, part in enumerate(alone):
        mine = batch.nodes.filter(pl.col("who") == rank)
        assert mine.drop("node").equals(part.nodes.drop("node"))
