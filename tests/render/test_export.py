"""The Perfetto export: decode what was written with perfetto's own protos (``perfetto.protos``) and check the
tracks, their nesting, the slices' args and the flows that link them."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackDescriptor, TrackEvent
from test_render import MS, T0, collectives_report, gpipe_report, lanes_report

from pipebubble import spans as span_schema
from pipebubble.ingest.json import extras
from pipebubble.render import perfetto
from pipebubble.render.perfetto.flows import attach
from pipebubble.report import Wait

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"


# --- a decoder over perfetto's protos: interning resolved, slice stacks replayed ---


@dataclass
class Decoded:
    tracks: dict[int, Any]  # uuid -> TrackDescriptor
    slices: list[dict] = field(default_factory=list)  # in begin order: track, name, start, end, category, args
    counters: list[tuple[int, int, float]] = field(default_factory=list)
    flows: dict[int, list[int]] = field(default_factory=dict)  # flow id -> indexes into slices, in order

    def name(self, uuid: int) -> str:
        return self.tracks[uuid].name

    def group(self, uuid: int) -> str:
        """The name of the top-level track above ``uuid``."""
        while self.tracks[uuid].parent_uuid:
            uuid = self.tracks[uuid].parent_uuid
        return self.tracks[uuid].name

    def on(self, track_name: str) -> list[dict]:
        return [s for s in self.slices if self.name(s["track"]) == track_name]


def value(ann) -> Any:
    """A DebugAnnotation as the JSON value it encodes."""
    if ann.dict_entries:
        return {e.name: value(e) for e in ann.dict_entries}
    if ann.array_values:
        return [value(v) for v in ann.array_values]
    kind = ann.WhichOneof("value")
    return json.loads(ann.legacy_json_value) if kind == "legacy_json_value" else getattr(ann, kind)


def decode(data: bytes) -> Decoded:
    """Every packet in order; asserts what Perfetto requires of them: one sequence, times that never go back,
    interned names defined before use, and every end closing the innermost open slice of its track."""
    trace = Trace()
    trace.ParseFromString(data)
    out = Decoded({p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")})
    interned: dict[str, dict[int, str]] = {}
    stacks: dict[int, list[dict]] = {}
    last = None
    for p in trace.packet:
        assert p.trusted_packet_sequence_id == 1
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            interned = {"event_names": {}, "event_categories": {}, "debug_annotation_names": {}}
        for table, known in interned.items():
            known.update({e.iid: e.name for e in getattr(p.interned_data, table)})
        if not p.HasField("track_event"):
            continue
        assert last is None or p.timestamp >= last
        last, e = p.timestamp, p.track_event
        assert e.track_uuid in out.tracks
        if e.type == TrackEvent.TYPE_COUNTER:
            out.counters.append((e.track_uuid, p.timestamp, e.double_counter_value))
        elif e.type == TrackEvent.TYPE_SLICE_BEGIN:
            assert p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
            names = interned["debug_annotation_names"]
            s = {"track": e.track_uuid, "name": interned["event_names"][e.name_iid], "start": p.timestamp,
                 "end": None, "category": [interned["event_categories"][i] for i in e.category_iids],
                 "args": {a.name or names[a.name_iid]: value(a) for a in e.debug_annotations}}
            stacks.setdefault(e.track_uuid, []).append(s)
            for fid in [*e.flow_ids, *e.terminating_flow_ids]:
                out.flows.setdefault(fid, []).append(len(out.slices))
            out.slices.append(s)
        else:
            assert e.type == TrackEvent.TYPE_SLICE_END and stacks.get(e.track_uuid)
            stacks[e.track_uuid].pop()["end"] = p.timestamp
    assert not any(stacks.values()), "slices left open"
    return out


# --- a small job: nested CPU ranges, overlapping kernels, args and flows ---


def span_table() -> pl.DataFrame:
    """Rank 0: a CPU thread with nested ranges and a launch; rank 1: a GPU stream with two kernels that overlap
    without nesting, and a communication stream."""
    cpu = "rank0/cpu/1"
    rows = [("cpu_op", cpu, None, "step", 0, 10, None), ("cpu_op", cpu, None, "forward", 1, 4, None),
            ("cpu_op", cpu, None, "aten::mm", 2, 3, None),
            ("runtime", cpu, None, "cudaLaunchKernel", 2.2, 2.4, 42),
            ("kernel", "rank1/gpu0", 7, "gemm", 1, 5, None), ("kernel", "rank1/gpu0", 7, "gemm2", 3, 8, None),
            ("comm", "rank1/gpu0", 13, "ncclSendRecv", 8, 9, None),
            ("kernel", "rank0/gpu0", 7, "mm_kernel", 3, 3.5, 42)]
    frame = pl.DataFrame({"kind": [r[0] for r in rows], "lane": [r[1] for r in rows],
                          "stream": [r[2] for r in rows], "name": [r[3] for r in rows],
                          "start": [T0 + int(r[4] * MS) for r in rows], "end": [T0 + int(r[5] * MS) for r in rows],
                          "correlation": [r[6] for r in rows], "rank": [int(r[1][4]) for r in rows],
                          "source": ["t.json"] * len(rows),
                          "pid": [None if r[2] else 100 for r in rows], "tid": [None if r[2] else 1 for r in rows],
                          "device": [0 if r[2] else None for r in rows]})
    return span_schema.conform(frame)


def with_extras(table: pl.DataFrame) -> pl.DataFrame:
    """The source's args of aten::mm (shapes, types, its id) and a pair of flow events on its thread: an
    arrow from ``forward`` to ``aten::mm``."""
    args = pl.DataFrame([("t.json", "X", "cpu_op", 100, 1, "aten::mm", T0 + 2 * MS, T0 + 3 * MS,
                          json.dumps({"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"],
                                      "External id": 7}))],
                        schema=extras.ARGS_SCHEMA, orient="row")
    flows = pl.DataFrame([("t.json", "s", "fwdbwd", "9", 100, 1, T0 + 1 * MS, None),
                          ("t.json", "f", "fwdbwd", "9", 100, 1, T0 + 2 * MS, "e")], schema=extras.FLOW_SCHEMA,
                         orient="row")
    return attach(table, args, flows)


def exported(table: pl.DataFrame | None = None, report=None) -> Decoded:
    table = with_extras(span_table()) if table is None else table
    return decode(perfetto.to_proto(perfetto.build(table, report or gpipe_report())))


def test_one_track_per_thread_and_stream_under_its_rank():
    trace, report = exported(), gpipe_report()
    begins = Counter((trace.group(s["track"]), trace.name(s["track"])) for s in trace.slices)
    assert begins[("rank 0 · stage 0", "thread 1")] == 4  # nested ranges and the launch share one track
    assert begins[("rank 1 · stage 1", "GPU 0 stream 7")] == 1  # and the kernel that overlaps it under it:
    assert begins[("rank 1 · stage 1", "overlapping · GPU 0 stream 7")] == 1
    assert begins[("rank 1 · stage 1", "GPU 0 stream 13")] == 1
    assert sum(n for (_, name), n in begins.items() if name == "passes") == len(report.timeline)
    assert sum(n for (_, name), n in begins.items() if name == "bubbles and waits") == len(report.waits)
    tops = {t.name for t in trace.tracks.values() if not t.parent_uuid}
    assert tops == {f"rank {s} · stage {s}" for s in range(4)} | {"utilization (stages computing / p)"}
    assert all("#" not in t.name for t in trace.tracks.values())
    assert min(s["start"] for s in trace.slices) == T0  # absolute ns are kept


def test_passes_and_waits_sit_under_their_rank_first():
    trace = exported()
    for t in trace.tracks.values():
        if t.name in ("passes", "bubbles and waits"):
            group = trace.tracks[t.parent_uuid]
            assert group.child_ordering == TrackDescriptor.EXPLICIT and not group.parent_uuid
            assert t.sibling_order_rank < min((c.sibling_order_rank for c in trace.tracks.values()
                                               if c.parent_uuid == t.parent_uuid and c.sibling_order_rank > 1),
                                              default=10)
    stage_of = {s["args"]["stage"]: trace.group(s["track"]) for s in trace.on("passes")}
    assert stage_of == {s: f"rank {s} · stage {s}" for s in range(4)}


def test_an_overlapping_span_spills_to_a_track_under_its_lanes():
    trace = exported()
    gemms = [s for s in trace.slices if s["name"] in ("gemm", "gemm2")]
    a, b = (trace.tracks[s["track"]] for s in gemms)
    assert b.parent_uuid == a.uuid and b.name == f"overlapping · {a.name}" and a.name == "GPU 0 stream 7"
    assert b.sibling_merge_behavior == TrackDescriptor.SIBLING_MERGE_BEHAVIOR_BY_SIBLING_MERGE_KEY
    assert a.description == b.description == "rank1/gpu0/stream7"
    assert not a.HasField("thread") and not b.HasField("thread")  # a stream is no thread


def test_the_innermost_enclosing_slice_is_the_parent():
    """A overlaps B without nesting (B spills); C lies inside both and goes under B, the later one; D starts
    after A ended and still belongs under B; F ends 1 ns past A (two roundings of µs) and is clipped to it."""
    rows = [("A", 0, 10_000), ("F", 500, 10_001), ("B", 2_000, 12_000), ("C", 3_000, 4_000), ("D", 11_000, 11_500)]
    table = span_schema.conform(pl.DataFrame({
        "kind": ["cpu_op"] * len(rows), "lane": ["rank0/cpu/1"] * len(rows), "rank": [0] * len(rows),
        "pid": [1] * len(rows), "tid": [1] * len(rows), "source": ["t.json"] * len(rows),
        "name": [r[0] for r in rows], "start": [T0 + r[1] for r in rows], "end": [T0 + r[2] for r in rows]}))
    trace = exported(table, lanes_report())
    by = {s["name"]: s for s in trace.slices}
    assert by["A"]["track"] != by["B"]["track"]
    assert by["C"]["track"] == by["D"]["track"] == by["B"]["track"]
    assert by["F"]["track"] == by["A"]["track"] and by["F"]["end"] == by["A"]["end"]
    assert len({s["track"] for s in trace.slices}) == 2


def test_zero_length_slices_nest():
    rows = [("outer", 0, 10), ("tick", 0, 0), ("inner", 0, 5), ("edge", 5, 5), ("after", 5, 7), ("last", 10, 10)]
    table = span_schema.conform(pl.DataFrame({
        "kind": ["cpu_op"] * len(rows), "lane": ["rank0/cpu/1"] * len(rows), "rank": [0] * len(rows),
        "pid": [1] * len(rows), "tid": [1] * len(rows), "source": ["t.json"] * len(rows),
        "name": [r[0] for r in rows], "start": [T0 + r[1] for r in rows], "end": [T0 + r[2] for r in rows]}))
    trace = exported(table, lanes_report())  # decode asserts every end closes its own track's innermost slice
    assert {(s["name"], s["end"] - s["start"]) for s in trace.slices} == {(r[0], r[2] - r[1]) for r in rows}
    assert len({s["track"] for s in trace.slices}) == 1


def test_source_args_and_span_columns_are_kept():
    trace = exported()
    mm = next(s for s in trace.slices if s["name"] == "aten::mm")
    assert mm["args"]["Input Dims"] == [[2, 3], [3, 4]] and mm["args"]["Input type"] == ["float", "float"]
    assert mm["args"]["kind"] == "cpu_op" and mm["category"] == ["cpu_op"]
    assert mm["args"]["External id"] == 7 and "external_id" not in mm["args"]
    launch = next(s for s in trace.slices if s["name"] == "cudaLaunchKernel")
    assert launch["args"] == {"kind": "runtime", "correlation": 42} and launch["category"] == ["runtime"]


def test_flows_link_the_right_slices():
    trace = exported()
    linked = {tuple(trace.slices[i]["name"] for i in steps) for steps in trace.flows.values()}
    assert linked == {("forward", "aten::mm"),  # the source's flow events
                      ("cudaLaunchKernel", "mm_kernel")}  # the correlation id: runtime call to its kernel
    raw = Trace()
    raw.ParseFromString(perfetto.to_proto(perfetto.build(with_extras(span_table()), gpipe_report())))
    ends = Counter(f for p in raw.packet for f in p.track_event.terminating_flow_ids)
    assert sorted(ends) == sorted(trace.flows) and set(ends.values()) == {1}  # each flow ends once, at its last


def test_waits_carry_their_cause():
    waits = [s for s in exported().slices if s["name"].startswith("wait: ")]
    assert {s["args"]["cause"] for s in waits} == {"fill", "downstream", "upstream", "comm"}
    assert all(s["category"] == ["pipebubble.wait"] for s in waits)


def test_collective_waits_sit_under_the_waiting_rank():
    """A job that is no pipeline: each wait goes under the rank that waited; of two that overlap on one rank,
    the second goes on a track under the first's."""
    report = collectives_report()
    overlapping = Wait(None, T0 + 41 * MS, 10 * MS, "collective", None, None, lane="rank0/gpu0", rank=0,
                       waited_for=7)
    trace = exported(span_schema.empty(), replace(report, waits=[*report.waits, overlapping]))
    waits = [s for s in trace.slices if s["name"] == "wait: collective"]
    assert len(waits) == 3 and all(trace.group(s["track"]) == f"rank {s['args']['rank']}" for s in waits)
    assert {s["args"]["waited_for"] for s in waits} == {3, 7} and {trace.name(s["track"]) for s in waits} == {
        "collective waits", "overlapping · collective waits"}
    first, second = (trace.tracks[s["track"]] for s in waits if s["args"]["rank"] == 0)
    assert second.parent_uuid == first.uuid and first.name == "collective waits"


