"""The Perfetto export: decode what was written with perfetto's own protos and count tracks and slices."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent
from test_render import MS, T0, gpipe_report, lanes_report

from pipebubble import spans as span_schema
from pipebubble.render import perfetto

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"


def span_table() -> pl.DataFrame:
    """Two ranks: a CPU thread with nested ranges, and a GPU stream with two kernels that overlap without nesting."""
    rows = [("cpu_op", "rank0/cpu/1", None, "step", 0, 10), ("cpu_op", "rank0/cpu/1", None, "forward", 1, 4),
            ("cpu_op", "rank0/cpu/1", None, "aten::mm", 2, 3), ("kernel", "rank1/gpu0", 7, "gemm", 1, 5),
            ("kernel", "rank1/gpu0", 7, "gemm2", 3, 8), ("comm", "rank1/gpu0", 13, "ncclSendRecv", 8, 9)]
    frame = pl.DataFrame({"kind": [r[0] for r in rows], "lane": [r[1] for r in rows],
                          "stream": [r[2] for r in rows], "name": [r[3] for r in rows],
                          "start": [T0 + r[4] * MS for r in rows], "end": [T0 + r[5] * MS for r in rows],
                          "rank": [int(r[1][4]) for r in rows], "source": ["t.json"] * len(rows)})
    return span_schema.conform(frame)


def decode(data: bytes) -> tuple[dict[int, str], dict[int, int], list]:
    trace = Trace()
    trace.ParseFromString(data)
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in trace.packet if p.HasField("track_descriptor")}
    parents = {p.track_descriptor.uuid: p.track_descriptor.parent_uuid for p in trace.packet
               if p.HasField("track_descriptor")}
    events = [p for p in trace.packet if p.HasField("track_event")]
    return names, parents, events


def test_round_trip_tracks_and_slices():
    report = gpipe_report()
    data = perfetto.to_proto(perfetto.build(span_table(), report))
    names, parents, events = decode(data)
    begins, ends = (Counter(names[e.track_event.track_uuid] for e in events if e.track_event.type == kind)
                    for kind in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END))
    assert begins == ends
    assert begins["rank0/cpu/1"] == 3  # nested ranges share one track
    assert begins["rank1/gpu0/stream7"] == 1 and begins["rank1/gpu0/stream7 #2"] == 1  # overlap: a sibling track
    assert begins["rank1/gpu0/stream13"] == 1
    assert sum(begins[f"s{s} passes"] for s in range(4)) == len(report.timeline)
    assert sum(begins[f"s{s} waits"] for s in range(4)) == len(report.waits)
    assert {"rank 0", "rank 1", "pipebubble: passes", "pipebubble: bubbles and waits"} <= set(names.values())
    counters = [e for e in events if e.track_event.type == TrackEvent.TYPE_COUNTER]
    assert counters and max(e.track_event.double_counter_value for e in counters) == 1.0
    assert min(e.timestamp for e in events) == T0  # absolute ns are kept


def test_waits_carry_their_cause():
    _, _, events = decode(perfetto.to_proto(perfetto.build(span_table(), gpipe_report())))
    waits = [e.track_event for e in events if e.track_event.name.startswith("wait: ")]
    causes = {a.string_value for e in waits for a in e.debug_annotations if a.name == "cause"}
    assert causes == {"fill", "downstream", "upstream", "comm"}


def test_slices_nest_on_every_track():
    _, _, events = decode(perfetto.to_proto(perfetto.build(span_table(), gpipe_report())))
    depth: Counter = Counter()
    for e in events:
        kind = e.track_event.type
        depth[e.track_event.track_uuid] += {TrackEvent.TYPE_SLICE_BEGIN: 1, TrackEvent.TYPE_SLICE_END: -1}.get(kind, 0)
        assert depth[e.track_event.track_uuid] >= 0


def test_lanes_only_report_gets_a_counter_per_device():
    names, _, events = decode(perfetto.to_proto(perfetto.build(span_table(), lanes_report())))
    counters = {names[e.track_event.track_uuid] for e in events if e.track_event.type == TrackEvent.TYPE_COUNTER}
    assert counters == {"utilization rank0/gpu0"}


def test_chrome_json_has_the_same_slices():
    trace = perfetto.build(span_table(), gpipe_report())
    body = json.loads(perfetto.to_chrome_json(trace))
    slices = [e for e in body["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == len(trace.slices) and min(e["ts"] for e in slices) == 0
    assert body["otherData"]["origin_ns"] == T0
    assert perfetto.to_chrome_json(trace) == perfetto.to_chrome_json(perfetto.build(span_table(), gpipe_report()))


def test_empty_report_and_table():
    trace = perfetto.build(span_schema.empty(), lanes_report())
    assert trace.slices == [] and decode(perfetto.to_proto(trace))[2]


@pytest.mark.skipif(not SAMPLE.exists(), reason="sample traces absent")
@pytest.mark.parametrize("suffix", [".pftrace", ".json"])
def test_cli_export(tmp_path, suffix):
    out = tmp_path / f"out{suffix}"
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "export", str(SAMPLE), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if suffix == ".json":
        assert any(e["ph"] == "X" for e in json.loads(out.read_text())["traceEvents"])
    else:
        names, _, events = decode(out.read_bytes())
        assert len(events) > 1000 and any(n.startswith("rank3/") for n in names.values())


def test_cli_export_refuses_an_unknown_suffix(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "export", str(SAMPLE), "-o", str(tmp_path / "x.txt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "x.txt" in proc.stderr
