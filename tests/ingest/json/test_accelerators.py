"""Accelerators other than CUDA and ROCm in a Kineto trace: an MTIA device's command-processor events
(``mtia_ccp_events``, libkineto's ``ActivityType::MTIA_CCP_EVENTS``) are kernels on a device lane and its
runtime calls launch them; a category the reader does not understand is read as CPU work and said once, with
its count, never silently."""

from __future__ import annotations

import json

import polars as pl

from pipebubble.ingest.json import chrome


def x(cat: str, name: str, pid: int, tid: int, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write(path, events, kineto: bool = True):
    doc = {"schemaVersion": 1, "traceEvents": events} if kineto else {"traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


MTIA = [
    x("cpu_op", "aten::mm", 100, 101, 0, 50, **{"External id": 1}),
    x("mtia_runtime", "mtiaLaunchKernel", 100, 101, 5, 3, correlation=7),
    x("mtia_ccp_events", "mm_kernel", 0, 3, 10, 20, correlation=7),
    x("mtia_ccp_events", "add_kernel", 0, 3, 30, 5, correlation=8),
    x("hpu_op", "synapse_op", 0, 4, 10, 20),
    x("hpu_op", "synapse_op", 0, 4, 40, 2),
    x("mtia_insight", "counter_window", 0, 5, 0, 60),
]


def test_mtia_device_events_are_kernels_on_a_device_lane(tmp_path):
    result = chrome.read(write(tmp_path / "mtia.json", MTIA))
    table = result.spans.sort("start", "name")
    kernels = table.filter(pl.col("kind") == "kernel")
    assert kernels.select("name", "lane", "device", "stream", "pid", "tid").rows() == [
        ("mm_kernel", "rank0/gpu0", 0, 3, None, None), ("add_kernel", "rank0/gpu0", 0, 3, None, None)]
    assert table.filter(pl.col("name") == "mtiaLaunchKernel")["kind"].to_list() == ["runtime"]


def test_categories_not_understood_are_said_once_with_their_counts(tmp_path):
    """hpu_op (2 events) and mtia_insight (1): CPU work, as before, and one warning naming both; nothing skipped."""
    result = chrome.read(write(tmp_path / "mtia.json", MTIA))
    warned = [w for w in result.warnings if "not understood" in w]
    assert warned == [f"{tmp_path / 'mtia.json'}: event categories not understood, read as CPU work: "
                      "'hpu_op' (2 events), 'mtia_insight' (1 event)"]
    assert result.spans.filter(pl.col("name") == "synapse_op")["kind"].to_list() == ["cpu_op", "cpu_op"]
    assert not result.skipped


def test_a_generic_chrome_traces_own_categories_are_not_warned_about(tmp_path):
    """A Chrome trace that is not Kineto's names categories of its writer's own: CPU work, nothing to say."""
    result = chrome.read(write(tmp_path / "app.json", [x("render", "paint", 1, 1, 0, 5)], kineto=False))
    assert result.warnings == [] and not result.skipped and result.spans["kind"].to_list() == ["cpu_op"]


def test_a_batch_of_small_files_says_the_same(tmp_path):
    """Small files mapped together (``read_batch``) give each file its own warning and counts."""
    a, b = write(tmp_path / "a.json", MTIA), write(tmp_path / "b.json", MTIA[:3])
    got = chrome.read_batch([chrome.decode_pending(a), chrome.decode_pending(b)])
    assert [len([w for w in r.warnings if "not understood" in w]) for r in got] == [1, 0]
    assert [r.spans.filter(pl.col("kind") == "kernel").height for r in got] == [2, 1]
