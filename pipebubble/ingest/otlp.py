"""Request spans in OTLP JSON into the request table (``requests_table``), and what the Jaeger reader shares.

vLLM (``--otlp-traces-endpoint``) exports one span per finished request, named ``llm_request``, starting at the
request's arrival (epoch ns) and ending when its output was processed, with the attributes of
``vllm/tracing.py`` ``SpanAttributes``, set in the output processor's ``do_tracing``: latencies in seconds
(floats), token counts as integers (``ATTRIBUTES`` maps them onto the table). The other shapes vLLM writes
(GenAI-conventions names, phase child spans, journey tracing's ``llm_core`` span and its events, step
tracing's summaries) are listed in ``request_collect``; ``request_spans`` assembles them into requests.

OTLP JSON is the protobuf JSON mapping of ``ExportTraceServiceRequest``: ``resourceSpans[].scopeSpans[].spans[]``
(``instrumentationLibrarySpans`` before OTLP 0.15), each span with ``traceId``, ``spanId``, ``name``,
``parentSpanId``, ``startTimeUnixNano`` / ``endTimeUnixNano`` (uint64 ns, as strings), ``events`` (``{timeUnixNano,
name, attributes}``) and ``attributes`` as ``[{key, value:
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

from collections import Counter
from pathlib import Path
from typing import Any

import msgspec

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import gunzip
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.request_collect import ATTRIBUTES, REQUEST_SPAN, Collected, Event, event_wanted, wanted
from pipebubble.ingest.request_spans import derive, finish

__all__ = ["ATTRIBUTES", "REQUEST_SPAN", "Collected", "derive", "documents", "finish", "read", "wanted"]


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


class SpanEvent(msgspec.Struct, gc=False):
    timeUnixNano: Any = None
    name: Any = None
    attributes: list[KeyValue] = []


class Span(msgspec.Struct, gc=False):
    traceId: Any = None
    spanId: Any = None
    parentSpanId: Any = None
    name: Any = None
    startTimeUnixNano: Any = None
    endTimeUnixNano: Any = None
    attributes: list[KeyValue] = []
    events: list[SpanEvent] = []


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
                            {a.key: _otlp_value(a.value) for a in span.attributes if wanted(a.key)},
                            span.parentSpanId, [_event(e) for e in span.events])
    return finish(out, "otlp")


def _event(event: SpanEvent) -> Event:
    return event.name, event.timeUnixNano, {a.key: _otlp_value(a.value) for a in event.attributes
                                            if event_wanted(a.key)}


def _otlp_value(value: AnyValue | None) -> tuple[str, Any]:
    """(type, value) of an OTLP AnyValue: its set field (``other`` for an array, map or bytes)."""
    if value is None:
        return "other", None
    for typ, field_value in (("double", value.doubleValue), ("int", value.intValue),
                             ("string", value.stringValue), ("bool", value.boolValue)):
        if field_value is not None:
            return typ, field_value
    return "other", None
