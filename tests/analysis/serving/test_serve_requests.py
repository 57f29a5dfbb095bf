"""Request events: the bundled serve workload writes them into its trace (``capture/workloads/serve.py``) and
``analysis.requests_from_trace`` reads them back as the request table, each request's engine steps and the
KV-cache occupancy: on fresh captures, on the committed samples and on hand-built span tables."""

from __future__ import annotations

import argparse

import polars as pl
import pytest

from pipebubble import requests_table
from pipebubble.analysis.serving.requests_from_trace import KV_SCHEMA, STEP_SCHEMA, requests_from_trace
from pipebubble.ingest import load
from pipebubble.spans import conform, empty
from tests.conftest import ROOT

#: Request-table columns an engine's own request events do not say (preemptions and phases): null.
UNSAID = ("preemptions", "requeue_ns", "lost_tokens", "intervals")

LANE = "rank0/cpu/1"


def sent(requests: int, rate: float) -> dict[str, tuple[int, int]]:
    """Request id → (prompt tokens, output tokens) of the requests the serve workload sends (seed 0)."""
    pytest.importorskip("numpy", reason="the serve workload needs numpy")
    from pipebubble.capture.workloads.serve import make_requests

    args = argparse.Namespace(requests=requests, arrival_rate=rate, seed=0)
    return {str(r.slot): (len(r.prompt), r.max_new) for r in make_requests(args)}


def read(folder) -> pl.DataFrame:
    return load(sorted(folder.glob("*.json.gz"))).spans


