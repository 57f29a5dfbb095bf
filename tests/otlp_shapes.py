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


# Where each shape below is taken from (vLLM's and SGLang's own tests and tracing modules):
# - legacy: vllm-project/vllm tests/tracing/test_tracing.py @ fb6c0501838195b3f6d715e5a1cf0be42546d27a (the
#   attributes it asserts on the one ``llm_request`` span) with the V1 latencies of vllm/tracing/__init__.py's
#   SpanAttributes @ bef65387bad4bddbca2b720ea0402500596c10c2;
# - GenAI conventions: vllm-project/vllm tests/tracing/test_gen_ai_semconv.py @
#   2b1064819ee7c4dda60c7f9fef360efa46f6c450 (``latest_gen_ai_semconv_attributes``: the legacy attributes plus
#   ``gen_ai.operation.name`` / ``gen_ai.request.model``, the span named "{operation} {model}");
# - phase spans: vllm-project/vllm tests/tracing/test_request_lifecycle_tracing.py @
#   8d1fa3c4c8cd977eb955c609898e7a21a79ae7c8 (``vllm.request.queue|prefill|decode`` children of ``llm_request``,
#   which carries only the id and the token counts; ``preempted`` / ``aborted`` flags on a cut-short span);
# - journey: vllm-project/vllm tests/v1/core/test_journey_tracing_spans.py @
#   24fe5bbb1ef0cda5aa41fda5bab6b208ff8edfa7 and tests/v1/core/test_journey_events.py @
#   a8f3dfc2b66eb371f31ffb1e159dfbaba2b1d5b4 (``llm_core`` carries ``gen_ai.request.id``; ``journey.*`` events
#   with the progress snapshot, ``scheduler.step``, ``finish.status`` and a monotonic time);
# - step tracing: vllm-project/vllm tests/v1/core/test_step_tracing.py @ 4c1afa8f552016dcf67cfd75a1c2cef28fd6d9bc
#   (``step.BATCH_SUMMARY`` on ``scheduler_steps``, every count an int, ``kv.usage_gpu_ratio`` a float);
# - SGLang: sgl-project/sglang python/sglang/srt/tracing/trace.py @ bad7b92eb04300e1ce398d1fa470f82e22ecb763
#   (root ``Req <rid[:8]>``, a span per thread, slices under it) and the stage names of
#   python/sglang/srt/tracing/trace_metric_wrapper.py @ 386d28b24f1969661bfbfc291030e180416da1f0.


