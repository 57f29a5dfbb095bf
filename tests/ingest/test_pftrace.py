"""Perfetto protobuf input (``ingest/pftrace.py``): an ``export``ed trace reads back to its source's lanes and
stages; a foreign TrackEvent writer's slices (process and thread tracks, interned names per sequence, a default
track, legacy complete events); a cut-off file; garbage and empty files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, shared
from runs import run_cli
from synth import simulate, write_pipeline

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import pftrace, readers

SAMPLES = ROOT / "sample_traces"


def _report(*paths: Path) -> dict:
    proc = run_cli("analyze", *map(str, paths), "--format", "json", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _export(source: Path, out: Path) -> Path:
    proc = run_cli("export", str(source), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    return out


def _lanes_and_stages(report: dict) -> tuple[list, list]:
    key = lambda x: json.dumps(x, sort_keys=True)  # noqa: E731
    return sorted(report["lanes"], key=key), sorted(report["stages"], key=key)


def _gpu_pipeline(folder: Path) -> Path:
    return write_pipeline(folder, simulate("1f1b", 4, 4, [100_000] * 4, [200_000] * 4))


@pytest.mark.parametrize("source", ["pipeline_1f1b", "toy_train", "gpu"])
def test_export_reads_back_to_the_same_lanes_and_stages(tmp_path: Path, source: str) -> None:
    src = _gpu_pipeline(tmp_path / "src") if source == "gpu" else SAMPLES / source
    out = _export(src, tmp_path / "x.pftrace")
    before, after = _report(src), _report(out)
    assert _lanes_and_stages(after) == _lanes_and_stages(before)
    assert after["lanes"] and (source == "toy_train" or after["stages"])
    if source == "gpu":
        assert any(lane["kind"] == "gpu" for lane in after["lanes"])
    if before.get("pipeline"):
        assert after["pipeline"]["bubble_fraction"] == before["pipeline"]["bubble_fraction"]
        assert "pipebubble_overlay" in after["ingest"]["skipped"]  # the passes and waits are not spans


@pytest.mark.parametrize("source", [("pipeline_cpu", "1f1b"), ("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")])
def test_export_of_a_shared_trace_reads_back(tmp_path: Path, source: tuple[str, str]) -> None:
    src = shared(*source)
    out = _export(src, tmp_path / "x.pftrace")
    assert _lanes_and_stages(_report(out)) == _lanes_and_stages(_report(src))


def test_export_spans_keep_kind_device_stream_and_correlation(tmp_path: Path) -> None:
    src = _gpu_pipeline(tmp_path / "src")
    result = pftrace.read(_export(src, tmp_path / "x.pftrace"))
    kernels = result.spans.filter(kind="kernel")
    assert kernels.height and set(kernels["lane"].unique()) == {f"rank{r}/gpu0" for r in range(4)}
    assert set(kernels["stream"].unique()) == {7} and set(kernels["device"].unique()) == {0}
    assert kernels["correlation"].null_count() == 0 and kernels["pid"].null_count() == kernels.height
    assert result.format == "perfetto" and result.meta["rank"] is None  # four ranks in one file


def _foreign(path: Path, *, cut: int = 0) -> Path:
    """A trace as an SDK writes one: a process track and two thread tracks, names and categories interned on
    two sequences (the second clearing its state), a default track, a legacy complete event, an instant and a
    counter."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent

    t = Trace()

    def packet(seq: int, ts: int | None = None, flags: int = 0):
        p = t.packet.add()
        p.trusted_packet_sequence_id = seq
        if ts is not None:
            p.timestamp = ts
        if flags:
            p.sequence_flags = flags
        return p

    p = packet(1)
    p.track_descriptor.uuid = 10
    p.track_descriptor.process.pid, p.track_descriptor.process.process_name = 42, "python"
    for uuid, tid, seq in ((11, 43, 1), (12, 44, 2)):
        p = packet(seq)
        p.track_descriptor.uuid, p.track_descriptor.parent_uuid = uuid, 10
        p.track_descriptor.thread.pid, p.track_descriptor.thread.tid = 42, tid
    p = packet(1, 1_000, TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
    p.interned_data.event_names.add(iid=1, name="aten::mm")
    p.interned_data.event_categories.add(iid=1, name="cpu_op")
    p.interned_data.debug_annotation_names.add(iid=1, name="External id")
    e = p.track_event
    e.type, e.track_uuid, e.name_iid = TrackEvent.TYPE_SLICE_BEGIN, 11, 1
    e.category_iids.append(1)
    e.debug_annotations.add(name_iid=1, int_value=77)
    p = packet(1, 1_500)
    p.track_event.type, p.track_event.track_uuid = TrackEvent.TYPE_INSTANT, 11
    p = packet(1, 2_000)
    p.track_event.type, p.track_event.track_uuid = TrackEvent.TYPE_SLICE_END, 11
    # sequence 2: its own iid 1, a default track, a legacy complete event
    p = packet(2, 3_000, TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
    p.trace_packet_defaults.track_event_defaults.track_uuid = 12
    p.interned_data.event_names.add(iid=1, name="ProfilerStep#3")
    p.track_event.type, p.track_event.name_iid = TrackEvent.TYPE_SLICE_BEGIN, 1
    p = packet(2, 4_000)
    p.track_event.type = TrackEvent.TYPE_SLICE_END
    p = packet(2, 5_000)
    p.track_event.name = "aten::add"
    p.track_event.categories.append("cpu_op")
    p.track_event.legacy_event.phase, p.track_event.legacy_event.duration_us = ord("X"), 2
    p = packet(2, 6_000)
    p.track_event.type, p.track_event.double_counter_value = TrackEvent.TYPE_COUNTER, 1.0
    data = t.SerializeToString()
    path.write_bytes(data[: len(data) - cut] if cut else data)
    return path


def test_a_foreign_writers_slices(tmp_path: Path) -> None:
    result = pftrace.read(_foreign(tmp_path / "rank5.pftrace"))
    rows = result.spans.sort("start").select("lane", "kind", "name", "start", "end", "external_id", "rank").rows()
    assert rows == [
        ("rank5/pid42/tid43", "cpu_op", "aten::mm", 1_000, 2_000, 77, 5),
        ("rank5/pid42/tid44", "step", "ProfilerStep#3", 3_000, 4_000, None, 5),
        ("rank5/pid42/tid44", "cpu_op", "aten::add", 5_000, 7_000, None, 5),
    ]
    assert result.skipped == {"instant": 1, "counter": 1}
    assert not result.warnings and result.meta["process_names"] == {"42": "python"}


def test_a_cut_off_file_is_read_to_its_last_whole_packet(tmp_path: Path) -> None:
    result = pftrace.read(_foreign(tmp_path / "cut.pftrace", cut=3))  # the counter packet is cut off
    assert result.spans.height == 3 and "counter" not in result.skipped
    assert len(result.warnings) == 1 and "cut off" in result.warnings[0]
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    whole = _foreign(tmp_path / "whole.pftrace")
    trace = Trace.FromString(whole.read_bytes())
    kept = len(Trace(packet=trace.packet[:-3]).SerializeToString())  # up to the step's begin
    cut = tmp_path / "cut2.pftrace"
    cut.write_bytes(whole.read_bytes()[: kept + 4])  # mid-way through the step's end
    result = pftrace.read(cut)
    assert result.spans["name"].to_list() == ["aten::mm"] and result.skipped["unclosed"] == 1
    assert "cut off" in result.warnings[0]


def test_a_cut_off_export_through_the_cli(tmp_path: Path) -> None:
    out = _export(SAMPLES / "pipeline_1f1b", tmp_path / "x.pftrace")
    data = out.read_bytes()
    cut = tmp_path / "cut.pftrace"
    cut.write_bytes(data[: len(data) // 2])
    proc = run_cli("analyze", str(cut), "--format", "json", "--no-cache")
    assert proc.returncode == 0, proc.stderr
    assert "cut off" in proc.stderr and json.loads(proc.stdout)["ingest"]["spans"] > 0


@pytest.mark.parametrize("garbage", [b"this is not a trace\n" * 50, b"\x0a\xff\xff\xff\xff\x0f" + b"\x00" * 100])
def test_garbage_is_exit_2_with_one_line_naming_the_file(tmp_path: Path, garbage: bytes) -> None:
    path = tmp_path / "bad.pftrace"
    path.write_bytes(garbage)
    with pytest.raises(TraceFormatError):
        pftrace.read(path)
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0]


def test_an_empty_trace(tmp_path: Path) -> None:
    path = tmp_path / "empty.pftrace"
    path.write_bytes(b"")
    result = pftrace.read(path)
    assert result.spans.height == 0 and result.events_read == 0 and not result.warnings
    proc = run_cli("analyze", str(path))  # as an empty Chrome trace: nothing to analyse
    assert proc.returncode == 2 and "nothing to analyse" in proc.stderr and str(path) in proc.stderr


def test_sniffed_by_suffix_or_first_bytes(tmp_path: Path) -> None:
    named = _foreign(tmp_path / "t.pftrace")
    unnamed = tmp_path / "trace.bin"
    unnamed.write_bytes(named.read_bytes())
    text = tmp_path / "trace.txt"
    text.write_text('{"traceEvents": []}')
    assert readers.reader_for(named).name == "perfetto" and readers.reader_for(unnamed).name == "perfetto"
    assert readers.reader_for(text).name == "json"
    assert ".pftrace" in readers.TRACE_SUFFIXES


def test_chrome_json_under_a_pftrace_name_is_read_as_json(tmp_path: Path) -> None:
    """torch 2.13's ``export_chrome_trace("t.pftrace")`` writes Chrome JSON whatever the name says."""
    path = tmp_path / "t.pftrace"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10.0, "dur": 5.0}]}))
    assert readers.reader_for(path).name == "json"
    assert _report(path)["lanes"][0]["lane"] == "rank0/pid1/tid2"