def check_served(spans: pl.DataFrame, expected: dict[str, tuple[int, int]]) -> None:
    """Every request sent, each once, with its tokens; queue ≤ TTFT ≤ e2e; a prefill of its whole prompt and
    a decode for each token after the first, each in an engine step; its KV-cache blocks given and released."""
    from pipebubble.capture.workloads.serve import BLOCK_TOKENS

    found = requests_from_trace(spans)
    table = found.requests
    assert sorted(table["request_id"]) == sorted(expected)
    assert table.drop(*UNSAID).null_count().sum_horizontal().item() == 0
    assert {r: (p, n) for r, p, n in table.select("request_id", "prompt_tokens", "completion_tokens").rows()} \
        == expected
    assert ((0 <= table["queue_ns"]) & (table["queue_ns"] <= table["ttft_ns"])
            & (table["ttft_ns"] <= table["e2e_ns"])).all()
    assert (table["prefill_ns"] + table["queue_ns"] == table["ttft_ns"]).all()
    per = found.steps.group_by("request_id").agg(
        prompt=pl.col("tokens").filter(pl.col("phase") == "prefill").sum(),
        decodes=(pl.col("phase") == "decode").sum(),
        unplaced=pl.col("step_start").is_null().sum(),
        prefill_in_prefill_step=pl.col("step_has_prefill").filter(pl.col("phase") == "prefill").all())
    assert {r: (p, d + 1) for r, p, d in per.select("request_id", "prompt", "decodes").rows()} == expected
    assert per["unplaced"].sum() == 0 and per["prefill_in_prefill_step"].all()
    kv = found.kv
    moved = pl.when(pl.col("event") == "kv_alloc").then(pl.col("blocks")).otherwise(-pl.col("blocks"))
    assert kv["blocks_used"].to_list() == kv.select(moved.cum_sum())["blocks"].to_list()
    assert kv["blocks_used"][-1] == 0
    held = kv.filter(pl.col("event") == "kv_free").select("request_id", "blocks").rows()
    assert dict(held) == {r: -(-(p + n - 1) // BLOCK_TOKENS) for r, (p, n) in expected.items()}


@pytest.mark.slow
@pytest.mark.parametrize("chunk, async_steps", [(0, False), (64, False), (64, True)],
                         ids=["whole-prompts", "chunked", "chunked-async"])
def test_a_serve_capture_yields_every_request_it_served(tmp_path, chunk, async_steps):
    """Four requests, one every other engine step (with 64-token chunks, the later ones queue behind the first
    prompt's prefill)."""
    pytest.importorskip("torch", reason="capture needs torch")
    from pipebubble.capture import CaptureOptions, capture
    from pipebubble.capture.workloads import WorkloadSettings, workload_command

    settings = WorkloadSettings(requests=4, arrival_rate=0.5, chunked_prefill=chunk, async_steps=async_steps)
    options = CaptureOptions(out=tmp_path / "out", profile_memory=False)
    command, about, options = workload_command("serve", settings, options)
    assert capture(command, options, about).exit_code == 0
    check_served(read(tmp_path / "out"), sent(4, 0.5))


@pytest.mark.parametrize("folder", ["serve", "serve_chunked_prefill"])
def test_the_committed_serve_samples_carry_their_requests(folder):
    check_served(read(ROOT / "sample_traces" / folder), sent(32, 0.25))


def mark(name: str, at: float, end: float | None = None) -> dict:
    """An annotation on the engine thread at ``at`` ms (a request event: 1 µs long unless ``end`` is given)."""
    start = int(at * 1_000_000)
    return {"source": "t.json", "rank": 0, "pid": 1, "tid": 1, "lane": LANE, "kind": "annotation", "name": name,
            "start": start, "end": int(end * 1_000_000) if end is not None else start + 1000}


def test_hand_built_events_give_exact_instants_and_nulls_where_unsaid():
    spans = conform(pl.DataFrame([
        mark("request:arrival id=req-7 prompt=5", 1), mark("request:arrival id=8 prompt=3", 2),
        mark("execute_context_2(8)_generation_0(0)", 3, 5), mark("request:scheduled id=req-7", 3.1),
        mark("request:kv_alloc id=req-7 blocks=1 used=1", 3.2), mark("request:prefill id=req-7 tokens=5", 3.3),
        mark("request:scheduled id=8", 3.4), mark("request:prefill id=8 tokens=3", 3.5),
        mark("request:first_token id=req-7", 5.5), mark("request:first_token id=8", 5.6),
        mark("execute_context_0(0)_generation_2(2)", 6, 7), mark("request:decode id=req-7", 6.1),
        mark("request:decode id=8", 6.2), mark("request:decode id=req-7", 8),  # outside every step
        mark("request:kv_free id=req-7 blocks=1 used=0", 9), mark("request:completion id=req-7 tokens=3", 9.5),
        mark("request:bogus", 10), mark("requests: not an event id=1", 10)]))
    found = requests_from_trace(spans)
    ms = 1_000_000
    assert found.requests.columns == list(requests_table.SCHEMA)
    assert found.requests.drop("source", *UNSAID).rows() == [
        ("req-7", 1 * ms, 3.1 * ms, 5.5 * ms, 9.5 * ms, 2.1 * ms, 4.5 * ms, 8.5 * ms, 2.4 * ms, 4 * ms, 5, 3),
        ("8", 2 * ms, 3.4 * ms, 5.6 * ms, None, 1.4 * ms, 3.6 * ms, None, 2.2 * ms, None, 3, None)]
    assert found.steps.select("request_id", "phase", "tokens", "step_start", "step_end", "step_has_prefill").rows() == [
        ("req-7", "prefill", 5, 3 * ms, 5 * ms, True), ("8", "prefill", 3, 3 * ms, 5 * ms, True),
        ("req-7", "decode", 1, 6 * ms, 7 * ms, False), ("8", "decode", 1, 6 * ms, 7 * ms, False),
        ("req-7", "decode", 1, None, None, None)]
    assert found.kv.select("t", "request_id", "event", "blocks", "blocks_used").rows() == [
        (3.2 * ms, "req-7", "kv_alloc", 1, 1), (9 * ms, "req-7", "kv_free", 1, 0)]


@pytest.mark.parametrize("table", [empty(), conform(pl.DataFrame([mark("x", 1)]))], ids=["empty", "one-span"])
def test_a_table_without_request_events_gives_empty_frames(table):
    found = requests_from_trace(table)
    assert found.requests.is_empty() and found.requests.schema == requests_table.empty().schema
    assert found.steps.is_empty() and dict(found.steps.schema) == STEP_SCHEMA
    assert found.kv.is_empty() and dict(found.kv.schema) == KV_SCHEMA
