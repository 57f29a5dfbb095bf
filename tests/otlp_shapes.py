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


# --- the other shapes vLLM's tracing writes, each of the same requests (``vllm_request``) ---
# Engine instants of request r (ms from its arrival A): queued A + 2, scheduled A + 2 + queue, first token
# A + ttft − 3 (= scheduled + prefill), finished A + e2e − 3; the API layer's first response at A + ttft and
# its departure at A + e2e. So every shape gives the legacy span's queue, prefill, decode, TTFT and e2e.


def _attr(key: str, value) -> dict:
    kind = "doubleValue" if isinstance(value, float) else "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def engine_instants(r: dict) -> dict[str, int]:
    """The engine's instants of request ``r`` (epoch ns; see above)."""
    queued = r["arrival"] + 2 * MS
    return {"QUEUED": queued, "SCHEDULED": queued + r["queue"], "FIRST_TOKEN": r["arrival"] + r["ttft"] - 3 * MS,
            "FINISHED": r["arrival"] + r["e2e"] - 3 * MS}


def genai_span(r: dict) -> dict:
    """``r`` under ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``: named ``"{operation} {model}"``,
    ``gen_ai.operation.name``, tokens as ``input_tokens`` / ``output_tokens``, the id as ``gen_ai.response.id``."""
    span = otlp_span(r)
    renamed = {"gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens", "gen_ai.request.id": "gen_ai.response.id",
               "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens"}
    attributes = [a | {"key": renamed.get(a["key"], a["key"])} for a in span["attributes"]]
    attributes += [_attr("gen_ai.operation.name", "text_completion"),
                   _attr("gen_ai.request.model", "facebook/opt-125m")]
    return span | {"name": "text_completion facebook/opt-125m", "attributes": attributes}


def phase_spans(r: dict) -> list[dict]:
    """``r``'s ``llm_request`` span and its queue, prefill and decode child spans."""
    parent = otlp_span(r)
    at = engine_instants(r)
    bounds = {"vllm_queue": ("QUEUED", "SCHEDULED"), "vllm_prefill": ("SCHEDULED", "FIRST_TOKEN"),
              "vllm_decode": ("FIRST_TOKEN", "FINISHED")}
    children = [{"traceId": parent["traceId"], "spanId": f"{i + 1:02x}" + parent["spanId"][2:],
                 "parentSpanId": parent["spanId"], "name": name, "kind": 1, "startTimeUnixNano": str(at[a]),
                 "endTimeUnixNano": str(at[b]), "attributes": []} for i, (name, (a, b)) in enumerate(bounds.items())]
    return [parent, *children]


def _event(name: str, t: int, **progress: int) -> dict:
    return {"timeUnixNano": str(t), "name": name,
            "attributes": [_attr(k.replace("__", "."), v) for k, v in progress.items()]}


def journey_spans(r: dict, core_events: list[tuple[str, int, dict]] | None = None) -> list[dict]:
    """``r`` under journey tracing: the API span ``llm_request`` (its ``api.*`` events, no latency attributes)
    and its child ``llm_core`` with ``journey.*`` state events; ``core_events`` (name, ns, progress) replace
    the plain ones (QUEUED, SCHEDULED, FIRST_TOKEN, FINISHED)."""
    at = engine_instants(r)
    trace, api_id = f"{r['arrival']:032x}", f"{r['arrival'] % 2**64:016x}"
    core_id = f"{(r['arrival'] + 1) % 2**64:016x}"
    progress = {"QUEUED": {}, "SCHEDULED": {"prefill__done_tokens": 0}, "FIRST_TOKEN": {
        "prefill__done_tokens": r["prompt"], "decode__done_tokens": 1}, "FINISHED": {
        "prefill__done_tokens": r["prompt"], "decode__done_tokens": r["tokens"]}}
    plain = [(name, t, {"prefill__total_tokens": r["prompt"], **progress[name]}) for name, t in at.items()]
    events = [_event(f"journey.{name}", t, **p) for name, t, p in (core_events or plain)]
    api = [_event("api.ARRIVED", r["arrival"]), _event("api.HANDOFF_TO_CORE", r["arrival"] + MS),
           _event("api.FIRST_RESPONSE_FROM_CORE", r["arrival"] + r["ttft"]),
           _event("api.DEPARTED", r["arrival"] + r["e2e"])]
    api_span = {"traceId": trace, "spanId": api_id, "name": "llm_request", "kind": 2,
                "startTimeUnixNano": str(r["arrival"]), "endTimeUnixNano": str(r["arrival"] + r["e2e"] + MS),
                "attributes": [_attr("gen_ai.request.id", r["id"])], "events": api}
    core = {"traceId": trace, "spanId": core_id, "parentSpanId": api_id, "name": "llm_core", "kind": 1,
            "startTimeUnixNano": str(at["QUEUED"]), "endTimeUnixNano": str(at["FINISHED"]), "attributes": [],
            "events": events}
    return [api_span, core]


