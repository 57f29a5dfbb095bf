"""Typed decoding of one block of Chrome-trace events straight into polars columns.

The fast path is a msgspec tagged union on ``ph``: complete events (``X``) decode into a small typed
struct holding only the fields we use, flows/counters/instants into empty structs that are only counted.
A block the fast path rejects (an unknown phase, a string where a number belongs, a name that is not a
string) is decoded again by the tolerant path (``tolerant``), which gives the same columns for the same
events. Before either, a block's invalid UTF-8 is replaced; a block too deeply nested for the decoder has
its deep values replaced by ``null`` (``mend``).

Both paths build their frame with ``columns`` (``build_frame``, ``exact_ts``), where times and ids
are range-checked: an out-of-range value is counted (``skip``), never cast with a wrap. ``columns`` also
names what both keep: the phases (``KEPT_PHASES``), the span table's argument columns (``ARG_FIELDS``: Kineto's
``bytes``, ``flops``, ``Input Dims`` and ``Input type``, the two lists kept as their JSON text through
``msgspec.Raw``) and the allocator events (``MEMORY_EVENT``, ``MEMORY_PHASE``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Union

import msgspec
import polars as pl

from pipebubble.ingest.json import mend
from pipebubble.ingest.json.columns import (
    ARG_FIELDS,
    INSTANTS,
    MEMORY_EVENT,
    MEMORY_FIELDS,
    MEMORY_PHASE,
    build_frame,
    build_plan,
    exact_ts,
)
from pipebubble.ingest.json.tolerant import decode_tolerant
from pipebubble.spans import INT64, args_label

__all__ = ["COLUMNS", "BlockError", "BlockEvents", "decode_block"]

COLUMNS = {
    "ph": pl.String,
    "cat": pl.String,
    "name": pl.String,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "ts_ns": pl.Int64,
    "dur_ns": pl.Int64,
    "id": pl.String,
    "external_id": pl.Int64,
    "correlation": pl.Int64,
    "arg_name": pl.String,
    # a duration event's micro-batch (``microbatch``, else ``mb_id``) and ``model_chunk`` arguments (MegaScan
    # writes them on a B/E pair's E event, Megatron's step timers on X events); null on every other event
    "mb": pl.Int64,
    "chunk": pl.Int64,
    "skip": pl.String,
    # an allocator event's (``[memory]`` instant, ph "i") arguments; null on every other event
    **dict.fromkeys(MEMORY_FIELDS, pl.Int64),
    # the span table's argument columns (``ARG_FIELDS``): a copy's ``bytes``, an operator's ``flops``, its
    # ``Input Dims`` and ``Input type`` as the JSON text written; null on every event without them
    **ARG_FIELDS,
}


@dataclass
class BlockEvents:
    """One block's kept events (``COLUMNS``; with ``decode_block(lazy=True)`` possibly a plan not yet run), a
    count of every phase, and the repairs made to its text (``utf8``: sequences replaced; ``deep``: 1 when
    values nested too deep were nulled)."""

    frame: pl.DataFrame | pl.LazyFrame
    phases: Counter[str]
    repairs: Counter[str] = field(default_factory=Counter)


_NO_RAW = msgspec.Raw(b"")


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    name: str | None = None  # process/thread names in metadata events
    # a pass's micro-batch and model chunk (MegaScan's B/E pairs; Megatron's step timers: mb_id; other
    # spellings: micro_batch, chunk)
    microbatch: int | None = None
    mb_id: int | None = None
    micro_batch: int | None = None
    model_chunk: int | None = None
    chunk: int | None = None
    # the span table's argument columns: kept as written (``msgspec.Raw``: the lists are never decoded)
    # any scalar: a string (ROCm's runtime calls write ``"bytes": "60"``) or a float must not send the block
    # to the tolerant path; only a whole number is kept, as the tolerant path keeps it (``_whole``)
    bytes: int | float | str | bool | None = None
    flops: int | float | str | bool | None = None
    dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    dtypes: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")


_NO_ARGS = _Args()


class _X(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None  # generic traces name their processes
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    args: _Args = _NO_ARGS


class _Kept(msgspec.Struct, tag_field="ph", gc=False):
    """B/E/b/e/M: few per trace, decoded with everything the pairing and the names need."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    id: int | str | None = None
    args: _Args = _NO_ARGS


class _MemoryArgs(msgspec.Struct, frozen=True, gc=False):
    bytes: int | None = msgspec.field(default=None, name="Bytes")
    allocated: int | None = msgspec.field(default=None, name="Total Allocated")
    reserved: int | None = msgspec.field(default=None, name="Total Reserved")
    type: int | None = msgspec.field(default=None, name="Device Type")
    device: int | None = msgspec.field(default=None, name="Device Id")


_NO_MEMORY = _MemoryArgs()


class _Instant(msgspec.Struct, tag_field="ph", gc=False):
    """Instants: kept when they are allocator events (``MEMORY_EVENT``), with the allocator's numbers."""

    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    args: _MemoryArgs = _NO_MEMORY


