"""The critical path of each step across ranks (analysis/critical): hand-built timelines whose path is known
(stream order, launch, event waits, a collective's last arrival, send → recv, a step whose GPU work outlasts
its host range, a thread waiting for another), on 2 and 4 ranks, and the real 2-rank Kineto job, ResNet on a
V100 and the Nsight torchrun export: every path's length is its step's, and so is the sum of its segments and
of its ranks' shares. Jobs of several ranks are written as Kineto files and analysed through ``run``, as a
user's command does; one rank's graph is also tested on its own."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from conftest import shared

from pipebubble import spans
from pipebubble.analysis.comm.collectives import match
from pipebubble.analysis.critical import CriticalPath, critical_part, critical_paths, median_path
from pipebubble.analysis.critical import part as critical
from pipebubble.analysis.findings.common import job_step
from pipebubble.analysis.registry import comm_of
from pipebubble.options import Options, Scale
from pipebubble.run import run

US = 1_000  # the timelines are written in µs
#: Kineto's category of each kind of span (a synchronize is a runtime call Kineto names so).
CATEGORY = {"cpu_op": "cpu_op", "runtime": "cuda_runtime", "sync": "cuda_runtime", "annotation": "user_annotation",
            "step": "user_annotation", "kernel": "kernel", "comm": "kernel", "memcpy": "gpu_memcpy"}


class Rank:
    """One rank's spans, written as a timeline: a main thread, one GPU, launches joined by correlation."""

    def __init__(self, rank: int) -> None:
        self.rank, self.rows, self.corr = rank, [], rank * 1000

    def cpu(self, kind: str, name: str, start: int, end: int, corr: int | None = None, tid: int = 1) -> Rank:
        self.rows.append({"kind": kind, "name": name, "start": start * US, "end": end * US, "correlation": corr,
                          "tid": tid, "lane": f"rank{self.rank}/cpu/{tid}"})
        return self

    def gpu(self, kind: str, name: str, start: int, end: int, launch: int | None, stream: int = 7,
            tid: int = 1) -> Rank:
        """An operation on ``stream`` launched at ``launch`` on thread ``tid`` (a 3 µs runtime call; None: no
        launch traced)."""
        self.corr += 1
        if launch is not None:
            self.cpu("runtime", "cudaLaunchKernel", launch, launch + 3, self.corr, tid)
        self.rows.append({"kind": kind, "name": name, "start": start * US, "end": end * US, "correlation": self.corr,
                          "device": self.rank, "stream": stream, "lane": f"rank{self.rank}/gpu{self.rank}"})
        return self

    def step(self, start: int, end: int, n: int = 1) -> Rank:
        return self.cpu("step", f"ProfilerStep#{n}", start, end)

    def table(self) -> pl.DataFrame:
        frame = pl.DataFrame(self.rows).with_columns(source=pl.lit(f"rank{self.rank}.json"), rank=pl.lit(self.rank),
                                                     pid=pl.lit(self.rank + 100))
        return spans.conform(frame)

    def write(self, folder: Path, world: int) -> Path:
        """The timeline as the rank's Kineto file (µs floats, GPU events on pid = device, tid = stream)."""
        events = []
        for r in self.rows:
            on_gpu = r.get("device") is not None
            args = {"correlation": r["correlation"]} if r["correlation"] is not None else {}
            if on_gpu:
                args |= {"device": r["device"], "stream": r["stream"]}
            events.append({"ph": "X", "cat": CATEGORY[r["kind"]], "name": r["name"], "ts": r["start"] / US,
                           "dur": (r["end"] - r["start"]) / US, "pid": r["device"] if on_gpu else 100 + self.rank,
                           "tid": r["stream"] if on_gpu else r["tid"], **({"args": args} if args else {})})
        info = {"rank": self.rank, "world_size": world, "backend": "nccl"}
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}.json"
        path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}))
        return path


def analysed(folder: Path, ranks: list[Rank]) -> list[CriticalPath]:
    """The job's critical paths as ``pipebubble analyze`` computes them, its ranks written to ``folder``."""
    for r in ranks:
        r.write(folder, len(ranks))
    return run([folder], Options(), Scale(use_cache=False)).critical_path


def paths(ranks: list[pl.DataFrame]) -> list[CriticalPath]:
    """One file's tables mapped and walked (no collectives nor send/recv: a job of one participant)."""
    return critical_paths([critical_part(t) for t in ranks], None, None)


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


def all_reduce_rank(rank: int, compute_end: int, step_end: int) -> Rank:
    """Compute until ``compute_end``, an all_reduce ending at 700 (queued behind it), a synchronize that
    returns at 710, host work until the step ends."""
    r = Rank(rank).step(0, step_end).gpu("kernel", "gemm", 20, compute_end, launch=10)
    r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", compute_end, 700, launch=20)
    return r.cpu("sync", "cudaDeviceSynchronize", 30, 710)


