"""Every shape of request spans vLLM's tracing writes (legacy ``llm_request``, GenAI conventions, phase child
spans, journey tracing's ``llm_core`` events, step tracing's summaries) and SGLang's request tracing, each built
as vLLM's and SGLang's own tests build them (``otlp_shapes`` names the files and commits), in OTLP and Jaeger
JSON, read to the same per-request figures where they carry the same facts; preemptions and their requeue
waits exactly."""

from __future__ import annotations

import json

import polars as pl
import pytest
from otlp_shapes import (
    MS,
    T0,
    batch_summary,
    engine_instants,
    genai_renamed_span,
    genai_span,
    journey_spans,
    legacy_phase_spans,
    otlp_span,
    phase_spans,
    preempted_journey,
    preempted_phase_spans,
    sglang_spans,
    step_span,
    vllm_request,
    write_lines,
)

from pipebubble import requests_table
from pipebubble.ingest import read_file, readers

SAME = ("request_id", "arrival", "queue_ns", "ttft_ns", "e2e_ns", "prefill_ns", "decode_ns", "prompt_tokens",
        "completion_tokens")
SHAPES = {
    "legacy": lambda r: [otlp_span(r)],
    "genai": lambda r: [genai_span(r)],
    "genai_renamed": lambda r: [genai_renamed_span(r)],
    "phase_legacy_names": legacy_phase_spans,
    "journey": journey_spans,
}
#: How much earlier the engine's first token is than the API layer's (``otlp_shapes.engine_instants``): the
#: first token of shapes without an API-layer TTFT (vLLM's lifecycle spans, SGLang's).
ENGINE_LAG = 3 * MS


def _read(tmp_path, name: str, spans: list[dict], use_cache: bool = False):
    path = tmp_path / f"{name}.json"
    write_lines(path, spans)
    return read_file(path, use_cache=use_cache)


@pytest.fixture(scope="module")
def sent():
    return [vllm_request(i) for i in range(60)]