def test_lanes_only_report_gets_a_counter_per_device_under_its_rank():
    trace = exported(report=lanes_report())
    counters = {(trace.group(t), trace.name(t)) for t, _, _ in trace.counters}
    assert counters == {("rank 0", "GPU 0 utilization")}


def test_group_names_are_short():
    """Nsight reports name no rank: a process's group is ``pid N``, with the file's name (never its folders)
    only when several files are exported together."""
    table = span_table().with_columns(rank=pl.lit(None, pl.Int32), pid=pl.lit(144, pl.Int64),
                                      source=pl.lit("/data/runs/node0/job.sqlite"))
    one = exported(table, lanes_report())
    assert {t.name for t in one.tracks.values() if not t.parent_uuid} == {"pid 144"}
    two = pl.concat([table, table.with_columns(source=pl.lit("/data/runs/node1/job.nsys-rep"))])
    names = {t.name for t in exported(two, lanes_report()).tracks.values() if not t.parent_uuid}
    assert names == {"pid 144 · job"}  # both files' stem: one name, two groups
    assert len([t for t in exported(two, lanes_report()).tracks.values() if not t.parent_uuid]) == 2


def test_chrome_json_has_the_same_slices_and_flows():
    trace = perfetto.build(with_extras(span_table()), gpipe_report())
    body = json.loads(perfetto.to_chrome_json(trace))
    slices = [e for e in body["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(trace.slices) and min(e["ts"] for e in slices) == 0
    assert body["otherData"]["origin_ns"] == T0
    mm = next(e for e in slices if e["name"] == "aten::mm")
    assert mm["args"]["Input Dims"] == [[2, 3], [3, 4]] and mm["cat"] == "cpu_op"
    flows = [e for e in body["traceEvents"] if e["ph"] in "stf"]
    assert Counter(e["ph"] for e in flows) == {"s": 2, "f": 2} and all(e.get("bp") == "e" for e in flows
                                                                       if e["ph"] == "f")
    for e in flows:  # each binds at its slice's start on the slice's own thread
        assert any(x["pid"] == e["pid"] and x["tid"] == e["tid"] and x["ts"] == e["ts"] for x in slices)
    assert perfetto.to_chrome_json(trace) == perfetto.to_chrome_json(perfetto.build(with_extras(span_table()),
                                                                                    gpipe_report()))


def test_rendering_twice_gives_the_same_bytes():
    table, report = with_extras(span_table()), gpipe_report()
    assert perfetto.to_proto(perfetto.build(table, report)) == perfetto.to_proto(perfetto.build(table, report))


def test_empty_report_and_table():
    trace = perfetto.build(span_schema.empty(), lanes_report())
    assert trace.slices == [] and decode(perfetto.to_proto(trace)).counters
    assert perfetto.build(attach(span_schema.empty()), lanes_report()).slices == []


# --- the command on the project's own sample ---


def run_export(tmp_path: Path, source: Path, name: str) -> Path:
    out = tmp_path / name
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "export", str(source), "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def sample_export(tmp_path_factory) -> Decoded:
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    return decode(run_export(tmp_path_factory.mktemp("export"), SAMPLE, "out.pftrace").read_bytes())


def test_cli_export_keeps_every_args_and_flow_of_the_sample(sample_export):
    trace = sample_export
    spans = [s for s in trace.slices if not s["category"][0].startswith("pipebubble.")]
    assert spans and all("External id" in s["args"] for s in spans)  # every event's own args
    # 784 flow events (s and f) in the four files: 392 arrows, each from a forward op to its backward op
    assert len(trace.flows) == 392 and all(len(steps) == 2 for steps in trace.flows.values())
    for first, last in trace.flows.values():
        assert trace.slices[first]["start"] < trace.slices[last]["start"]
        assert trace.group(trace.slices[first]["track"]) == trace.group(trace.slices[last]["track"])


def test_cli_export_nests_every_track_under_its_rank(sample_export):
    trace = sample_export
    tops = {t.name for t in trace.tracks.values() if not t.parent_uuid}
    assert tops == {f"rank {r} · stage {r}" for r in range(4)} | {"utilization (stages computing / p)"}
    assert not [t.name for t in trace.tracks.values() if re.search(r"\S/\S|#", t.name)]  # no lane ids, paths
    for s in trace.slices:
        assert trace.tracks[s["track"]].parent_uuid  # no slice sits on a group itself
    kinds = Counter((trace.group(s["track"]), trace.name(s["track"])) for s in trace.slices)
    for r in range(4):
        assert {name for group, name in kinds if group == f"rank {r} · stage {r}"} >= {"passes", "bubbles and waits"}


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_cli_export_chrome_json(tmp_path, suffix):
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    out = run_export(tmp_path, SAMPLE, f"out{suffix}")
    text = gzip.decompress(out.read_bytes()).decode() if suffix == ".json.gz" else out.read_text()
    events = json.loads(text)["traceEvents"]
    assert any(e["ph"] == "X" and "External id" in e["args"] for e in events)
    assert Counter(e["ph"] for e in events if e["ph"] in "sf") == {"s": 392, "f": 392}


def test_cli_export_refuses_an_unknown_suffix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "export", str(SAMPLE), "-o", str(tmp_path / "x.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "x.txt" in proc.stderr and ".json.gz" in proc.stderr
