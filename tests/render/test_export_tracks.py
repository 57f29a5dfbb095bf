"""The export's tracks as Perfetto reads them: a process track per rank (ProcessDescriptor: pid, name), a
thread track per CPU thread (ThreadDescriptor: pid, tid, name) under it, GPU streams and the report's tracks as
named children of the process, and what overlaps a lane's slices on a track under that lane's own. Perfetto's
trace processor makes its process and thread tables from these descriptors, one row each, a second descriptor
of one pid or tid counting as a reused id (a new process or thread); ``tables`` reads them back the same way,
and the project's own reader (``ingest/pftrace``) gives the names it found. The real traces' pids, tids and
slices per thread are counted from their raw events by plain Python."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import independent as ind
import polars as pl
import pytest
from conftest import shared
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
from test_export import T0, gpipe_report, lanes_report, span_table, with_extras

from pipebubble import spans as span_schema
from pipebubble.ingest import pftrace
from pipebubble.render import perfetto
from pipebubble.render.perfetto.ids import LIMIT, Ids

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "gpu_user_annotation"}  # on a device


@dataclass
class Tables:
    """What Perfetto's process and thread tables hold, and each slice's track and depth."""

    processes: dict[int, str]  # pid -> name
    threads: dict[tuple[int, int], str]  # (pid, tid) -> name
    reused: int  # descriptors of a pid or tid already described
    tracks: dict[int, object]  # uuid -> TrackDescriptor
    slices: list[tuple[int, str, int, int]]  # track, name, start, depth

    def thread_track(self, pid: int, tid: int) -> int:
        return next(u for u, t in self.tracks.items() if t.HasField("thread") and (t.thread.pid, t.thread.tid) ==
                    (pid, tid))

    def under(self, uuid: int) -> set[int]:
        """A track and every track below it."""
        found, more = {uuid}, True
        while more:
            below = {u for u, t in self.tracks.items() if t.parent_uuid in found} - found
            found, more = found | below, bool(below)
        return found


def tables(data: bytes) -> Tables:
    trace = Trace()
    trace.ParseFromString(data)
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    processes, threads, reused = {}, {}, 0
    for t in tracks.values():
        if t.HasField("thread"):
            key = (t.thread.pid, t.thread.tid)
            reused += key in threads
            threads[key] = t.thread.thread_name
        elif t.HasField("process"):
            reused += t.process.pid in processes
            processes[t.process.pid] = t.process.process_name
    names, stacks, slices = {}, defaultdict(list), []
    for p in trace.packet:
        names.update({e.iid: e.name for e in p.interned_data.event_names})
        e = p.track_event
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:  # depth as the trace processor gives it: the open slices below
            slices.append((e.track_uuid, names[e.name_iid], p.timestamp, len(stacks[e.track_uuid])))
            stacks[e.track_uuid].append(p.timestamp)
        elif e.type == TrackEvent.TYPE_SLICE_END:
            stacks[e.track_uuid].pop()
    return Tables(processes, threads, reused, tracks, slices)


def exported_bytes(table: pl.DataFrame | None = None, report=None) -> bytes:
    table = with_extras(span_table()) if table is None else table
    return perfetto.to_proto(perfetto.build(table, report or gpipe_report()))


def cpu_table(rows: list[tuple]) -> pl.DataFrame:
    """CPU spans (rank, pid, tid, name, start, end in ns from T0), each on its thread's lane."""
    return span_schema.conform(pl.DataFrame({
        "kind": ["cpu_op"] * len(rows), "rank": [r[0] for r in rows], "pid": [r[1] for r in rows],
        "tid": [r[2] for r in rows], "lane": [f"rank{r[0]}/pid{r[1]}/tid{r[2]}" for r in rows],
        "source": ["t.json"] * len(rows), "name": [r[3] for r in rows], "start": [T0 + r[4] for r in rows],
        "end": [T0 + r[5] for r in rows]}))


# --- hand-computed timelines ---