def test_two_ranks_path_jumps_to_the_last_arrival(tmp_path: Path) -> None:
    """Rank 0 ends the step; its all_reduce waited for rank 1 (which computed until 500): the path is rank
    0's host and its collective from rank 1's arrival, then rank 1's compute and launch."""
    (path,) = analysed(tmp_path, [all_reduce_rank(0, 300, 1000), all_reduce_rank(1, 500, 990)])
    tiles(path)
    assert (path.step, path.length_ns) == (1, 1000 * US)
    assert shares(path) == {0: {"comm": 200, "host": 290, "waiting": 10}, 1: {"compute": 480, "host": 20}}
    kinds = [(s.rank, s.kind) for s in path.segments]
    assert kinds == [(1, "host"), (1, "compute"), (0, "comm"), (0, "waiting"), (0, "host")]


def test_last_arrival_ending_the_step_keeps_the_path_on_its_rank(tmp_path: Path) -> None:
    (path,) = analysed(tmp_path, [all_reduce_rank(0, 300, 990), all_reduce_rank(1, 500, 1000)])
    tiles(path)
    assert shares(path) == {1: {"compute": 480, "comm": 200, "host": 310, "waiting": 10}}


def test_four_ranks_follow_each_collectives_last_arrival(tmp_path: Path) -> None:
    """Two all_reduces on 4 ranks: rank 2 is last to the first, rank 3 to the second; the path runs
    rank 2's first compute, the first collective from rank 2's arrival on (on rank 3, which the second
    collective's chain leads back to), rank 3's second compute, the second collective on the rank that
    ended the step (rank 0), its host."""
    first = {0: 200, 1: 250, 2: 400, 3: 300}
    second = {0: 600, 1: 650, 2: 620, 3: 800}
    ranks = []
    for rank in range(4):
        r = Rank(rank).step(0, 1000 if rank == 0 else 980).gpu("kernel", "gemm", 20, first[rank], launch=10)
        r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", first[rank], 450, launch=12)
        r.gpu("kernel", "gemm", 450, second[rank], launch=14)
        r.gpu("comm", "ncclDevKernel_AllReduce_Sum_f32", second[rank], 900, launch=16)
        ranks.append(r.cpu("sync", "cudaDeviceSynchronize", 30, 905))
    (path,) = analysed(tmp_path, ranks)
    tiles(path)
    assert shares(path) == {0: {"comm": 100, "host": 95, "waiting": 5}, 2: {"compute": 380, "host": 20},
                            3: {"comm": 50, "compute": 350}}


def two_stages(send_at: int) -> list[Rank]:
    """A two-stage pipeline step: stage 0 (rank 0) computes until ``send_at`` and sends its activation
    (``nccl:send``, a ``SendRecv`` kernel queued behind its compute, 50 µs); stage 1 (rank 1) posted its
    receive at 100, long before, computes for 450 µs after it, and synchronizes. Both launch everything early
    and wait in a synchronize: the GPUs, not the hosts, bind."""
    end = send_at + 50
    r0 = Rank(0).step(0, send_at + 590).gpu("kernel", "fwd", 20, send_at, launch=10)
    r0.cpu("annotation", "nccl:send", 28, 40).gpu("comm", "ncclDevKernel_SendRecv", send_at, end, launch=30)
    r0.cpu("sync", "cudaDeviceSynchronize", 45, end + 5)
    r1 = Rank(1).step(0, send_at + 600).cpu("annotation", "nccl:recv", 28, 40)
    r1.gpu("comm", "ncclDevKernel_SendRecv", 100, end, launch=30).gpu("kernel", "fwd", end, end + 450, launch=35)
    return [r0, r1.cpu("sync", "cudaDeviceSynchronize", 40, end + 455)]


def test_recv_waits_for_its_send(tmp_path: Path) -> None:
    """Two stages through ``run``: rank 1's receive was posted at 100, its send began at 400 on rank 0: the
    path runs rank 0's compute and launch, then rank 1's transfer, compute and host. Without the send/recv
    pairs the path would stay on rank 1 and count its receive's spin as communication."""
    (path,) = analysed(tmp_path, two_stages(400))
    tiles(path)
    assert shares(path) == {0: {"compute": 380, "host": 20}, 1: {"comm": 50, "compute": 450, "host": 95,
                                                                 "waiting": 5}}
    assert [(s.rank, s.kind) for s in path.segments][:3] == [(0, "host"), (0, "compute"), (1, "comm")]


