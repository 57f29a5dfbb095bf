"""Real Kineto traces: device-lane busy time equals an independent naive union to the nanosecond."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

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
