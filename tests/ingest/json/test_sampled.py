"""A trace whose operators were mostly removed after profiling (a filtered or sampled one) is said to be so:
Kineto numbers its operators one by one (``External id``), so a complete trace holds nearly every id of its
range and a sampled one few of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared

from pipebubble.options import Options, Scale
from pipebubble.run import run

US = 1_000


def trace(path: Path, step: int) -> Path:
    """300 operators of 10 µs each with a kernel launched by each, ``External id`` 1, 1 + step, 1 + 2 step ..."""
    events = []
    for k in range(300):
        t = 20 * k
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": 10,
             "args": {"External id": 1 + step * k}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1, "dur": 2,
             "args": {"correlation": k + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t + 4, "dur": 8,
             "args": {"correlation": k + 1}},
        ]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def notes(path: Path) -> list[str]:
    report = run([path], Options(), Scale(use_cache=False, workers=1))
    return [n for n in report.notes if "operator ids" in n]


def test_a_trace_holding_a_tenth_of_its_operator_ids_is_said_to_be_sampled(tmp_path):
    (said,) = notes(trace(tmp_path / "sampled.json", 10))
    assert "keeps 300 of the 2,991 operator ids in its range (10.0%)" in said and "sampled" in said


def test_a_complete_trace_is_not(tmp_path):
    assert notes(trace(tmp_path / "whole.json", 1)) == []


@pytest.mark.parametrize(("name", "sampled"), [("recsys_128rank_sampled_rank-0.json.gz", True),
                                               ("resnet_ddp_a100_nccl_rank0.json.gz", False)])
def test_the_shared_sampled_trace_is_said_and_a_complete_one_is_not(name, sampled):
    assert bool(notes(shared("kineto", name))) is sampled


@pytest.mark.parametrize("step", [1, 7, 64, 1000])
def test_a_spilled_trace_counts_its_operator_ids_as_one_held_in_memory(step, tmp_path, monkeypatch):
    """A spilled trace's ids are counted a bit each (never holding every id): the same count and range."""
    from pipebubble.ingest import read_file

    path = trace(tmp_path / "t.json", step)
    held = read_file(path, use_cache=False).meta["operator_ids"]
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "0")
    spilled = read_file(path, use_cache=False)
    assert spilled.meta.get("spill") and spilled.meta["operator_ids"] == held == [300, 1 + 299 * step]