def test_a_slower_sender_lengthens_the_path_by_its_compute(tmp_path: Path) -> None:
    """The sender computing 200 µs longer lengthens the step by as much, all of it the sender's compute on
    the path; the receiver's share is unchanged."""
    (fast,) = analysed(tmp_path / "fast", two_stages(400))
    (slow,) = analysed(tmp_path / "slow", two_stages(600))
    assert slow.length_ns - fast.length_ns == 200 * US
    assert shares(slow)[0] == shares(fast)[0] | {"compute": shares(fast)[0]["compute"] + 200}
    assert shares(slow)[1] == shares(fast)[1]


def test_gpu_work_past_the_host_range_lengthens_the_step(tmp_path: Path) -> None:
    """A GPU-bound rank whose host step range ends at 1000 while the kernels it launched inside run to 1150
    (15 % longer): the step, and its path, last 1150 µs; the walk starts on the GPU, not on the host
    thread: the path is the kernels' compute and the first launch. The breakdown's step is the same."""
    r = Rank(0).step(0, 1000)
    for k in range(5):
        r.gpu("kernel", f"gemm{k}", 20 + 226 * k, 20 + 226 * (k + 1), launch=10 + 20 * k)
    r.rows[-1]["end"] = 1150 * US
    report = run([r.write(tmp_path, 1)], Options(), Scale(use_cache=False))
    (path,) = report.critical_path
    tiles(path)
    assert (path.step, path.start_ns, path.length_ns) == (1, 0, 1150 * US)
    assert shares(path) == {0: {"compute": 1130, "host": 20}}
    assert path.segments[-1].kind == "compute" and "gpu" in path.segments[-1].lane
    (row,) = [b for b in report.breakdown if b.step == 1]
    assert row.window_ns == path.length_ns
    (strip,) = report.strips.rows  # the timeline draws the same step
    assert (report.strips.step, strip.start_ns, strip.end_ns) == (1, 0, 1150 * US)
    assert job_step(report).ns == 1150 * US  # the step every finding's share is of


