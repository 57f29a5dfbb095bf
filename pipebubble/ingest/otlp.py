"""Request spans in OTLP JSON into the request table (``requests_table``), and what the Jaeger reader shares.

vLLM (``--otlp-traces-endpoint``) exports one span per finished request, named ``llm_request``, starting at the
request's arrival (epoch ns) and ending when its output was processed, with the attributes of
``vllm/tracing.py`` ``SpanAttributes``, set in the output processor's ``do_tracing``: latencies in seconds
(floats), token counts as integers (``ATTRIBUTES`` maps them onto the table).

OTLP JSON is the protobuf JSON mapping of ``ExportTraceServiceRequest``: ``resourceSpans[].scopeSpans[].spans[]``
(``instrumentationLibrarySpans`` before OTLP 0.15), each span with ``traceId``, ``spanId``, ``name``,
``startTimeUnixNano`` / ``endTimeUnixNano`` (uint64 ns, as strings) and ``attributes`` as ``[{key, value:
{stringValue|intValue|doubleValue|boolValue|...}}]`` (int64 as strings). An OpenTelemetry Collector's file
exporter writes one such object per line; a single object (an OTLP/HTTP JSON body) is read too.

Bad input: a file that is not JSON or not shaped as the format (or holds no line that is) is a
``TraceFormatError``; a cut-off last line is left out with a warning, other lines that are not JSON
(``unreadable_line``) or not shaped so (``malformed_line``, the first's place named) are counted and warned
about; spans that are not requests, duplicates (a collector's retry) and requests without any time are counted
in ``skipped``; a value of the wrong type or out of range is left null and counted (``bad_value``). Nothing is
guessed: an attribute the span lacks is null.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from pipebubble import requests_table, spans
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import gunzip
from pipebubble.ingest.base import FileResult

#: The span vLLM opens for each request.
REQUEST_SPAN = "llm_request"
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
}
#: A span that carries any of these is a request even under another name.
LATENCY_PREFIX = "gen_ai.latency."
LIMIT = spans.TIME_LIMIT_NS
_BAD = object()  # a value of the wrong type or out of range


@dataclass
class Collected:
    """Request spans decoded so far, column by column (ns and counts already checked), and the account."""

    path: Path
    trace_ids: list[Any] = field(default_factory=list)
    span_ids: list[Any] = field(default_factory=list)
    start: list[int | None] = field(default_factory=list)
    end: list[int | None] = field(default_factory=list)
    columns: dict[str, list[Any]] = field(default_factory=lambda: {c: [] for c, _ in ATTRIBUTES.values()})
    spans_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    first_bad: str | None = None

    def add(self, trace: Any, span: Any, name: Any, start: Any, end: Any, found: dict[Any, tuple[str, Any]]) -> None:
        """One span: ``found`` holds the ``ATTRIBUTES`` it carries as (type, value), the type one of
        ``double``, ``int``, ``string``, ``bool`` or another name (nothing this reader takes)."""
        self.spans_read += 1
        if name != REQUEST_SPAN and not any(k.startswith(LATENCY_PREFIX) for k in found):
            self.skipped["not_a_request"] += 1
            return
        self.trace_ids.append(None if trace is None else str(trace))
        self.span_ids.append(None if span is None else str(span))
        first = self.instant(start, "start")
        last = self.instant(end, "end")
        if first is not None and last is not None and last < first:
            last = self.bad("end", end)
        self.start.append(first)
        self.end.append(last)
        for key, (column, kind) in ATTRIBUTES.items():
            value = None if key not in found else _convert(kind, *found[key])
            self.columns[column].append(self.bad(key, found[key][1]) if value is _BAD else value)

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
    """A typed attribute value as its column holds it: seconds as ns (finite, within 0..2⁶² ns), counts as ints
    (0..2⁶², an integral double accepted), text as str; ``_BAD`` for anything else."""
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
        seconds = float(value)  # doubleValue may be "NaN" or "Infinity" in protobuf JSON
    except (TypeError, ValueError):
        return _BAD
    if isinstance(value, bool) or not math.isfinite(seconds) or not 0 <= seconds * 1e9 < LIMIT:
        return _BAD
    return round(seconds * 1e9)


# --- reading the file: one object, or one per line ---


def documents(path: Path, decoder: msgspec.json.Decoder, what: str) -> tuple[list[Any], Counter[str], list[str]]:
    """The objects of ``path`` (gunzipped when gzipped) as ``decoder``'s typed structs (typed, not dicts: a
    collector's file holds millions of small objects, which untyped decoding and the garbage collector make
    some 15x slower): the whole file as one, else one per line, with the lines left out counted and warned
    about. ``what`` names the format in the messages."""
    data, warning = _text(path)
    warnings = [warning] if warning else []
    if not data.strip():
        raise TraceFormatError(path, f"empty file: expected {what}")
    try:
        return [decoder.decode(data)], Counter(), warnings
    except msgspec.ValidationError as exc:  # not shaped as the format's, or several lines (read below)
        whole = f"not {what}: {exc}"
    except msgspec.DecodeError as exc:
        whole = f"not JSON ({exc}): expected {what}"
    docs, skipped, shape = [], Counter(), None
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            docs.append(decoder.decode(line))
        except msgspec.ValidationError as exc:
            skipped["malformed_line"] += 1
            shape = shape or f"line {i + 1}: {exc}"
        except msgspec.DecodeError:
            skipped["cut_off_line" if i == len(lines) - 1 else "unreadable_line"] += 1
    if not docs:
        raise TraceFormatError(path, f"not {what}: {shape}" if shape else whole)
    return docs, skipped, warnings + _line_warnings(path, skipped, len(docs), shape)


def _line_warnings(path: Path, skipped: Counter[str], kept: int, shape: str | None) -> list[str]:
    out = [f"{path}: last line cut off; read the {kept} whole line(s) before it"] if skipped["cut_off_line"] else []
    if skipped["unreadable_line"]:
        out.append(f"{path}: {skipped['unreadable_line']} line(s) that are not JSON left out")
    if shape:
        out.append(f"{path}: {skipped['malformed_line']} line(s) not shaped as expected left out ({shape})")
    return out


def _text(path: Path) -> tuple[bytes, str | None]:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gunzip.in_memory(path)
    return path.read_bytes(), None


# --- OTLP: the structs the protobuf JSON mapping gives (scalars untyped: ``Collected`` checks each value) ---


class AnyValue(msgspec.Struct, gc=False):
    doubleValue: Any = None
    intValue: Any = None
    stringValue: Any = None
    boolValue: Any = None


class KeyValue(msgspec.Struct, gc=False):
    key: Any = None
    value: AnyValue | None = None


class Span(msgspec.Struct, gc=False):
    traceId: Any = None
    spanId: Any = None
    name: Any = None
    startTimeUnixNano: Any = None
    endTimeUnixNano: Any = None
    attributes: list[KeyValue] = []


class ScopeSpans(msgspec.Struct, gc=False):
    spans: list[Span] = []


class ResourceSpans(msgspec.Struct, gc=False):
    scopeSpans: list[ScopeSpans] = []
    instrumentationLibrarySpans: list[ScopeSpans] = []  # before OTLP 0.15


class ExportTraceServiceRequest(msgspec.Struct, gc=False):
    resourceSpans: list[ResourceSpans]


_DECODER = msgspec.json.Decoder(ExportTraceServiceRequest)


def read(path: Path) -> FileResult:
    """An OTLP JSON file of request spans (see the module docstring)."""
    docs, skipped, warnings = documents(path, _DECODER, "OTLP JSON (resourceSpans[].scopeSpans[].spans[])")
    out = Collected(path, skipped=skipped, warnings=warnings)
    for doc in docs:
        for resource in doc.resourceSpans:
            for scope in resource.scopeSpans or resource.instrumentationLibrarySpans:
                for span in scope.spans:
                    out.add(span.traceId, span.spanId, span.name, span.startTimeUnixNano, span.endTimeUnixNano,
                            {a.key: _otlp_value(a.value) for a in span.attributes if wanted(a.key)})
    return finish(out, "otlp")


def wanted(key: Any) -> bool:
    """An attribute the table takes, or one that makes its span a request."""
    return key in ATTRIBUTES or (isinstance(key, str) and key.startswith(LATENCY_PREFIX))


def _otlp_value(value: AnyValue | None) -> tuple[str, Any]:
    """(type, value) of an OTLP AnyValue: its set field (``other`` for an array, map or bytes)."""
    if value is None:
        return "other", None
    for typ, field_value in (("double", value.doubleValue), ("int", value.intValue),
                             ("string", value.stringValue), ("bool", value.boolValue)):
        if field_value is not None:
            return typ, field_value
    return "other", None


# --- the request table ---


def finish(out: Collected, fmt: str) -> FileResult:
    """The file's result: no spans, its requests (duplicates and requests without any time counted and left
    out), the account and the warnings."""
    table = _table(out)
    unnamed = pl.col("trace_id").is_null() | pl.col("span_id").is_null()
    unique = table.filter(pl.struct("trace_id", "span_id").is_first_distinct() | unnamed)
    timed = unique.filter(pl.any_horizontal(pl.col("start", "ttft_ns", "e2e_ns", "queue_ns").is_not_null()))
    out.skipped.update({"duplicate_span": table.height - unique.height, "request_without_times":
                        unique.height - timed.height})
    if out.first_bad:
        out.warnings.append(f"{out.path}: {out.skipped['bad_value']} value(s) of the wrong type or out of range "
                            f"left null (first: {out.first_bad})")
    if timed.is_empty():
        out.warnings.append(f"{out.path}: no request spans ({REQUEST_SPAN}, or spans with {LATENCY_PREFIX}* "
                            f"attributes) among {out.spans_read} span(s)")
    skipped = Counter({k: v for k, v in out.skipped.items() if v})
    return FileResult(str(out.path), spans.empty(), out.spans_read, skipped, out.warnings, {}, fmt,
                      requests=requests_table.conform(derive(timed, str(out.path))))


def _table(out: Collected) -> pl.DataFrame:
    text = {"trace_id": pl.String, "span_id": pl.String, "request_id": pl.String}
    data = {"trace_id": out.trace_ids, "span_id": out.span_ids, "start": out.start, "end": out.end, **out.columns}
    return pl.DataFrame(data, schema={k: text.get(k, pl.Int64) for k in data})


def derive(raw: pl.DataFrame, source: str) -> pl.DataFrame:
    """The request table's instants from a span's start and end and its stated durations: arrival = the span's
    start; e2e as stated, else end − start; first token = arrival + TTFT; completion = arrival + e2e;
    scheduled = first token − prefill (vLLM's prefill runs from scheduling to the first token), null where it
    would precede the arrival (the two clocks disagree)."""
    with_e2e = raw.with_columns(e2e_ns=pl.coalesce("e2e_ns", pl.col("end") - pl.col("start")))
    instants = with_e2e.with_columns(
        source=pl.lit(source), arrival=pl.col("start"), first_token=pl.col("start") + pl.col("ttft_ns"),
        completion=pl.col("start") + pl.col("e2e_ns"))
    scheduled = pl.col("first_token") - pl.col("prefill_ns")
    return instants.with_columns(scheduled=pl.when(scheduled >= pl.col("arrival")).then(scheduled))
