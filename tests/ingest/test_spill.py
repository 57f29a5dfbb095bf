"""Traces too big for memory: spans spilled to Parquet give the same report as spans held in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import shared
from spilled import comparable  # noqa: E402

from pipebubble.ingest import cache
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]




@pytest.mark.parametrize(
    "where",
    [("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), ("pipeline_cpu", "gpipe"), "serve_chunked_prefill",
     ("pipeline_cpu", "interleaved1f1b", "rank2.pt.trace.json.gz"),
     ("inference", "sglang_qwen3_8b_prefill_decode.json.gz")],
    ids=["one-gpu-rank", "pipeline-folder", "serving", "one-labelled-rank-of-a-pipeline", "sglang"],
)
def test_spilled_report_equals_in_memory(where, monkeypatch):
    path = ROOT / "sample_traces" / where if isinstance(where, str) else shared(*where)
    in_memory = run([path], Options(), Scale(use_cache=False)).to_dict()
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    spilled = run([path], Options(), Scale(use_cache=True))
    assert list((cache.directory() / "spill").iterdir())
    assert comparable(spilled.to_dict()) == comparable(in_memory)
    again = run([path], Options(), Scale(use_cache=True))  # from the cache: the spill folders are reused
    assert comparable(again.to_dict()) == comparable(in_memory)


@pytest.mark.parametrize("cut_off", [False, True], ids=["whole", "cut-off"])
@pytest.mark.parametrize("workers", [1, 2], ids=["this-process", "pool"])
def test_a_block_read_again_joined_to_the_one_before_is_spilled_once(tmp_path, monkeypatch, workers, cut_off):
    """A cut that falls inside a string (``},{`` in a value) fails that block; it is read again joined to
    the next, and the next's own Parquet part, written when it was decoded alone, is removed: every span
    once, whatever the block size (and in a trace cut off mid-write, every whole event's span once)."""
    import json

    from pipebubble.ingest import read_file
    from pipebubble.ingest.json import trace as jsontrace

    events = []
    for i in range(400):
        name = "x" * 40 + '},{"ph": "X"' * 30 if i % 7 == 0 else f"op{i}"  # boundary look-alikes in a name
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0})
    path = tmp_path / "trace.json"
    text = json.dumps({"traceEvents": events})
    path.write_text(text[: -len(json.dumps(events[-1])) // 2] if cut_off else text)
    whole = 399 if cut_off else 400
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 2_000)
    in_memory = read_file(path, use_cache=False, workers=workers)
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    monkeypatch.setattr("pipebubble.ingest.readers._json_splits", lambda p: True)
    spilled = read_file(path, use_cache=False, workers=workers)
    assert in_memory.spans.height == whole and spilled.meta["spans"] == whole
    parts = sorted(Path(spilled.meta["spill"]).glob("*.parquet"))
    import polars as pl

    table = pl.read_parquet(parts).sort("start")
    assert table.height == whole and table["start"].is_unique().all()


def test_a_cut_off_trace_whose_last_blocks_are_read_again_spills_each_span_once(tmp_path, monkeypatch):
    """A value longer than a block near the end of a trace cut off mid-write: the blocks it spans fail alone
    and joined, up to the cut-off end; the trace is read up to its last whole event, and the parts the
    blocks after the value wrote when decoded alone are removed."""
    import json

    import polars as pl

    from pipebubble.ingest import read_file
    from pipebubble.ingest.json import trace as jsontrace

    def x(i: int, name: str) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": i * 10.0, "dur": 5.0}

    events = [x(i, f"op{i}") for i in range(60)] + [x(60, '},{"ph": "X"' * 500)]
    events += [x(i, f"op{i}") for i in range(61, 110)]
    text = json.dumps({"traceEvents": events})
    path = tmp_path / "trace.json"
    path.write_text(text[:-40])  # the last event cut off
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 2_000)
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    monkeypatch.setattr("pipebubble.ingest.readers._json_splits", lambda p: True)
    spilled = read_file(path, use_cache=False, workers=1)
    table = pl.read_parquet(sorted(Path(spilled.meta["spill"]).glob("*.parquet")))
    assert spilled.meta["spans"] == table.height == 109 and table["start"].is_unique().all()