def test_a_process_per_rank_and_a_thread_per_cpu_thread():
    """Rank 0's thread (pid 100, tid 1) runs stage 0; rank 1 runs GPU work only, ranks 2 and 3 only the
    report's passes: those get pids of the export's own, counted up from above 100 in the order they appear."""
    got = tables(exported_bytes())
    assert got.processes == {100: "rank 0 · stage 0", 101: "rank 1 · stage 1", 102: "rank 2 · stage 2",
                             103: "rank 3 · stage 3"}
    assert got.threads == {(100, 1): "thread 1"} and got.reused == 0
    thread = got.tracks[got.thread_track(100, 1)]
    assert got.tracks[thread.parent_uuid].process.pid == 100 and thread.description == "rank0/cpu/1"
    for t in got.tracks.values():  # GPU streams, passes and waits: named children of their rank's process
        if t.name.startswith(("GPU", "passes", "bubbles")):
            assert not t.HasField("thread") and got.tracks[t.parent_uuid].HasField("process")


def test_nested_slices_keep_their_depth_on_the_one_thread_track():
    """step [0, 10) ⊃ forward [1, 4) ⊃ aten::mm [2, 3) ⊃ cudaLaunchKernel [2.2, 2.4) (ms)."""
    got = tables(exported_bytes())
    track = got.thread_track(100, 1)
    assert {(name, depth) for t, name, _, depth in got.slices if t == track} == {
        ("step", 0), ("forward", 1), ("aten::mm", 2), ("cudaLaunchKernel", 3)}


def test_an_overlap_goes_under_its_thread_never_on_a_second_thread_track():
    """A [0, 10) and B [2, 12) overlap without nesting: B and what nests in it (C [3, 4), D [11, 11.5)) go on a
    track under the thread's; E [20, 30) after both is on the thread's again, at depth 0."""
    rows = [(0, 7, 9, "A", 0, 10_000), (0, 7, 9, "B", 2_000, 12_000), (0, 7, 9, "C", 3_000, 4_000),
            (0, 7, 9, "D", 11_000, 11_500), (0, 7, 9, "E", 20_000, 30_000)]
    got = tables(exported_bytes(cpu_table(rows), lanes_report()))
    assert got.threads == {(7, 9): "thread 9"} and got.processes == {7: "rank 0"} and got.reused == 0
    thread = got.thread_track(7, 9)
    by = {name: (t, depth) for t, name, _, depth in got.slices}
    assert by["A"] == by["E"] == (thread, 0)
    spill = got.tracks[by["B"][0]]
    assert spill.parent_uuid == thread and spill.name == "overlapping · thread 9" and not spill.HasField("thread")
    assert by["C"] == (spill.uuid, 1) and by["D"] == (spill.uuid, 1) and by["B"][1] == 0
    siblings = Counter((t.parent_uuid, t.name) for t in got.tracks.values())
    assert max(siblings.values()) == 1  # no two tracks of one name side by side


def test_ids_perfetto_cannot_hold_or_that_repeat_get_the_exports_own():
    """Rank 0 names two processes (0 and 5) whose threads are both tid 0 (a merged trace whose pid is the
    pipeline rank): one process of its own pid, two threads of their own tids, named by the recorded ids.
    Rank 1 is pid 5 too: pid 5 is free (rank 0 took none), so it keeps it; its tid 2³¹ does not fit."""
    rows = [(0, 0, 0, "a", 0, 10), (0, 5, 0, "b", 0, 10), (1, 5, LIMIT, "c", 0, 10), (1, 5, 3, "d", 0, 10)]
    got = tables(exported_bytes(cpu_table(rows), lanes_report()))
    assert got.processes == {6: "rank 0", 5: "rank 1"} and got.reused == 0
    assert got.threads == {(6, 7): "pid 0 thread 0", (6, 8): "pid 5 thread 0", (5, 3): "thread 3",
                           (5, 9): f"thread {LIMIT}"}


