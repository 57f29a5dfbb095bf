"""The tolerant path: a block the typed decoder rejected, read event by event from raw JSON values.

Every field is kept as raw text and only scalars are ever decoded from it, so a value of any shape or
depth costs the time to skip it and nothing more. What does not fit is nulled the same way the fast path
would see it: names and categories that are not strings (a number keeps its text, up to 64 bytes), ids
that are not ints or strings, times that are not numbers. An element of the events array that is not an
object is counted (phase ``<not an object>``), never decoded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import msgspec
import polars as pl

from pipebubble.ingest.json.columns import (
    ARG_FIELDS,
    INSTANTS,
    KEPT_PHASES,
    MEMORY_EVENT,
    MEMORY_FIELDS,
    MEMORY_PHASE,
    build_frame,
    exact_ts,
)
from pipebubble.spans import args_label

NOT_AN_OBJECT = "<not an object>"
_NO_VALUE = msgspec.Raw(b"")
_MAX_PHASE = 32
_MAX_NUMBER_TEXT = 64


class _Loose(msgspec.Struct, gc=False):
    ph: msgspec.Raw = _NO_VALUE
    cat: msgspec.Raw = _NO_VALUE
    name: msgspec.Raw = _NO_VALUE
    pid: msgspec.Raw = _NO_VALUE
    tid: msgspec.Raw = _NO_VALUE
    ts: msgspec.Raw = _NO_VALUE
    dur: msgspec.Raw = _NO_VALUE
    id: msgspec.Raw = _NO_VALUE
    args: msgspec.Raw = _NO_VALUE


class _LooseArgs(msgspec.Struct, gc=False):
    external_id: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="External id")
    correlation: msgspec.Raw = _NO_VALUE
    name: msgspec.Raw = _NO_VALUE
    microbatch: msgspec.Raw = _NO_VALUE
    mb_id: msgspec.Raw = _NO_VALUE
    micro_batch: msgspec.Raw = _NO_VALUE
    model_chunk: msgspec.Raw = _NO_VALUE
    chunk: msgspec.Raw = _NO_VALUE
    bytes: msgspec.Raw = _NO_VALUE
    flops: msgspec.Raw = _NO_VALUE
    dims: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Input Dims")
    dtypes: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Input type")


class _LooseMemoryArgs(msgspec.Struct, gc=False):
    bytes: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Bytes")
    allocated: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Total Allocated")
    reserved: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Total Reserved")
    type: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Device Type")
    device: msgspec.Raw = msgspec.field(default=_NO_VALUE, name="Device Id")


_MEMORY_ARGS = msgspec.json.Decoder(_LooseMemoryArgs)
_ELEMENTS = msgspec.json.Decoder(list[msgspec.Raw])
_EVENT = msgspec.json.Decoder(_Loose)
_ARGS = msgspec.json.Decoder(_LooseArgs)
_SCALAR = msgspec.json.Decoder(int | float | str | bool | None)
_OUT_OF_RANGE = float("inf")  # a number the decoder cannot hold: the range check counts it


def decode_tolerant(block: bytes) -> tuple[pl.DataFrame, Counter[str]]:
    """Columns and phase counts of ``block``, whatever the shapes of its values."""
    phases: Counter[str] = Counter()
    fields: dict[str, list] = {k: [] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id")}
    fields |= {"external_id": [], "correlation": [], "arg_name": [], "mb": [], "chunk": []}
    fields |= {name: [] for name in ARG_FIELDS}
    memory: list[tuple[int, _LooseMemoryArgs]] = []  # allocator events: (row, arguments)
    texts: list[bytes] = []
    for raw in _ELEMENTS.decode(block):
        try:
            event = _EVENT.decode(raw)
        except msgspec.ValidationError:
            phases[NOT_AN_OBJECT] += 1
            continue
        ph = _phase(event.ph)
        phases[ph] += 1
        if ph in INSTANTS and _text(event.name) == MEMORY_EVENT:
            memory.append((len(texts), _memory_args(event.args)))
            phases[ph] -= 1
            phases[MEMORY_PHASE] += 1
            ph = "i"
        elif ph not in KEPT_PHASES:
            continue
        fields["ph"].append(ph)
        fields["cat"].append(_text(event.cat))
        fields["name"].append(_text(event.name))
        fields["pid"].append(_id(event.pid))
        fields["tid"].append(_id(event.tid))
        fields["ts"].append(_number(event.ts))
        texts.append(bytes(event.ts))
        fields["dur"].append(_number(event.dur) if ph == "X" else None)
        ident = _scalar(event.id) if ph != "X" else None
        fields["id"].append(ident if isinstance(ident, str) else _int_text(ident))
        args = _args(event.args)
        fields["external_id"].append(_int(args.external_id))
        fields["correlation"].append(_int(args.correlation))
        fields["arg_name"].append(_string(args.name) if ph not in ("X", "i") else None)
        passes = ph in ("X", "B", "E", "b", "e")
        mb = next((v for v in map(_int, (args.microbatch, args.mb_id, args.micro_batch)) if v is not None), None)
        chunk = _int(args.model_chunk)
        fields["mb"].append(mb if passes else None)
        fields["chunk"].append((_int(args.chunk) if chunk is None else chunk) if passes else None)
        for name, value in _arg_values(args, ph != "i").items():
            fields[name].append(value)
        if ph == "X":  # a pair is named when it is paired, its args merged
            fields["name"][-1] = args_label(fields["name"][-1], fields["mb"][-1], fields["chunk"][-1])
    fields |= _memory_columns(memory, len(texts))
    frame = build_frame(fields)
    if frame["big"].any():
        frame = exact_ts(frame, texts)
    frame.drop_in_place("big")
    return frame, +phases


def _arg_values(args: _LooseArgs, kept: bool) -> dict[str, Any]:
    """The span table's argument columns (``ARG_FIELDS``) as the fast path gives them: ints that fit int64,
    the two lists' JSON text as written; all null when not
    ``kept`` (allocator events)."""
    if not kept:
        return dict.fromkeys(ARG_FIELDS)
    return {"bytes": _int(args.bytes), "flops": _int(args.flops), "dims": bytes(args.dims).decode(),
            "dtypes": bytes(args.dtypes).decode()}  # as written: ``build_frame`` spaces them as torch does


def _memory_args(raw: msgspec.Raw) -> _LooseMemoryArgs:
    if _head(raw) == b"{":
        try:
            return _MEMORY_ARGS.decode(raw)
        except msgspec.ValidationError:
            pass
    return _LooseMemoryArgs()


def _memory_columns(memory: list[tuple[int, _LooseMemoryArgs]], rows: int) -> dict[str, list]:
    """The allocator events' numbers (ints that fit int64, else null) at their rows; null elsewhere."""
    if not memory:
        return {}
    columns: dict[str, list] = {name: [None] * rows for name in MEMORY_FIELDS}
    for row, args in memory:
        for name, field in MEMORY_FIELDS.items():
            columns[name][row] = _int(getattr(args, field))
    return columns