def otlp_span(r: dict) -> dict:
    """The OTLP JSON of one ``llm_request`` span (seconds as doubles, counts as int64 strings), with the
    attributes vLLM's ``test_traces`` asserts."""
    seconds = {"time_in_queue": r["queue"], "time_to_first_token": r["ttft"], "e2e": r["e2e"],
               "time_in_model_prefill": r["prefill"], "time_in_model_decode": r["decode"],
               "time_in_model_inference": r["prefill"] + r["decode"]}
    attributes = [
        {"key": "gen_ai.response.model", "value": {"stringValue": "facebook/opt-125m"}},
        {"key": "gen_ai.request.id", "value": {"stringValue": r["id"]}},
        {"key": "gen_ai.request.temperature", "value": {"doubleValue": 0.01}},
        {"key": "gen_ai.request.top_p", "value": {"doubleValue": 0.1}},
        {"key": "gen_ai.request.max_tokens", "value": {"intValue": "256"}},
        {"key": "gen_ai.request.n", "value": {"intValue": "1"}},
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
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    kind = "doubleValue" if isinstance(value, float) else "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def engine_instants(r: dict) -> dict[str, int]:
    """The engine's instants of request ``r`` (epoch ns; see above)."""
    queued = r["arrival"] + 2 * MS
    return {"QUEUED": queued, "SCHEDULED": queued + r["queue"], "FIRST_TOKEN": r["arrival"] + r["ttft"] - 3 * MS,
            "FINISHED": r["arrival"] + r["e2e"] - 3 * MS}


def genai_span(r: dict, operation: str = "chat", model: str = "facebook/opt-125m") -> dict:
    """``r`` under ``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental`` as vLLM writes it: the legacy
    attributes (``gen_ai.response.model`` is no longer emitted) plus ``gen_ai.operation.name`` and
    ``gen_ai.request.model``, the span named ``"{operation} {model}"``."""
    span = otlp_span(r)
    attributes = [a for a in span["attributes"] if a["key"] != "gen_ai.response.model"]
    attributes += [_attr("gen_ai.request.model", model), _attr("gen_ai.operation.name", operation)]
    return span | {"name": f"{operation} {model}", "attributes": attributes}


def genai_renamed_span(r: dict) -> dict:
    """``r`` with the GenAI conventions' usage and id names (``input_tokens`` / ``output_tokens``,
    ``gen_ai.response.id``), as other instrumentations write them."""
    span = genai_span(r, "text_completion")
    renamed = {"gen_ai.usage.prompt_tokens": "gen_ai.usage.input_tokens", "gen_ai.request.id": "gen_ai.response.id",
               "gen_ai.usage.completion_tokens": "gen_ai.usage.output_tokens"}
    return span | {"attributes": [a | {"key": renamed.get(a["key"], a["key"])} for a in span["attributes"]]}


def _children(parent: dict, spans: list[tuple[str, int, int, list[dict]]]) -> list[dict]:
    """Child spans of ``parent``: (name, start, end, attributes) each."""
    return [{"traceId": parent["traceId"], "spanId": f"{i + 1:02x}" + parent["spanId"][2:],
             "parentSpanId": parent["spanId"], "name": name, "kind": 1, "startTimeUnixNano": str(a),
             "endTimeUnixNano": str(b), "attributes": attrs} for i, (name, a, b, attrs) in enumerate(spans)]


def phase_spans(r: dict, names: tuple[str, str, str] = ("vllm.request.queue", "vllm.request.prefill",
                                                        "vllm.request.decode")) -> list[dict]:
    """``r`` as vLLM's request lifecycle tracing writes it: the root ``llm_request`` (SERVER, from the arrival to
    the end, only the id and token counts set) and its queue, prefill and decode child spans."""
    at = engine_instants(r)
    root = {"traceId": f"{r['arrival']:032x}", "spanId": f"{r['arrival'] % 2**64:016x}", "name": "llm_request",
            "kind": 2, "startTimeUnixNano": str(r["arrival"]), "endTimeUnixNano": str(r["arrival"] + r["e2e"]),
            "attributes": [_attr("gen_ai.request.id", r["id"]), _attr("gen_ai.usage.prompt_tokens", r["prompt"]),
                           _attr("gen_ai.usage.completion_tokens", r["tokens"])]}
    bounds = [("QUEUED", "SCHEDULED"), ("SCHEDULED", "FIRST_TOKEN"), ("FIRST_TOKEN", "FINISHED")]
    return [root, *_children(root, [(n, at[a], at[b], []) for n, (a, b) in zip(names, bounds, strict=True)])]


def legacy_phase_spans(r: dict) -> list[dict]:
    """``r``'s full ``llm_request`` span and phase children under the older ``vllm_*`` names."""
    parent = otlp_span(r)
    return [parent, *phase_spans(r, ("vllm_queue", "vllm_prefill", "vllm_decode"))[1:]]


def preempted_phase_spans(r: dict, preempt_ms: int, resume_ms: int) -> list[dict]:
    """``r``'s lifecycle spans with its decode preempted ``preempt_ms`` after the first token and resumed
    ``resume_ms`` after it (``Request.trace_preempt``: the decode span ends ``preempted``; a new one opens when it
    runs again), its last decode span ended by an abort (``aborted``)."""
    root, queue, prefill, _ = phase_spans(r)
    at = engine_instants(r)
    cut, back = at["FIRST_TOKEN"] + preempt_ms * MS, at["FIRST_TOKEN"] + resume_ms * MS
    decodes = _children(root, [("vllm.request.decode", at["FIRST_TOKEN"], cut, [_attr("preempted", True)]),
                               ("vllm.request.decode", back, at["FINISHED"], [_attr("aborted", True)])])
    for i, span in enumerate(decodes):
        span["spanId"] = f"{i + 0xa0:02x}" + root["spanId"][2:]
    return [root, queue, prefill, *decodes]


def _event(name: str, t: int, **attributes) -> dict:
    return {"timeUnixNano": str(t), "name": name,
            "attributes": [_attr(k.replace("__", "."), v) for k, v in attributes.items()]}


def _monotonic(t: int) -> float:
    """An instant on the monotonic clock vLLM also records (``ts.monotonic``): another origin, never read."""
    return (t - T0) / 1e9 + 1000.0


def _journey_events(r: dict, events: list[tuple[str, int, dict]]) -> list[dict]:
    """``journey.*`` events as vLLM's scheduler adds them to ``llm_core``: the progress snapshot
    (``prefill.done_tokens`` / ``prefill.total_tokens`` / ``decode.done_tokens`` / ``decode.max_tokens``), the
    phase, the preemptions so far, the scheduler step (0 before the first schedule), ``schedule.kind`` on
    ``SCHEDULED`` and ``finish.status`` on ``FINISHED``, and ``ts.monotonic``."""
    out, preemptions = [], 0
    for step, (name, t, progress) in enumerate(events):
        done = {"prefill__done_tokens": 0, "decode__done_tokens": 0, **progress}
        extra = {"schedule__kind": "RESUME" if preemptions else "FIRST"} if name == "SCHEDULED" else {
            "finish__status": "stopped"} if name == "FINISHED" else {}
        out.append(_event(f"journey.{name}", t, event__type=name, ts__monotonic=_monotonic(t),
                          phase="DECODE" if done["decode__done_tokens"] else "PREFILL",
                          prefill__total_tokens=r["prompt"], decode__max_tokens=256, num_preemptions=preemptions,
                          scheduler__step=step, **done, **extra))
        preemptions += name == "PREEMPTED"
    return out


def journey_spans(r: dict, core_events: list[tuple[str, int, dict]] | None = None) -> list[dict]:
    """``r`` under journey tracing: the API span ``llm_request`` (its ``api.*`` events with
    ``event.ts.monotonic``, the prompt and max tokens, no latency attributes) and its child ``llm_core`` (the
    request id) with ``journey.*`` state events; ``core_events`` (name, ns, progress) replace the plain ones
    (QUEUED, SCHEDULED, FIRST_TOKEN, FINISHED)."""
    at = engine_instants(r)
    trace, api_id = f"{r['arrival']:032x}", f"{r['arrival'] % 2**64:016x}"
    core_id = f"{(r['arrival'] + 1) % 2**64:016x}"
    progress = {"QUEUED": {}, "SCHEDULED": {}, "FIRST_TOKEN": {"prefill__done_tokens": r["prompt"],
                                                                "decode__done_tokens": 1},
                "FINISHED": {"prefill__done_tokens": r["prompt"], "decode__done_tokens": r["tokens"]}}
    plain = [(name, t, progress[name]) for name, t in at.items()]
    api = [_event(f"api.{name}", t, event__ts__monotonic=_monotonic(t)) for name, t in (
        ("ARRIVED", r["arrival"]), ("HANDOFF_TO_CORE", r["arrival"] + MS),
        ("FIRST_RESPONSE_FROM_CORE", r["arrival"] + r["ttft"]), ("DEPARTED", r["arrival"] + r["e2e"]))]
    api_span = {"traceId": trace, "spanId": api_id, "name": "llm_request", "kind": 2,
                "startTimeUnixNano": str(r["arrival"]), "endTimeUnixNano": str(r["arrival"] + r["e2e"] + MS),
                "attributes": [_attr("gen_ai.usage.prompt_tokens", r["prompt"]),
                               _attr("gen_ai.request.max_tokens", 256)], "events": api}
    core = {"traceId": trace, "spanId": core_id, "parentSpanId": api_id, "name": "llm_core", "kind": 1,
            "startTimeUnixNano": str(at["QUEUED"]), "endTimeUnixNano": str(at["FINISHED"]),
            "attributes": [_attr("gen_ai.request.id", r["id"])], "events": _journey_events(r, core_events or plain)}
    return [api_span, core]


def sglang_spans(r: dict) -> list[dict]:
    """``r`` as SGLang's request tracing writes it: the root ``Req <rid[:8]>`` (``rid``, ``bootstrap_room``) from
    the arrival to the tokenizer's finish; under it the tokenizer's thread span (``tokenize``, ``dispatch``) and
    the scheduler's (``[TP 0]``: ``request_process``, ``prefill_waiting`` from the queue to the forward,
    ``prefill_forward`` to the first token, a ``decode_loop`` per output token after it), each slice linked to
    the one before (links, not parents)."""
    at = engine_instants(r)
    rid = f"{r['arrival'] % 2**64:016x}{r['id']}"
    root = {"traceId": f"{r['arrival'] % 2**64:016x}".rjust(32, "0"), "spanId": f"{r['arrival'] % 2**64:016x}",
            "name": f"Req {rid[:8]}", "kind": 1, "startTimeUnixNano": str(r["arrival"]),
            "endTimeUnixNano": str(r["arrival"] + r["e2e"]),
            "attributes": [_attr("rid", rid), _attr("bootstrap_room", "None")]}
    threads = _children(root, [
        ("Tokenizer (host:0a1b2c3d | pid:4242)", r["arrival"], r["arrival"] + 2 * MS,
         [_attr("host_id", "0a1b2c3d4e5f"), _attr("pid", 4242), _attr("thread_label", "Tokenizer")]),
        ("Scheduler [TP 0] (host:0a1b2c3d | pid:4343)", r["arrival"], at["FINISHED"],
         [_attr("tp_rank", 0), _attr("host_id", "0a1b2c3d4e5f"), _attr("pid", 4343),
          _attr("thread_label", "Scheduler")])])
    steps = r["tokens"] - 1
    decode = [("decode_loop", at["FIRST_TOKEN"] + k * (at["FINISHED"] - at["FIRST_TOKEN"]) // steps,
               at["FIRST_TOKEN"] + (k + 1) * (at["FINISHED"] - at["FIRST_TOKEN"]) // steps, []) for k in range(steps)]
    slices = [_children(threads[0], [("tokenize", r["arrival"], r["arrival"] + MS, []),
                                     ("dispatch", r["arrival"] + MS, r["arrival"] + 2 * MS, [])]),
              _children(threads[1], [("request_process", r["arrival"] + 2 * MS, at["QUEUED"], []),
                                     ("prefill_waiting", at["QUEUED"], at["SCHEDULED"], []),
                                     ("prefill_forward", at["SCHEDULED"], at["FIRST_TOKEN"], []), *decode])]
    for thread, spans in zip(threads, slices, strict=True):
        for i, span in enumerate(spans):
            span["spanId"] = thread["spanId"][:2] + f"{i + 1:02x}" + thread["spanId"][4:]
            if i:
                span["links"] = [{"traceId": span["traceId"], "spanId": spans[i - 1]["spanId"]}]
    return [root, *threads, *slices[0], *slices[1]]


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
