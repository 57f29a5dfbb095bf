"""Traces too big for memory: spans spilled to Parquet give the same report as spans held in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import shared

from pipebubble.ingest import cache
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "where",
    [("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), ("pipeline_cpu", "gpipe"), "serve_chunked_prefill"],
    ids=["one-gpu-rank", "pipeline-folder", "serving"],
)
def test_spilled_report_equals_in_memory(where, monkeypatch):
    path = ROOT / "sample_traces" / where if isinstance(where, str) else shared(*where)
    in_memory = run([path], Options(), Scale(use_cache=False)).to_dict()
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    spilled = run([path], Options(), Scale(use_cache=True))
    assert list((cache.directory() / "spill").iterdir())
    assert spilled.to_dict() == in_memory
    again = run([path], Options(), Scale(use_cache=True))  # from the cache: the spill folders are reused
    assert again.to_dict() == in_memory
