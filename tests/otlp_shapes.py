"""Request spans as vLLM's tracing writes them: OTLP JSON lines of ``llm_request`` spans (``write_vllm``), each
request's queue, prefill, TTFT, TPOT and end-to-end latency known, to check the request table against."""

from __future__ import annotations

import json

T0 = 1_700_000_000_000_000_000  # epoch ns
MS = 1_000_000


def vllm_request(i: int) -> dict:
    """Request ``i`` as vLLM's ``do_tracing`` would record it: queue i ms, prefill 20 ms, 5 ms elsewhere in
    TTFT, TPOT 10 + (i mod 50) ms over 2 + (i mod 7) output tokens, one every 20 ms."""
    queue, prefill, tokens = i * MS, 20 * MS, 2 + i % 7
    ttft = queue + prefill + 5 * MS
    e2e = ttft + (10 + i % 50) * MS * (tokens - 1)
    return {"id": f"cmpl-{i}", "arrival": T0 + i * 20 * MS, "queue": queue, "prefill": prefill, "ttft": ttft,
            "e2e": e2e, "decode": e2e - ttft, "prompt": 100 + i, "tokens": tokens}


def otlp_span(r: dict) -> dict:
    """The OTLP JSON of one ``llm_request`` span (seconds as doubles, counts as int64 strings)."""
    seconds = {"time_in_queue": r["queue"], "time_to_first_token": r["ttft"], "e2e": r["e2e"],
               "time_in_model_prefill": r["prefill"], "time_in_model_decode": r["decode"],
               "time_in_model_inference": r["prefill"] + r["decode"]}
    attributes = [
        {"key": "gen_ai.response.model", "value": {"stringValue": "facebook/opt-125m"}},
        {"key": "gen_ai.request.id", "value": {"stringValue": r["id"]}},
        {"key": "gen_ai.request.temperature", "value": {"doubleValue": 0.8}},
        {"key": "gen_ai.usage.prompt_tokens", "value": {"intValue": str(r["prompt"])}},
        {"key": "gen_ai.usage.completion_tokens", "value": {"intValue": str(r["tokens"])}},
        *({"key": f"gen_ai.latency.{k}", "value": {"doubleValue": ns / 1e9}} for k, ns in seconds.items()),
    ]
    return {"traceId": f"{r['arrival']:032x}", "spanId": f"{r['arrival'] % 2**64:016x}", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(r["arrival"]), "endTimeUnixNano": str(r["arrival"] + r["e2e"] + MS),
            "attributes": attributes, "status": {}}


def export_line(spans: list[dict]) -> str:
    """One ``ExportTraceServiceRequest`` as the file exporter writes it, with an HTTP span that is no request."""
    http = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "POST /v1/completions", "kind": 2,
            "startTimeUnixNano": str(T0), "endTimeUnixNano": str(T0 + MS), "attributes": []}
    return json.dumps({"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "vllm"}}]},
        "scopeSpans": [{"scope": {"name": "vllm.llm_engine"}, "spans": [*spans, http]}]}]})


def write_vllm(path, n: int = 300, per_line: int = 50) -> list[dict]:
    """``n`` requests as OTLP JSON lines of ``per_line`` spans; the requests as written."""
    requests = [vllm_request(i) for i in range(n)]
    lines = [export_line([otlp_span(r) for r in requests[i:i + per_line]]) for i in range(0, n, per_line)]
    path.write_text("\n".join(lines) + "\n")
    return requests