def test_the_path_follows_the_thread_the_main_thread_waits_for(tmp_path: Path) -> None:
    """A host-bound step as a DDP backward runs: the main thread launches the forward (0-300), then sits in
    ``backward()`` with nothing traced while the autograd engine's thread launches the backward (320-800),
    then launches the optimizer (850-950). The path runs on the main thread, then the autograd thread, then
    the main thread again; the waits between them are the hand-offs."""
    r = Rank(0).step(0, 1000)
    for k in range(10):  # forward: an operator a kernel, 30 µs each, on the main thread
        r.cpu("cpu_op", "aten::conv2d", 30 * k, 30 * k + 28).gpu("kernel", "fwd", 30 * k + 5, 30 * k + 10,
                                                                  launch=30 * k + 2)
    for k in range(16):  # backward: the autograd thread (tid 2)
        at = 320 + 30 * k
        r.cpu("cpu_op", "autograd::engine::evaluate_function: ConvolutionBackward0", at, at + 28, tid=2)
        r.gpu("kernel", "bwd", at + 5, at + 10, launch=at + 2, tid=2)
    for k in range(4):  # the optimizer, back on the main thread
        at = 850 + 25 * k
        r.cpu("cpu_op", "aten::_foreach_add_", at, at + 23).gpu("kernel", "opt", at + 5, at + 10, launch=at + 2)
    (path,) = analysed(tmp_path, [r])
    tiles(path)
    threads = [s.lane.rsplit("/", 1)[-1] for s in path.segments if s.kind == "host"]
    assert threads == ["tid1", "tid2", "tid1"]
    waits = [(s.lane.rsplit("/", 1)[-1], s.start_ns // US, s.end_ns // US) for s in path.segments
             if s.kind == "waiting"]
    assert waits == [("tid2", 298, 320), ("tid1", 798, 850)]
    assert shares(path) == {0: {"host": 926, "waiting": 74}}


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


def test_host_calls_that_wait_for_the_gpu_by_class_or_by_their_times() -> None:
    """The idle account's rule for a blocking call: the allocator (``cudaFree``) waits for the GPU whatever
    its times, and any other call that began 114 µs before the GPU's work ended and returned 1 µs after it
    waited for it too: the path goes from the host to the GPU at both."""
    r = Rank(0).step(0, 600).gpu("kernel", "k", 10, 300, launch=5).cpu("runtime", "cudaFree", 20, 302)
    r.gpu("kernel", "k2", 310, 420, launch=305).cpu("runtime", "cudaLaunchKernel", 306, 421)
    (path,) = paths([r.table()])
    tiles(path)
    assert shares(path) == {0: {"compute": 400, "host": 197, "waiting": 3}}
    assert [s.kind for s in path.segments] == ["host", "compute", "waiting", "host", "compute", "waiting", "host"]


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
    (path,) = critical_paths([critical_part(table)], None, None)
    tiles(path)


def test_degenerate_tables() -> None:
    """An empty table and one span give empty parts (a kernel alone: one run, a path of its length)."""
    assert critical_paths([critical_part(spans.empty())], None, None) == [] and critical_paths([], None, None) == []
    cpu_only = Rank(0).cpu("cpu_op", "x", 0, 10).table()
    assert critical_part(cpu_only).nodes.is_empty() and critical_paths([critical_part(cpu_only)], None, None) == []
    (path,) = critical_paths([critical_part(Rank(0).gpu("kernel", "k", 100, 250, launch=None).table())], None, None)
    assert (path.length_ns, shares(path)) == (150 * US, {0: {"compute": 150}})
    assert median_path([]) is None and median_path([path]) is path


def test_shifted_moves_every_time() -> None:
    part = critical_part(all_reduce_rank(0, 300, 1000).table())
    moved = part.shifted(5)
    for name, cols in critical.TIMES.items():
        for c in cols:
            assert (getattr(moved, name)[c] + 5).equals(getattr(part, name)[c])


def test_real_two_rank_kineto_job() -> None:
    """recsys ranks 0 and 1: two steps, each path as long as the step across both ranks."""
    files = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    found = run(files, Options(), Scale(use_cache=False)).critical_path
    assert [p.step for p in found] == [551, 552]
    from pipebubble.ingest import read_file

    steps = pl.concat([read_file(f, use_cache=False).spans.filter(pl.col("kind") == "step") for f in files])
    for path in found:
        mine = steps.filter(pl.col("name") == f"ProfilerStep#{path.step}")
        assert path.length_ns == mine["end"].max() - mine["start"].min()
        assert sum(s.compute_ns + s.memory_ns + s.comm_ns + s.host_ns + s.waiting_ns for s in path.by_rank) == (
            path.length_ns)
    assert median_path(found).step == 551
    tiles(median_path(found))


def test_real_gpu_bound_resnet_runs_through_the_gpu() -> None:
    """ResNet on a V100, 98 % GPU compute: its host runs a step ahead of the GPU, each step ends on the GPU,
    and the median step's path is at least 80 % compute (a path cut at the host's range end was all host)."""
    report = run([shared("kineto", "resnet_v100_ns_resolution.json.gz")], Options(), Scale(use_cache=False))
    path = median_path(report.critical_path)
    tiles(path)
    (share,) = path.by_rank
    assert share.compute_ns >= 0.8 * path.length_ns
    steps = {b.step: b.window_ns for b in report.breakdown if b.step is not None}
    assert {p.step: p.length_ns for p in report.critical_path} == steps


def test_real_ddp_backward_runs_on_the_autograd_thread() -> None:
    """ResNet DDP on an A100, host-bound: the main thread waits in ``backward()`` while the autograd thread
    launches the backward: the median step's path crosses to that thread and back."""
    report = run([shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")], Options(), Scale(use_cache=False))
    path = median_path(report.critical_path)
    tiles(path)
    host = {}
    for s in path.segments:
        if s.kind == "host":
            host[s.lane] = host.get(s.lane, 0) + s.end_ns - s.start_ns
    assert len(host) == 2 and min(host.values()) > 0.3 * path.length_ns


def test_real_nsys_torchrun() -> None:
    """Two rankless processes without steps: one path over the whole window that crosses between them at
    their collectives."""
    (path,) = run([shared("nsys", "torchrun_2xh100_nccl.sqlite")], Options(), Scale(use_cache=False)).critical_path
    tiles(path)
    assert {s.pid for s in path.by_rank} == {144, 145}
    assert sum(s.comm_ns for s in path.by_rank) > 0 and sum(s.compute_ns for s in path.by_rank) > 0


def test_a_batch_split_by_rank_gives_the_same_paths() -> None:
    """map_together maps ranks' tables at once and splits the parts by participant: the same paths."""
    tables = [all_reduce_rank(0, 300, 1000).table(), all_reduce_rank(1, 500, 990).table()]
    batch = critical_part(pl.concat(tables)).by_participant()
    comms = [comm_of(t) for t in tables]
    matched, _ = match(pl.concat([c.calls for c in comms]))
    alone = [critical_part(t) for t in tables]
    assert critical_paths([batch[0], batch[1]], matched, None) == critical_paths(alone, matched, None)
    for r in (0, 1):
        for name in critical.CriticalPart.FRAMES:
            assert getattr(batch[r], name).drop("node", "release", strict=False).equals(
                getattr(alone[r], name).drop("node", "release", strict=False))


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