def _scalar(raw: msgspec.Raw) -> Any:
    """A scalar JSON value; None for containers, missing values and null; inf for an unholdable number."""
    head = _head(raw)
    if not head or head in b"[{":
        return None
    try:
        return _SCALAR.decode(raw)
    except msgspec.ValidationError:
        return _OUT_OF_RANGE


def _head(raw: msgspec.Raw) -> bytes:
    """The first byte of a raw value (which kind of value it is), b"" when the field is missing."""
    return memoryview(raw)[:1].tobytes()


def _phase(raw: msgspec.Raw) -> str:
    value = _scalar(raw)
    if isinstance(value, str):
        return value[:_MAX_PHASE]
    if not len(raw):
        return "<missing>"
    return f"<{_KINDS.get(_head(raw), 'number')}>"


_KINDS = {b"[": "array", b"{": "object", b"n": "null", b"t": "bool", b"f": "bool", b'"': "string"}


def _text(raw: msgspec.Raw) -> str | None:
    """A name or category: a string as it is, a number as its text (bounded), anything else null."""
    value = _scalar(raw)
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and len(raw) <= _MAX_NUMBER_TEXT:
        return bytes(raw).decode()
    return None


def _string(raw: msgspec.Raw) -> str | None:
    value = _scalar(raw)
    return value if isinstance(value, str) else None


def _id(raw: msgspec.Raw) -> int | str | None:
    """pid/tid as the fast path sees them: ints and strings as they are; a float by its text."""
    value = _scalar(raw)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return bytes(raw).decode()[:_MAX_NUMBER_TEXT]
    return value


def _number(raw: msgspec.Raw) -> float | None:
    value = _scalar(raw)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return _OUT_OF_RANGE


def _int(raw: msgspec.Raw) -> int | None:
    value = _scalar(raw)
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return value
    return None


def _int_text(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63:
        return str(value)
    return None


def _args(raw: msgspec.Raw) -> _LooseArgs:
    if _head(raw) == b"{":
        try:
            return _ARGS.decode(raw)
        except msgspec.ValidationError:
            pass
    return _LooseArgs()