def _expected(sent: list[dict], lag: int = 0, tokens: bool = True) -> pl.DataFrame:
    return pl.DataFrame({"request_id": [r["id"] for r in sent], "arrival": [r["arrival"] for r in sent],
                         "queue_ns": [r["queue"] for r in sent], "ttft_ns": [r["ttft"] - lag for r in sent],
                         "e2e_ns": [r["e2e"] for r in sent], "prefill_ns": [r["prefill"] for r in sent],
                         "decode_ns": [r["decode"] for r in sent],
                         "prompt_tokens": [r["prompt"] if tokens else None for r in sent],
                         "completion_tokens": [r["tokens"] if tokens else None for r in sent]},
                        schema={c: pl.String if c == "request_id" else pl.Int64 for c in SAME})


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_shape_gives_the_legacy_figures(tmp_path, sent, shape):
    spans = [s for r in sent for s in SHAPES[shape](r)]
    result = _read(tmp_path, shape, spans)
    table = result.requests
    assert dict(table.schema) == requests_table.SCHEMA and table.height == len(sent)
    lines = -(-len(spans) // 50)  # each line's HTTP span is no request
    assert result.skipped == {"not_a_request": lines} and result.warnings == []
    assert table.select(SAME).sort("arrival").equals(_expected(sent))


def test_lifecycle_phase_spans_give_the_engine_figures(tmp_path, sent):
    """vLLM's ``vllm.request.*`` spans under an ``llm_request`` that states no latency: queue, prefill, decode
    and e2e as the legacy span states them, TTFT to the engine's first token (the prefill span's end)."""
    result = _read(tmp_path, "phase", [s for r in sent for s in phase_spans(r)])
    assert result.skipped == {"not_a_request": -(-4 * len(sent) // 50)} and result.warnings == []
    assert result.requests.select(SAME).sort("arrival").equals(_expected(sent, ENGINE_LAG))


def test_sglang_request_tracing_gives_the_engine_figures(tmp_path, sent):
    """SGLang's ``Req`` root, thread spans and stage slices: the request id is its ``rid``; queue from
    ``prefill_waiting``, prefill from ``prefill_forward``, decode to the last ``decode_loop``; no token counts."""
    spans = [s for r in sent for s in sglang_spans(r)]
    result = _read(tmp_path, "sglang", spans)
    table = result.requests.sort("arrival")
    rids = [f"{r['arrival'] % 2**64:016x}{r['id']}" for r in sent]
    assert table["request_id"].to_list() == rids
    expected = _expected(sent, ENGINE_LAG, tokens=False).with_columns(request_id=pl.Series(rids))
    assert table.select(SAME).equals(expected)
    # tokenize, dispatch and request_process slices are no phase; each line's HTTP span is no request
    assert result.skipped == {"not_a_request": 3 * len(sent) + -(-len(spans) // 50)}
    row, r = table.row(0, named=True), sent[0]
    at = {k: v - r["arrival"] for k, v in engine_instants(r).items()}
    assert [i["phase"] for i in row["intervals"]] == ["queue", "prefill"] + ["decode"] * (r["tokens"] - 1)
    assert (row["intervals"][0]["start"], row["intervals"][1]["start"], row["intervals"][-1]["end"]) == (
        at["QUEUED"], at["SCHEDULED"], at["FINISHED"])
    assert (row["preemptions"], row["requeue_ns"], row["lost_tokens"]) == (0, 0, None)


def test_a_preempted_lifecycle_span_waits_until_the_next_run(tmp_path, sent):
    """``Request.trace_preempt`` ends the running span ``preempted``: the time to the next run span is a requeue
    wait, and the request's decode still runs from its first token to its last span's end."""
    r = sent[5]
    table = _read(tmp_path, "preempt", preempted_phase_spans(r, preempt_ms=4, resume_ms=10)).requests
    row = table.row(0, named=True)
    at = {k: v - r["arrival"] for k, v in engine_instants(r).items()}
    assert [(i["phase"], i["start"], i["end"]) for i in row["intervals"]] == [
        ("queue", at["QUEUED"], at["SCHEDULED"]), ("prefill", at["SCHEDULED"], at["FIRST_TOKEN"]),
        ("decode", at["FIRST_TOKEN"], at["FIRST_TOKEN"] + 4 * MS),
        ("requeue", at["FIRST_TOKEN"] + 4 * MS, at["FIRST_TOKEN"] + 10 * MS),
        ("decode", at["FIRST_TOKEN"] + 10 * MS, at["FINISHED"])]
    assert (row["preemptions"], row["requeue_ns"]) == (1, 6 * MS)
    assert (row["queue_ns"], row["prefill_ns"], row["decode_ns"]) == (r["queue"], r["prefill"], r["decode"])


@pytest.mark.parametrize("shape", ["phase", "phase_legacy_names", "journey"])
def test_phases_from_child_spans_and_from_events_are_the_same(tmp_path, sent, shape):
    make = {"phase": phase_spans, **SHAPES}[shape]
    table = _read(tmp_path, shape, [s for r in sent for s in make(r)]).requests.sort("arrival")
    for row, r in zip(table.iter_rows(named=True), sent, strict=True):
        at = {k: v - r["arrival"] for k, v in engine_instants(r).items()}
        assert row["intervals"] == [{"phase": "queue", "start": at["QUEUED"], "end": at["SCHEDULED"]},
                                    {"phase": "prefill", "start": at["SCHEDULED"], "end": at["FIRST_TOKEN"]},
                                    {"phase": "decode", "start": at["FIRST_TOKEN"], "end": at["FINISHED"]}]
        assert row["scheduled"] == r["arrival"] + at["SCHEDULED"]
        assert (row["preemptions"], row["requeue_ns"]) == (0, 0)
    assert table["lost_tokens"].to_list() == ([0] * len(sent) if shape == "journey" else [None] * len(sent))


def test_legacy_spans_leave_preemptions_unknown(tmp_path, sent):
    table = _read(tmp_path, "legacy", [otlp_span(r) for r in sent]).requests
    assert table["preemptions"].null_count() == len(sent) and table["intervals"].null_count() == len(sent)


def test_preempted_once_and_twice_exactly(tmp_path):
    spans, steps = preempted_journey()
    result = _read(tmp_path, "preempted", [*spans, step_span(steps)])
    rows = {r["request_id"]: r for r in result.requests.iter_rows(named=True)}
    once, twice = rows["cmpl-1"], rows["cmpl-2"]
    # ms from arrival: queued at 2, then the plan's instants (otlp_shapes.preempted_journey)
    assert [(i["phase"], i["start"] // MS, i["end"] // MS) for i in once["intervals"]] == [
        ("queue", 2, 12), ("prefill", 12, 22), ("decode", 22, 42), ("requeue", 42, 72), ("decode", 72, 102)]
    assert [(i["phase"], i["start"] // MS, i["end"] // MS) for i in twice["intervals"]] == [
        ("queue", 2, 7), ("prefill", 7, 17), ("requeue", 17, 37), ("prefill", 37, 47), ("requeue", 47, 87),
        ("prefill", 87, 97), ("decode", 97, 122)]
    assert (once["preemptions"], once["requeue_ns"], once["lost_tokens"]) == (1, 30 * MS, 101 + 5)
    assert (twice["preemptions"], twice["requeue_ns"], twice["lost_tokens"]) == (2, 60 * MS, 50 + 80)
    assert (rows["cmpl-0"]["preemptions"], rows["cmpl-0"]["requeue_ns"], rows["cmpl-0"]["lost_tokens"]) == (0, 0, 0)
    # vLLM's definitions hold through preemptions: queue = the first wait, prefill = first token − scheduled
    assert (twice["queue_ns"], twice["prefill_ns"], twice["ttft_ns"]) == (5 * MS, 90 * MS, 97 * MS)
    assert (once["prefill_ns"], once["decode_ns"], once["completion_tokens"]) == (10 * MS, 80 * MS, 9)


def test_step_summaries_become_the_step_table(tmp_path):
    steps = [batch_summary(k, T0 + 5 * k * MS, 4 * MS, 0.25, waiting=k, prefill=100 * k, decode=8) for k in (3, 7)]
    result = _read(tmp_path, "steps", [step_span(steps)])
    table = result.request_steps
    assert dict(table.schema) == requests_table.STEP_SCHEMA and result.requests.is_empty()
    assert result.skipped == {"request_snapshot": 1, "not_a_request": 1}
    assert table.rows() == [(3, T0 + 15 * MS, T0 + 19 * MS, 3, 4, 1, 4, 300, 8, 308, 0, 0, 0.25, 1000, 750),
                            (7, T0 + 35 * MS, T0 + 39 * MS, 7, 4, 1, 4, 700, 8, 708, 0, 0, 0.25, 1000, 750)]


def test_a_step_on_another_clock_ends_at_its_event(tmp_path):
    step = batch_summary(1, 5_000_000_000, 4 * MS, 0.5, waiting=0, prefill=0, decode=8)  # a monotonic clock
    span = step_span([step])
    span["events"][0]["timeUnixNano"] = str(T0)
    table = _read(tmp_path, "mono", [span]).request_steps
    assert table.select("start", "end").row(0) == (T0 - 4 * MS, T0)


def test_steps_and_requests_come_back_from_the_cache(tmp_path):
    spans, steps = preempted_journey()
    fresh = _read(tmp_path, "cached", [*spans, step_span(steps)], use_cache=True)
    cached = read_file(tmp_path / "cached.json")
    assert cached.requests.equals(fresh.requests) and cached.request_steps.equals(fresh.request_steps)


def _jaeger(spans: list[dict]) -> dict:
    """OTLP spans as Jaeger's query service writes them (µs, tags, references, logs)."""
    def tags(attrs):
        out = []
        for a in attrs:
            (kind, value), = a["value"].items()
            typ = {"doubleValue": "float64", "intValue": "int64", "stringValue": "string"}[kind]
            out.append({"key": a["key"], "type": typ, "value": int(value) if typ == "int64" else value})
        return out

    def span(s):
        refs = [{"refType": "CHILD_OF", "traceID": s["traceId"], "spanID": s["parentSpanId"]}] if s.get(
            "parentSpanId") else []
        start = int(s["startTimeUnixNano"]) // 1000
        logs = [{"timestamp": int(e["timeUnixNano"]) // 1000, "fields": [
            {"key": "event", "type": "string", "value": e["name"]}, *tags(e["attributes"])]}
            for e in s.get("events", [])]
        return {"traceID": s["traceId"], "spanID": s["spanId"], "operationName": s["name"], "references": refs,
                "startTime": start, "duration": int(s["endTimeUnixNano"]) // 1000 - start,
                "tags": tags(s["attributes"]), "logs": logs}

    return {"data": [{"traceID": "t", "spans": [span(s) for s in spans], "processes": {}}]}


def test_jaeger_journey_gives_the_same_figures(tmp_path, sent):
    path = tmp_path / "journey.jaeger.json"
    path.write_text(json.dumps(_jaeger([s for r in sent for s in journey_spans(r)])))
    assert readers.reader_for(path).name == "jaeger"
    jaeger = read_file(path, use_cache=False).requests.sort("arrival")
    otlp = _read(tmp_path, "journey", [s for r in sent for s in journey_spans(r)]).requests.sort("arrival")
    assert jaeger.drop("source").equals(otlp.drop("source"))  # every instant here is a whole µs
