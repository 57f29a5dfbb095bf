"""What the OTLP and Jaeger readers collect of each span, whatever shape of vLLM's tracing wrote it, and the
account of what they leave out (the request table is assembled from it by ``request_spans``).

The shapes (vLLM's ``vllm/tracing`` ``SpanAttributes``, the journey- and step-tracing docs and tests):
- **legacy**: one ``llm_request`` span per request with ``gen_ai.latency.*`` (seconds) and
  ``gen_ai.usage.prompt_tokens`` / ``completion_tokens``;
- **GenAI conventions** (``OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental``): the span named
  ``"{operation} {model}"`` with ``gen_ai.operation.name``, tokens as ``gen_ai.usage.input_tokens`` /
  ``output_tokens``, the id as ``gen_ai.response.id`` (``ALIASES``);
- **phase spans**: children of the request span for its phases (``PHASE_SPANS``): ``vllm.request.queue`` /
  ``vllm.request.prefill`` / ``vllm.request.decode`` (vLLM's ``tests/tracing/test_request_lifecycle_tracing.py``), a
  run span cut short by a preemption marked ``preempted`` (``PREEMPTED``), and the older ``vllm_*`` names;
- **journey tracing** (``--enable-journey-tracing``): the API span ``llm_request`` with ``api.*`` events and its
  child ``llm_core`` with ``journey.*`` state events (``QUEUED``, ``SCHEDULED``, ``FIRST_TOKEN``, ``PREEMPTED``,
  ``FINISHED``), each with the request's progress (``JOURNEY_ATTRIBUTES``);
- **SGLang** (``--enable-trace``, ``sglang/srt/tracing/trace.py``): a root span ``Req <rid[:8]>`` with ``rid``, a
  span per thread under it (``thread_label``, ``pid``, ``host_id``: read as the core span) and the stage slices
  under those (``prefill_waiting``, ``prefill_forward``, ``chunked_prefill``, ``decode_loop``: phases; the
  tokenizer's and dispatch slices are not);
- **step tracing** (``--step-tracing-enabled``): ``step.BATCH_SUMMARY`` events on the long ``scheduler_steps``
  span (``STEP_ATTRIBUTES``); its per-request ``step.REQUEST_SNAPSHOT`` events are counted and left out.

An event's time is its own (``timeUnixNano``, epoch ns; a Jaeger log's ``timestamp``): the ``ts.monotonic``
attributes are on another clock and are not read. Events of other names on request spans are counted
(``span_event_left_out``).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipebubble import spans

#: The span vLLM opens for each request (the API span under journey tracing).
REQUEST_SPAN = "llm_request"
#: Journey tracing's engine-core span, a child of the request span.
CORE_SPAN = "llm_core"
#: Phase child spans of a request -> the phase (``requests_table``'s ``intervals``).
PHASE_SPANS = {"vllm_queue": "queue", "vllm_prefill": "prefill", "vllm_decode": "decode",
               "vllm_preempted": "requeue", "vllm_async_kv_transfer": "kv_transfer",
               "queue": "queue", "prefill": "prefill", "decode": "decode",
               "vllm.request.queue": "queue", "vllm.request.prefill": "prefill", "vllm.request.decode": "decode",
               "prefill_waiting": "queue", "prefill_forward": "prefill", "chunked_prefill": "prefill",
               "decode_loop": "decode"}
#: SGLang's root span of a request is named ``Req `` and the first 8 characters of its ``rid``.
SGLANG_REQUEST_PREFIX = "Req "
SGLANG_RID = "rid"
#: The attribute of SGLang's per-thread span (the span its stage slices hang under).
THREAD_LABEL = "thread_label"
#: Attributes (vLLM ``SpanAttributes``) -> (request-table column, kind: seconds, count or text).
ATTRIBUTES: dict[str, tuple[str, str]] = {
    "gen_ai.request.id": ("request_id", "text"),
    "gen_ai.latency.time_in_queue": ("queue_ns", "seconds"),
    "gen_ai.latency.time_to_first_token": ("ttft_ns", "seconds"),
    "gen_ai.latency.e2e": ("e2e_ns", "seconds"),
    "gen_ai.latency.time_in_model_prefill": ("prefill_ns", "seconds"),
    "gen_ai.latency.time_in_model_decode": ("decode_ns", "seconds"),
    "gen_ai.usage.prompt_tokens": ("prompt_tokens", "count"),
    "gen_ai.usage.completion_tokens": ("completion_tokens", "count"),
    "preempted": ("preempted", "flag"),
}
#: The GenAI conventions' names for the same facts, read where the older name is absent.
ALIASES = {"gen_ai.usage.input_tokens": "gen_ai.usage.prompt_tokens",
           "gen_ai.usage.output_tokens": "gen_ai.usage.completion_tokens",
           "gen_ai.response.id": "gen_ai.request.id", SGLANG_RID: "gen_ai.request.id"}
#: A span that carries any of these is a request even under another name.
LATENCY_PREFIX = "gen_ai.latency."
OPERATION = "gen_ai.operation.name"
#: Journey events kept (with or without their ``journey.`` / ``api.`` prefix) -> the name kept.
JOURNEY_EVENTS = {f"{p}{e}": e for p in ("journey.", "api.", "") for e in (
    "QUEUED", "SCHEDULED", "FIRST_TOKEN", "PREEMPTED", "FINISHED", "ARRIVED", "HANDOFF_TO_CORE",
    "FIRST_RESPONSE_FROM_CORE", "DEPARTED", "ABORTED")}
JOURNEY_ATTRIBUTES = {"prefill.done_tokens": "prefill_done", "prefill.total_tokens": "prefill_total",
                      "decode.done_tokens": "decode_done"}
STEP_EVENT = "step.BATCH_SUMMARY"
SNAPSHOT_EVENT = "step.REQUEST_SNAPSHOT"
STEP_ATTRIBUTES: dict[str, tuple[str, str]] = {
    "step.id": ("step", "count"), "step.ts_start_ns": ("ts_start", "count"), "step.ts_end_ns": ("ts_end", "count"),
    "step.duration_us": ("duration_us", "count"), "queue.running_depth": ("running", "count"),
    "queue.waiting_depth": ("waiting", "count"), "batch.num_prefill_reqs": ("prefill_reqs", "count"),
    "batch.num_decode_reqs": ("decode_reqs", "count"), "batch.scheduled_tokens": ("scheduled_tokens", "count"),
    "batch.prefill_tokens": ("prefill_tokens", "count"), "batch.decode_tokens": ("decode_tokens", "count"),
    "batch.num_finished": ("finished", "count"), "batch.num_preempted": ("preempted", "count"),
    "kv.usage_gpu_ratio": ("kv_usage", "ratio"), "kv.blocks_total_gpu": ("kv_blocks_total", "count"),
    "kv.blocks_free_gpu": ("kv_blocks_free", "count")}
LIMIT = spans.TIME_LIMIT_NS
_BAD = object()  # a value of the wrong type or out of range

#: One span event as a reader hands it on: (name, time in ns as written, {key: (type, value)}).
Event = tuple[Any, Any, dict[Any, tuple[str, Any]]]


def wanted(key: Any) -> bool:
    """An attribute the table takes, or one that makes its span a request."""
    return key in ATTRIBUTES or key in ALIASES or key in (OPERATION, THREAD_LABEL) or (
        isinstance(key, str) and key.startswith(LATENCY_PREFIX))


def event_wanted(key: Any) -> bool:
    """An event attribute kept (journey progress, a step's summary)."""
    return key in JOURNEY_ATTRIBUTES or key in STEP_ATTRIBUTES


@dataclass
class Collected:
    """Spans decoded so far, column by column (ns and counts already checked), and the account: request spans
    and the spans and events of their shapes (``rows``: one per request, core or phase span; ``events``: the
    journey events of those rows; ``steps``: step-tracing summaries)."""

    path: Path
    rows: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in (
        "trace_id", "span_id", "parent_id", "kind", "start", "end", *(c for c, _ in ATTRIBUTES.values()))})
    events: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in (
        "row", "seq", "name", "t", *JOURNEY_ATTRIBUTES.values())})
    steps: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c in (
        "t", *(c for c, _ in STEP_ATTRIBUTES.values()))})
    spans_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    first_bad: str | None = None

    def add(self, trace: Any, span: Any, name: Any, start: Any, end: Any, found: dict[Any, tuple[str, Any]],
            parent: Any = None, events: list[Event] = ()) -> None:
        """One span: ``found`` holds the attributes ``wanted`` keeps as (type, value), the type one of
        ``double``, ``int``, ``string``, ``bool`` or another name (nothing this reader takes)."""
        self.spans_read += 1
        kind = _kind(name, found)
        if kind is None:
            self._steps(events)
            return
        row = len(self.rows["kind"])
        first = self.instant(start, "start")
        last = self.instant(end, "end")
        if first is not None and last is not None and last < first:
            last = self.bad("end", end)
        for column, value in (("trace_id", trace), ("span_id", span), ("parent_id", parent)):
            self.rows[column].append(None if value is None or value == "" else str(value))
        self.rows["kind"].append(kind)
        self.rows["start"].append(first)
        self.rows["end"].append(last)
        for alias, key in ALIASES.items():
            if key not in found and alias in found:
                found[key] = found[alias]
        for key, (column, typ) in ATTRIBUTES.items():
            self.rows[column].append(self.value(key, typ, found.get(key)))
        for seq, event in enumerate(events):
            self._journey(row, seq, *event)

    def _journey(self, row: int, seq: int, name: Any, time: Any, attrs: dict) -> None:
        kept = JOURNEY_EVENTS.get(name) if isinstance(name, str) else None
        if kept is None:
            self.skipped["span_event_left_out"] += 1
            return
        for column, value in (("row", row), ("seq", seq), ("name", kept), ("t", self.instant(time, "event time"))):
            self.events[column].append(value)
        for key, column in JOURNEY_ATTRIBUTES.items():
            self.events[column].append(self.value(key, "count", attrs.get(key)))

    def _steps(self, events: list[Event]) -> None:
        """A span that is no request's: its step summaries kept, else counted as not a request."""
        names = [e[0] for e in events]
        if STEP_EVENT not in names and SNAPSHOT_EVENT not in names:
            self.skipped["not_a_request"] += 1
            return
        for name, time, attrs in events:
            if name != STEP_EVENT:
                self.skipped["request_snapshot" if name == SNAPSHOT_EVENT else "span_event_left_out"] += 1
                continue
            self.steps["t"].append(self.instant(time, "event time"))
            for key, (column, typ) in STEP_ATTRIBUTES.items():
                self.steps[column].append(self.value(key, typ, attrs.get(key)))

    def value(self, key: str, kind: str, typed: tuple[str, Any] | None) -> Any:
        """An attribute's value as its column holds it, None when absent (counted when unusable)."""
        if typed is None:
            return None
        value = _convert(kind, *typed)
        return self.bad(key, typed[1]) if value is _BAD else value

    def instant(self, value: Any, what: str) -> int | None:
        """A span's start or end in ns (an integer or a string of digits within ±2⁶² ns); None when absent."""
        if value is None:
            return None
        ns = _integer(value)
        return self.bad(what, value) if ns is _BAD or not -LIMIT < ns < LIMIT else ns

    def bad(self, what: str, value: Any) -> None:
        """Count a value left null, remembering the first for the warning."""
        self.skipped["bad_value"] += 1
        self.first_bad = self.first_bad or f"{what} = {str(value)[:40]!r}"
        return None