def test_the_id_allocator():
    ids = Ids([-4, 0, 12, None, LIMIT + 3, 40])
    assert [ids.process({12}), ids.process({12}), ids.process({-4}), ids.process({12, 40}), ids.process(set())] == [
        12, 41, 42, 43, 44]
    assert [ids.thread(12, 40), ids.thread(12, 40), ids.thread(41, 40), ids.thread(12, 0), ids.thread(12, None)] == [
        40, 45, 40, 46, 47]


def test_the_projects_reader_finds_the_same_processes_and_threads(tmp_path: Path):
    path = tmp_path / "x.pftrace"
    path.write_bytes(exported_bytes())
    result = pftrace.read(path)
    assert result.meta["process_names"] == {"100": "rank 0 · stage 0", "101": "rank 1 · stage 1",
                                            "102": "rank 2 · stage 2", "103": "rank 3 · stage 3"}
    assert result.meta["thread_names"] == {"100/1": "thread 1"}
    back = result.spans.filter(pl.col("lane") == "rank0/cpu/1")  # the lane and tid the source had
    assert back.height == 4 and set(back["tid"]) == {1}


def test_chrome_json_names_each_pid_and_tid_once_and_nests_each_thread():
    rows = [(0, 7, 9, "A", 0, 10_000), (0, 7, 9, "B", 2_000, 12_000), (0, 7, 9, "C", 3_000, 4_000),
            (0, 7, 3, "F", 0, 5_000)]
    trace = perfetto.build(cpu_table(rows), lanes_report())
    events = json.loads(perfetto.to_chrome_json(trace))["traceEvents"]
    meta = [e for e in events if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")]
    ids = Counter((e["name"], e["pid"], e["tid"]) for e in meta)
    assert set(ids.values()) == {1}  # one name per pid, one per pid and tid
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert processes == {7: "rank 0"} and threads[(7, 9)] == "thread 9" and threads[(7, 3)] == "thread 3"
    spill = next(k for k, v in threads.items() if v == "overlapping · thread 9")
    assert spill[1] > 9  # an id of its own, above every recorded one
    slices = [e for e in events if e["ph"] == "X"]
    assert {(e["name"], e["tid"]) for e in slices} == {("A", 9), ("B", spill[1]), ("C", spill[1]), ("F", 3)}
    assert_nested(slices)


def assert_nested(slices: list[dict]) -> None:
    """Every X event of a (pid, tid) nests in the ones open when it begins (no partial overlap)."""
    by_thread = defaultdict(list)
    for e in slices:
        by_thread[e["pid"], e["tid"]].append((e["ts"], -e["dur"]))
    for items in by_thread.values():
        stack: list[float] = []
        for ts, neg in sorted(items):
            while stack and stack[-1] <= ts:
                stack.pop()
            assert not stack or ts - neg <= stack[-1] + 1e-3
            stack.append(ts - neg)


# --- real traces, against their raw events ---


def export_files(out: Path, paths: list[Path]) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "export", *map(str, paths), "-o", str(out), "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


def raw_threads(paths: list[Path]) -> dict[tuple[int, int, int], list[tuple[str, int, int]]]:
    """Host complete events by (rank, pid, tid): name, start and end in ns, read with json and Decimal."""
    out: dict[tuple[int, int, int], list[tuple[str, int, int]]] = defaultdict(list)
    for i, path in enumerate(paths):
        doc = ind.load_json(path)
        rank = ind.kineto_rank(doc, path, i)
        for e in doc["traceEvents"]:
            cat = str(e.get("cat") or "").lower()
            ids = (e.get("pid"), e.get("tid"))
            if e.get("ph") != "X" or cat in GPU_CATEGORIES or cat == "trace" or "dur" not in e or not all(
                    isinstance(i, int) for i in ids):
                continue
            start = ind.ts_ns(e["ts"])
            out[(rank, *ids)].append((e["name"], start, start + ind.dur_ns(e["dur"])))
    return out


def plain_depths(events: list[tuple[str, int, int]]) -> Counter:
    """(name, start from the thread's first, depth) of events that all nest: a stack of the open ends, an end
    up to 2 ns past its parent's still nesting (two roundings of µs to ns)."""
    stack: list[int] = []
    first = min(s for _, s, _ in events)
    out = Counter()
    for name, start, end in sorted(events, key=lambda e: (e[1], -e[2])):
        while stack and stack[-1] <= start:
            stack.pop()
        assert not stack or end <= stack[-1] + 2, "the thread has overlaps"
        out[name, start - first, len(stack)] += 1
        stack.append(min(end, stack[-1]) if stack else end)
    return out


REAL = [("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), ("kineto", "recsys_128rank_sampled_rank-*.json.gz"),
        ("pipeline_cpu", "1f1b/rank*.pt.trace.json.gz")]


@pytest.mark.parametrize(("folder", "pattern"), REAL)
def test_real_traces_processes_threads_and_depths(tmp_path: Path, folder: str, pattern: str):
    paths = sorted(shared(folder).glob(pattern))
    got = tables(export_files(tmp_path / "x.pftrace", paths).read_bytes())
    raw = raw_threads(paths)
    pid_of = {rank: pid for rank, pid, _ in raw}
    assert got.reused == 0 and {pid: got.processes[pid].split(" · ")[0] for pid in pid_of.values()} == {
        pid: f"rank {rank}" for rank, pid in pid_of.items()} and len(got.processes) == len(pid_of)
    assert len(got.threads) == len(raw)
    for (_, pid, tid), events in raw.items():
        (key,) = [k for k, name in got.threads.items() if k[0] == pid and name == f"thread {tid}"]
        assert key[1] == tid or not 0 < tid < LIMIT  # the recorded tid, unless Perfetto cannot hold it
        track = got.thread_track(*key)
        under = got.under(track)
        on = [(name, start, depth) for t, name, start, depth in got.slices if t in under]
        assert len(on) == len(events)  # every event of the thread on its track or the overlaps under it
        if under == {track}:  # nothing overlaps: the depths a plain stack gives the raw events
            first = min(start for _, start, _ in on)
            assert Counter((n, s - first, d) for n, s, d in on) == plain_depths(events)


def test_real_trace_chrome_json_names_each_thread_once_and_nests(tmp_path: Path):
    """pipeline_cpu's 1F1B ranks: gloo's work overlaps its callers', so each thread has overlaps of its own."""
    paths = sorted(shared("pipeline_cpu").glob("1f1b/rank*.pt.trace.json.gz"))
    events = json.loads(export_files(tmp_path / "x.json", paths).read_text())["traceEvents"]
    meta = Counter((e["name"], e["pid"], e["tid"]) for e in events if e["ph"] == "M")
    assert set(meta.values()) == {1}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    raw = raw_threads(paths)
    assert {(pid, tid): f"thread {tid}" for _, pid, tid in raw}.items() <= threads.items()
    slices = [e for e in events if e["ph"] == "X"]
    assert_nested(slices)
    on_threads = Counter((e["pid"], e["tid"]) for e in slices if threads.get((e["pid"], e["tid"]), "").startswith(
        ("thread", "overlapping · thread")))
    assert sum(on_threads.values()) == sum(map(len, raw.values()))


def test_each_level_of_overlaps_has_a_name_of_its_own():
    """A [0, 10), B [2, 12) and C [4, 14) each overlap the one before without nesting: B on the first level of
    overlaps, C on the second, both under the thread's track with one merge key (the UI draws one track)."""
    rows = [(0, 7, 9, "A", 0, 10_000), (0, 7, 9, "B", 2_000, 12_000), (0, 7, 9, "C", 4_000, 14_000)]
    got = tables(exported_bytes(cpu_table(rows), lanes_report()))
    thread = got.thread_track(7, 9)
    by = {name: got.tracks[t] for t, name, _, _ in got.slices}
    assert [by[n].name for n in "ABC"] == ["thread 9", "overlapping · thread 9", "overlapping 2 · thread 9"]
    assert by["B"].parent_uuid == by["C"].parent_uuid == thread
    assert by["B"].sibling_merge_key == by["C"].sibling_merge_key and got.threads == {(7, 9): "thread 9"}