def step_span(steps: list[dict]) -> dict:
    """The long ``scheduler_steps`` span with one ``step.BATCH_SUMMARY`` event per step (each a dict of its
    attributes by vLLM's names) and a ``step.REQUEST_SNAPSHOT`` that is left out."""
    events = [{"timeUnixNano": str(s["step.ts_end_ns"]), "name": "step.BATCH_SUMMARY",
               "attributes": [_attr(k, v) for k, v in s.items()]} for s in steps]
    events.append({"timeUnixNano": str(steps[-1]["step.ts_end_ns"]), "name": "step.REQUEST_SNAPSHOT",
                   "attributes": [_attr("request.id", "cmpl-0")]})
    return {"traceId": "ef" * 16, "spanId": "12" * 8, "name": "scheduler_steps", "kind": 1,
            "startTimeUnixNano": str(T0), "attributes": [], "events": events}


def batch_summary(step: int, start: int, dur: int, kv: float, waiting: int, prefill: int, decode: int,
                  preempted: int = 0) -> dict:
    """One step's ``step.BATCH_SUMMARY`` attributes."""
    return {"step.id": step, "step.ts_start_ns": start, "step.ts_end_ns": start + dur, "step.duration_us": dur // 1000,
            "queue.running_depth": 4, "queue.waiting_depth": waiting, "batch.num_prefill_reqs": int(prefill > 0),
            "batch.num_decode_reqs": 4, "batch.scheduled_tokens": prefill + decode, "batch.prefill_tokens": prefill,
            "batch.decode_tokens": decode, "batch.num_finished": 0, "batch.num_preempted": preempted,
            "kv.usage_gpu_ratio": kv, "kv.blocks_total_gpu": 1000, "kv.blocks_free_gpu": round(1000 * (1 - kv))}


def write_lines(path, spans: list[dict], per_line: int = 50) -> None:
    """``spans`` as OTLP JSON lines of ``per_line`` spans."""
    lines = [export_line(spans[i:i + per_line]) for i in range(0, len(spans), per_line)]
    path.write_text("\n".join(lines) + "\n")


def preempted_journey() -> tuple[list[dict], list[dict]]:
    """Three journey requests, preempted 0, 1 and 2 times, with their state events (ms from queued) and the
    step summaries of the engine every 5 ms (KV use rising 0.50 + 0.01 a step); the spans and the steps."""
    base = [vllm_request(i) for i in range(3)]
    plans = {
        0: [("QUEUED", 0, {}), ("SCHEDULED", 4, {}), ("FIRST_TOKEN", 24, {"prefill__done_tokens": 100}),
            ("FINISHED", 40, {"prefill__done_tokens": 100, "decode__done_tokens": 2})],
        1: [("QUEUED", 0, {}), ("SCHEDULED", 10, {}), ("FIRST_TOKEN", 20, {"prefill__done_tokens": 101}),
            ("PREEMPTED", 40, {"prefill__done_tokens": 101, "decode__done_tokens": 5}),
            ("SCHEDULED", 70, {"prefill__done_tokens": 101, "decode__done_tokens": 5}),
            ("FINISHED", 100, {"prefill__done_tokens": 101, "decode__done_tokens": 9})],
        2: [("QUEUED", 0, {}), ("SCHEDULED", 5, {}), ("PREEMPTED", 15, {"prefill__done_tokens": 50}),
            ("SCHEDULED", 35, {"prefill__done_tokens": 50}), ("PREEMPTED", 45, {"prefill__done_tokens": 80}),
            ("SCHEDULED", 85, {"prefill__done_tokens": 80}), ("FIRST_TOKEN", 95, {"prefill__done_tokens": 102}),
            ("FINISHED", 120, {"prefill__done_tokens": 102, "decode__done_tokens": 4})]}
    spans = []
    for r in base:
        queued = r["arrival"] + 2 * MS
        events = [(n, queued + ms * MS, p) for n, ms, p in plans[int(r["id"].split("-")[1])]]
        api, core = journey_spans(r, events)
        api["events"] = [api["events"][0]]  # ARRIVED only: TTFT and e2e from the engine's events and the span
        api["endTimeUnixNano"] = str(events[-1][1])
        spans += [api, core]
    steps = [batch_summary(k, T0 + 5 * k * MS, 4 * MS, round(0.5 + 0.01 * k, 2), waiting=k % 3,
                           prefill=512 if k % 4 == 0 else 0, decode=4) for k in range(40)]
    return spans, steps