class _Counted(msgspec.Struct, tag_field="ph", gc=False):
    """Flows, counters, instants, samples, objects: counted, not kept."""


_KEPT = {ph: msgspec.defstruct(f"_{ph}", [], bases=(_Kept,), tag=ph) for ph in ("B", "E", "b", "e", "M")}
_COUNTED = {
    ph: msgspec.defstruct(f"_c{ord(ph)}", [], bases=(_Counted,), tag=ph)
    for ph in ("s", "t", "f", "C", "n", "R", "O", "N", "D", "P", "(", ")", "S", "T", "p", "F")
}
_INSTANT = {ph: msgspec.defstruct(f"_i{ord(ph)}", [], bases=(_Instant,), tag=ph) for ph in INSTANTS}
_PHASE = {_X: "X", **{cls: ph for ph, cls in (_KEPT | _COUNTED | _INSTANT).items()}}
_FAST = msgspec.json.Decoder(list[Union[(_X, *_KEPT.values(), *_INSTANT.values(), *_COUNTED.values())]])  # type: ignore[misc]  # noqa: UP007
_KEPT_TYPES = frozenset(_KEPT.values())
_INSTANT_TYPES = frozenset(_INSTANT.values())


class _EventTs(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"")


_TEXT_TS = msgspec.json.Decoder(list[_EventTs])


class BlockError(Exception):
    """A block that is not valid JSON even after repair: the decoder's message, the offset in the block as
    given (None when the input simply ran out) and whether only its end is missing."""

    def __init__(self, message: str, offset: int | None, truncated: bool) -> None:
        super().__init__(message, offset, truncated)
        self.message, self.offset, self.truncated = message, offset, truncated


def decode_block(block: bytes, lazy: bool = False) -> BlockEvents:
    """The kept events of ``block`` (a JSON array) as columns, a count of every phase, and repairs made.
    ``lazy``: the columns may come as a plan, for the caller's queries to run in their own pass (a block's
    columns are then never materialised on their own). Raises BlockError when the block is not valid JSON
    even after repair."""
    repairs: Counter[str] = Counter()
    fixed, replaced, shifts = mend.fix_unicode(block)
    if replaced:
        repairs["utf8"] = replaced
    deep: list[tuple[int, int]] = []
    try:
        try:
            return _decode(fixed, repairs, lazy)
        except RecursionError:
            fixed, deep = mend.flatten_deep(fixed)
            repairs["deep"] = 1
            return _decode(fixed, repairs, lazy)
    except msgspec.DecodeError as exc:
        exc = _syntax_error(fixed) or exc
        length = len(fixed)
        truncated = mend.is_truncation(exc, length)
        at = mend.original_offset(mend.error_offset(exc, length), deep)
        offset = None if "truncated" in str(exc) else mend.original_offset(at, shifts)
        raise BlockError(mend.one_line(exc), offset, truncated) from None


_SYNTAX = msgspec.json.Decoder(list[msgspec.Raw])


def _syntax_error(block: bytes) -> msgspec.DecodeError | None:
    """The syntax error in ``block`` as one decoder words it, whichever typed decoder met it first."""
    try:
        _SYNTAX.decode(block)
    except msgspec.DecodeError as exc:
        return exc
    return None


def _decode(block: bytes, repairs: Counter[str], lazy: bool = False) -> BlockEvents:
    try:
        frame, phases = _decode_fast(block, lazy)
    except msgspec.ValidationError:
        frame, phases = decode_tolerant(block)
    return BlockEvents(frame, phases, repairs)


def _decode_fast(block: bytes, lazy: bool = False) -> tuple[pl.DataFrame | pl.LazyFrame, Counter[str]]:
    events = _FAST.decode(block)
    by_type = Counter(map(type, events))
    phases = Counter({_PHASE[t]: n for t, n in by_type.items()})
    all_x = by_type[_X] == len(events)
    xs = events if all_x else [e for e in events if type(e) is _X]
    has_rest = any(by_type[t] for t in _KEPT_TYPES)
    rest = [e for e in events if type(e) in _KEPT_TYPES] if has_rest else []
    has_memory = any(by_type[t] for t in _INSTANT_TYPES)
    memory = [e for e in events if type(e) in _INSTANT_TYPES and e.name == MEMORY_EVENT] if has_memory else []
    if memory:  # counted as allocator events, not as instants
        phases.subtract(_PHASE[type(e)] for e in memory)
        phases = +phases
        phases[MEMORY_PHASE] = len(memory)
    columns, dur, n = _fields(xs), [e.dur for e in xs], len(xs)
    columns["name"] = _labelled(columns)
    constants = {}
    if rest or memory:  # complete events first, then the others, then allocator events
        more, mem = _fields(rest), _fields(memory, with_args=False)
        columns = {k: v + more[k] + mem[k] for k, v in columns.items()}
        others = len(rest) + len(memory)
        columns |= {
            "dur": dur + [None] * others,
            "ph": ["X"] * n + [_PHASE[type(e)] for e in rest] + ["i"] * len(memory),
            "id": [None] * n + [_id_text(e.id) for e in rest] + [None] * len(memory),
            "arg_name": [None] * n + [e.args.name for e in rest] + [None] * len(memory),
        }
        if memory:
            columns |= _memory_fields(memory, n + len(rest))
    else:
        columns["dur"], constants["ph"] = dur, "X"  # no id nor arg_name: null
    del xs, rest
    for name in ARG_FIELDS:  # most blocks have none of a column: a constant null, no list made a column
        if columns[name].count(None) == len(columns[name]):
            del columns[name]
    frame = build_plan(columns, constants) if lazy else build_frame(columns, constants)
    if isinstance(frame, pl.LazyFrame):
        return frame, phases
    if frame["big"].any():

        def positions() -> list[int]:
            kept = [i for i, e in enumerate(events) if type(e) in _KEPT_TYPES] if has_rest else []
            x = range(len(events)) if all_x else [i for i, e in enumerate(events) if type(e) is _X]
            mem = [i for i, e in enumerate(events) if type(e) in _INSTANT_TYPES and e.name == MEMORY_EVENT]
            return [*x, *kept, *mem]

        raw = _TEXT_TS.decode(block)
        frame = exact_ts(frame, [bytes(raw[i].ts) for i in positions()])
    frame.drop_in_place("big")  # in place: no query
    return frame, phases


