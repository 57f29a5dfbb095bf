"""Real Kineto traces: device-lane busy time equals an independent naive union to the nanosecond."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest
from conftest import shared, shared_files

from pipebubble.analysis.lanes import lane_table
from pipebubble.ingest import load

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset"}
KINETO = shared_files("kineto", "*.json.gz")


def naive_device_busy(path: Path) -> dict[int, tuple[int, int, int]]:
    """Per device: (busy, window start, window end), from json.load with exact decimal timestamps."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    base = doc.get("baseTimeNanoseconds", 0) if isinstance(doc, dict) else 0
    intervals: dict[int, list[tuple[int, int]]] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() in GPU_CATEGORIES:
            start = int(Decimal(e["ts"]) * 1000) + base
            intervals.setdefault(e["pid"], []).append((start, start + int(Decimal(e["dur"]) * 1000)))
    out = {}
    for device, items in intervals.items():
        items.sort()
        busy, cur_s, cur_e = 0, *items[0]
        for s, e in items[1:]:
            if s > cur_e:
                busy, cur_s, cur_e = busy + cur_e - cur_s, s, e
            else:
                cur_e = max(cur_e, e)
        out[device] = (busy + cur_e - cur_s, items[0][0], max(e for _, e in items))
    return out


@pytest.mark.parametrize("path", KINETO or [None], ids=lambda p: p.name if p else "absent")
def test_device_busy_matches_naive_union(path):
    path = path or shared("kineto")
    lanes = lane_table(load([path], use_cache=False).spans)
    devices = lanes.filter((lanes["kind"] == "gpu") & lanes["stream"].is_null())
    expected = naive_device_busy(path)
    got = {row["device"]: (row["busy_ns"], row["window_start_ns"], row["window_end_ns"])
           for row in devices.iter_rows(named=True)}
    assert got == expected
    for row in devices.iter_rows(named=True):
        assert row["busy_ns"] + row["idle_ns"] == row["window_end_ns"] - row["window_start_ns"]


def test_rank_from_distributed_info_and_file_name():
    folder = shared("kineto")
    result = load([folder / "recsys_128rank_sampled_rank-1.json.gz", folder / "cpu_only_gloo_rank34.json.gz"])
    assert set(result.spans["rank"].unique().to_list()) == {1, 34}


def test_ns_fraction_above_float_precision_is_exact():
    """V100 trace: absolute epoch µs with three decimals (``1712195495519689.047``) kept to the ns."""
    path = shared("kineto", "resnet_v100_ns_resolution.json.gz")
    spans = load([path], use_cache=False).spans
    assert 1712195495519689047 in spans["start"].to_list()


def test_comm_kernels_and_old_categories():
    a100 = load([shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")], use_cache=False).spans
    comm = a100.filter(a100["kind"] == "comm")
    assert comm.height > 0 and all("nccl" in n.lower() for n in comm["name"].to_list())
    old = load([shared("kineto", "old_category_names_inference.json.gz")], use_cache=False).spans
    assert {"kernel", "runtime"} <= set(old["kind"].cast(str).to_list())


def test_gpu_events_use_pid_as_device_and_tid_as_stream():
    spans = load([shared("kineto", "recsys_128rank_sampled_rank-1.json.gz")], use_cache=False).spans
    kernels = spans.filter(spans["kind"] == "kernel")
    assert kernels["device"].unique().to_list() == [1]
    assert kernels["pid"].null_count() == kernels.height
    assert set(kernels["stream"].unique().to_list()) >= {7}


def test_per_rank_folder_reads_every_rank():
    result = load([shared("pipeline_cpu", "gpipe")], use_cache=False)
    assert sorted(result.spans["rank"].unique().to_list()) == [0, 1, 2, 3]
    assert len(result.files) == 4 and not result.warnings


@pytest.mark.parametrize("into", [2, 40, 600, -3, -1])
def test_a_real_trace_cut_off_after_its_events_reads_them_all(tmp_path, into):
    """Kineto writes more after the events array (the profiler's INFO lines, traceName, displayTimeUnit and,
    last, baseTimeNanoseconds: 1.3 KB here); a file cut off there has every event, and says what it lost.
    Cut before the base time was written whole, the times stay on the profiler's own clock, and it says so."""
    from pipebubble.ingest.json import chrome

    text = gzip.decompress(shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz").read_bytes())
    close = text.rindex(b"]", 0, text.index(b'"INFO"'))  # the events array's end
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    whole.write_bytes(text)
    cut.write_bytes(text[: close + into if into > 0 else len(text) + into])
    full, partial = chrome.read(whole), chrome.read(cut)
    base = 0 if into == -1 else full.meta["base_time_ns"]  # -1: only the closing brace is missing
    moved = full.spans.drop("source").with_columns(pl.col("start", "end") - base)
    assert partial.spans.drop("source").equals(moved) and partial.meta["unread_bytes"] == 0
    lost = (f"{cut}: trace cut off after its last event; {cut.stat().st_size - close - 1} bytes after the events"
            " unreadable")
    lost += " (if they held its baseTimeNanoseconds, times stay on the profiler's own clock)" if base else ""
    assert partial.warnings == [*full.warnings, lost]
