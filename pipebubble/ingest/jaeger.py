"""Request spans in Jaeger JSON (the query service's ``/api/traces`` answer, the UI's "Download JSON") into the
request table, read as ``otlp`` reads OTLP (same attributes, same account of what is left out).

Layout: ``{"data": [trace]}`` (or one trace alone), a trace ``{traceID, spans, processes}``, a span
``{traceID, spanID, operationName, references: [{refType, spanID}], startTime, duration, tags: [{key, type,
value}], logs: [{timestamp, fields}]}`` with ``startTime`` (epoch), ``duration`` and a log's ``timestamp`` in µs
and tag types ``string``, ``bool``, ``int64``, ``float64``, ``binary``; a span's parent is its ``CHILD_OF``
reference (else its first); an OTLP span event is a log whose ``event`` field names it. Several such objects,
one per line, are read too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from pipebubble.ingest.base import FileResult
from pipebubble.ingest.otlp import documents
from pipebubble.ingest.request_collect import Collected, Event, event_wanted, wanted
from pipebubble.ingest.request_spans import finish

_TYPES = {"float64": "double", "int64": "int", "string": "string", "bool": "bool"}
_NS_PER_US = 1000


class Tag(msgspec.Struct, gc=False):
    key: Any = None
    type: Any = None
    value: Any = None


class Reference(msgspec.Struct, gc=False):
    refType: Any = None
    spanID: Any = None


class Log(msgspec.Struct, gc=False):
    timestamp: Any = None
    fields: list[Tag] = []


class Span(msgspec.Struct, gc=False):
    traceID: Any = None
    spanID: Any = None
    operationName: Any = None
    references: list[Reference] = []
    startTime: Any = None
    duration: Any = None
    tags: list[Tag] = []
    logs: list[Log] = []


class Trace(msgspec.Struct, gc=False):
    spans: list[Span] = []


class Export(msgspec.Struct, gc=False):
    """``{"data": [trace]}``, or one trace alone (its ``spans``)."""

    data: list[Trace] | None = None
    spans: list[Span] | None = None


_DECODER = msgspec.json.Decoder(Export)


def read(path: Path) -> FileResult:
    """A Jaeger JSON file of request spans (see the module docstring)."""
    docs, skipped, warnings = documents(path, _DECODER, "Jaeger JSON (data[].spans[])")
    out = Collected(path, skipped=skipped, warnings=warnings)
    for doc in docs:
        if doc.data is None and doc.spans is None:
            out.skipped["not_jaeger"] += 1
        for trace in doc.data if doc.data is not None else [Trace(doc.spans or [])]:
            for span in trace.spans:
                start, end = _instants(span.startTime, span.duration, out)
                tags = {t.key: _typed(t) for t in span.tags if wanted(t.key)}
                out.add(span.traceID, span.spanID, span.operationName, start, end, tags, _parent(span),
                        [_event(log) for log in span.logs])
    return finish(out, "jaeger")


def _typed(tag: Tag) -> tuple[str, Any]:
    return _TYPES.get(str(tag.type).lower(), "other"), tag.value


def _parent(span: Span) -> Any:
    refs = [r for r in span.references if r.refType == "CHILD_OF"] or span.references
    return refs[0].spanID if refs else None


def _event(log: Log) -> Event:
    """A log as a span event: its ``event`` field names it, its time in ns (µs as written; a time that is not
    an integer is passed on for the collector to count)."""
    name = next((f.value for f in log.fields if f.key == "event"), None)
    time = log.timestamp * _NS_PER_US if _whole(log.timestamp) else log.timestamp
    return name, time, {f.key: _typed(f) for f in log.fields if event_wanted(f.key)}


def _instants(start_us: Any, duration_us: Any, out: Collected) -> tuple[int | None, int | None]:
    """The span's start and end in ns from its integer µs (``add`` range-checks them); a value that is not
    an integer (or a negative duration) is counted and left unknown."""
    start = None if start_us is None else start_us * _NS_PER_US if _whole(start_us) else out.bad("startTime", start_us)
    if duration_us is None or start is None:
        return start, None
    if not _whole(duration_us) or duration_us < 0:
        return start, out.bad("duration", duration_us)
    return start, start + duration_us * _NS_PER_US


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