def _memory_fields(memory: list[Any], before: int) -> dict[str, list]:
    """The allocator events' numbers as columns: null on the ``before`` rows that come first."""
    args = [e.args for e in memory]
    pad = [None] * before
    # plain attribute reads (a getattr per value costs this hot loop more): in MEMORY_FIELDS' order
    values = ([a.bytes for a in args], [a.allocated for a in args], [a.reserved for a in args],
              [a.type for a in args], [a.device for a in args])
    return {column: pad + got for column, got in zip(MEMORY_FIELDS, values, strict=True)}


def _fields(events: list[Any], with_args: bool = True) -> dict[str, list]:
    """The fields every kept event has, a list each (comprehensions: twice as fast as ``attrgetter``);
    ``with_args`` False: events without ids (allocator events), their ids null."""
    args = [e.args for e in events] if with_args else []
    none = [None] * len(events)
    return {
        "cat": [e.cat for e in events],
        "name": [e.name for e in events],
        "pid": [e.pid for e in events],
        "tid": [e.tid for e in events],
        "ts": [e.ts for e in events],
        "external_id": [a.external_id for a in args] if with_args else none,
        "correlation": [a.correlation for a in args] if with_args else none,
        "mb": [_first(a.microbatch, a.mb_id, a.micro_batch) for a in args] if with_args else none,
        "chunk": [a.chunk if a.model_chunk is None else a.model_chunk for a in args] if with_args else none,
        **(_arg_fields(args) if with_args else dict.fromkeys(ARG_FIELDS, none)),
    }


_WHOLE_TYPES = {int, type(None)}


def _whole(values: list) -> list:
    """``values`` with every value that is not a whole number (a string, a float, a bool) as None; the list
    as it is where all are (the usual case: checked by one pass in C)."""
    if set(map(type, values)) <= _WHOLE_TYPES:
        return values
    return [v if type(v) is int else None for v in values]


def _arg_fields(args: list[_Args]) -> dict[str, list]:
    """The span table's argument columns (``ARG_FIELDS``). Most events have none of them: a list of the
    shared default (the raw values) is counted, not walked in Python, before any text is made of it."""
    return {
        "bytes": _whole([a.bytes for a in args]),
        "flops": _whole([a.flops for a in args]),
        "dims": _raw_texts([a.dims for a in args]),
        "dtypes": _raw_texts([a.dtypes for a in args]),
    }


def _raw_texts(values: list[msgspec.Raw]) -> list[str | None]:
    """Each raw value's JSON text as written, ``""`` where absent (``build_frame`` spaces them as torch does and
    nulls the absent). A list of nulls, never walked, when every one is the shared default (``count`` compares
    by identity first, at C speed); else joined and split at C speed, not made text one by one: a unit separator
    never stands unescaped in JSON text."""
    if values.count(_NO_RAW) == len(values):
        return [None] * len(values)
    texts = b"\x1f".join(values).decode().split("\x1f")  # Raw values are buffers
    return texts if len(texts) == len(values) else [bytes(v).decode() for v in values]


def _first(*values: int | None) -> int | None:
    """The first of a pass's micro-batch spellings that the event has."""
    return next((v for v in values if v is not None), None)


def _labelled(columns: dict[str, list]) -> list:
    """Complete events' names, those whose args name a micro-batch as ``spans.args_label`` spells them (a B/E
    pair is named when it is paired, its args merged)."""
    names, mbs = columns["name"], columns["mb"]
    if mbs.count(None) == len(mbs):  # most traces: no pass names its micro-batch
        return names
    return [args_label(*row) for row in zip(names, mbs, columns["chunk"], strict=True)]


def _id_text(value: Any) -> str | None:
    """An async event's id as text: strings as they are, ints that fit int64 in decimal, else null."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and -INT64 <= value < INT64:
        return str(value)
    return None