def _kind(name: Any, found: dict) -> str | None:
    """``request``, ``core``, ``phase:<phase>``, or None (no request's span)."""
    if name == REQUEST_SPAN or OPERATION in found or any(
            isinstance(k, str) and k.startswith(LATENCY_PREFIX) for k in found) or (
            SGLANG_RID in found and isinstance(name, str) and name.startswith(SGLANG_REQUEST_PREFIX)):
        return "request"
    if name == CORE_SPAN or THREAD_LABEL in found:
        return "core"
    phase = PHASE_SPANS.get(name) if isinstance(name, str) else None
    return None if phase is None else f"phase:{phase}"


def _integer(value: Any) -> Any:
    """An int from an int or a string of digits (protobuf JSON writes 64-bit integers as strings)."""
    if isinstance(value, bool):
        return _BAD
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return _BAD
    return _BAD


def _convert(kind: str, typ: str, value: Any) -> Any:
    """A typed attribute value as its column holds it: a flag as a bool, seconds as ns (finite, within 0..2⁶² ns),
    counts as ints (0..2⁶², an integral double accepted), ratios as floats in 0..1, text as str; ``_BAD`` for
    anything else."""
    if kind == "flag":
        return value if typ == "bool" and isinstance(value, bool) else _BAD
    if kind == "text":
        if typ == "string" and isinstance(value, str):
            return value
        number = _integer(value) if typ == "int" else _BAD
        return _BAD if number is _BAD else str(number)
    if typ not in ("double", "int"):
        return _BAD
    if kind == "count":
        number = _integer(value) if typ == "int" else value
        if isinstance(number, float) and number.is_integer():
            number = int(number)
        return number if isinstance(number, int) and not isinstance(number, bool) and 0 <= number < LIMIT else _BAD
    try:
        number = float(value)  # doubleValue may be "NaN" or "Infinity" in protobuf JSON
    except (TypeError, ValueError):
        return _BAD
    if isinstance(value, bool) or not math.isfinite(number):
        return _BAD
    if kind == "ratio":
        return number if 0 <= number <= 1 else _BAD
    return round(number * 1e9) if 0 <= number * 1e9 < LIMIT else _BAD
