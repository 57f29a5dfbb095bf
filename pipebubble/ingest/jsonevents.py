"""Typed decoding of one block of Chrome-trace events straight into polars columns.

The fast path is a msgspec tagged union on ``ph``: complete events (``X``) decode into a small typed
struct holding only the fields we use, flows/counters/instants into empty structs that are only counted.
A block the fast path rejects (an unknown phase, a string where a number belongs) is decoded again by a
tolerant path that accepts any JSON value and nulls what does not fit.
"""

from __future__ import annotations

import zlib
from collections import Counter
from operator import attrgetter
from typing import Any, Union

import msgspec
import polars as pl

# Floats below 2**43 µs still resolve 1 ns; above (absolute epoch µs with a fraction) the text is re-read.
_EXACT_FLOAT_US = 2.0**43
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
}
KEPT_PHASES = ("X", "B", "E", "b", "e", "M")


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = None
    name: Any = None  # process/thread names in metadata events


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """The tolerant shape: any JSON value in any field."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    args: Any = None


class _X(msgspec.Struct, tag_field="ph", tag="X", gc=False):
    cat: str | None = None
    name: str | None = None
    pid: int | None = None  # a named process (string id) sends the block to the tolerant path
    tid: int | None = None
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


class _Counted(msgspec.Struct, tag_field="ph", gc=False):
    """Flows, counters, instants, samples, objects: counted, not kept."""


_KEPT = {ph: msgspec.defstruct(f"_{ph}", [], bases=(_Kept,), tag=ph) for ph in ("B", "E", "b", "e", "M")}
_COUNTED = {
    ph: msgspec.defstruct(f"_c{ord(ph)}", [], bases=(_Counted,), tag=ph)
    for ph in ("s", "t", "f", "C", "i", "I", "n", "R", "O", "N", "D", "P", "(", ")", "S", "T", "p", "F")
}
_PHASE = {_X: "X", **{cls: ph for ph, cls in (_KEPT | _COUNTED).items()}}
_FAST = msgspec.json.Decoder(list[Union[(_X, *_KEPT.values(), *_COUNTED.values())]])  # type: ignore[misc]  # noqa: UP007
_TOLERANT = msgspec.json.Decoder(list[_Event])


class _EventTs(msgspec.Struct, gc=False):
    ph: Any = None
    ts: msgspec.Raw = msgspec.Raw(b"")


_TEXT_TS = msgspec.json.Decoder(list[_EventTs])


def decode_block(block: bytes) -> tuple[pl.DataFrame, Counter[str]]:
    """Columns (``COLUMNS``) of the kept events in ``block`` (a JSON array) and a count of every phase."""
    try:
        return _decode_block(block)
    except UnicodeDecodeError:  # invalid UTF-8 in a name: keep the event, replace the bad bytes
        return _decode_block(block.decode("utf-8", "replace").encode())


def _decode_block(block: bytes) -> tuple[pl.DataFrame, Counter[str]]:
    try:
        events = _FAST.decode(block)
    except msgspec.ValidationError:
        return _tolerant(block)
    by_type = Counter(map(type, events))
    phases = Counter({_PHASE[t]: n for t, n in by_type.items()})
    xs = [e for e in events if type(e) is _X] if by_type[_X] != len(events) else events
    rest = [e for e in events if type(e) in _KEPT_TYPES] if sum(by_type[t] for t in _KEPT_TYPES) else []
    del events
    frames = [_complete(xs, typed=True)]
    if rest:
        frames.append(_kept([_PHASE[type(e)] for e in rest], rest))
    frame = pl.concat(frames, how="vertical")
    return _exact_ts(frame, block, ordered=bool(rest)), phases


_KEPT_TYPES = frozenset(_KEPT.values())


def _complete(xs: list[Any], typed: bool = False) -> pl.DataFrame:
    """Complete events; ``typed``: decoded by the fast path, so ids are already ints or None."""
    col, n = _columns(xs), len(xs)
    ids = (lambda k: col(k, pl.Int64)) if typed else (lambda k: _ids(col(k, None)))
    return pl.DataFrame(
        {
            "ph": pl.repeat("X", n, dtype=pl.String, eager=True),
            "cat": col("cat", pl.String),
            "name": col("name", pl.String),
            "pid": ids("pid"),
            "tid": ids("tid"),
            "ts_ns": _us_to_ns(col("ts", pl.Float64)),
            "dur_ns": (col("dur", pl.Float64) * 1000).round().cast(pl.Int64),
            "id": pl.repeat(None, n, dtype=pl.String, eager=True),
            "external_id": col("args.external_id", pl.Int64),
            "correlation": col("args.correlation", pl.Int64),
            "arg_name": pl.repeat(None, n, dtype=pl.String, eager=True),
        }
    )


def _kept(phs: list[str], rest: list[Any]) -> pl.DataFrame:
    col = _columns(rest)
    return pl.DataFrame(
        {
            "ph": pl.Series(phs, dtype=pl.String),
            "cat": col("cat", pl.String),
            "name": col("name", pl.String),
            "pid": _ids(col("pid", None)),
            "tid": _ids(col("tid", None)),
            "ts_ns": _us_to_ns(col("ts", pl.Float64)),
            "dur_ns": pl.Series([None] * len(rest), dtype=pl.Int64),
            "id": pl.Series([None if e.id is None else str(e.id) for e in rest], dtype=pl.String),
            "external_id": col("args.external_id", pl.Int64),
            "correlation": col("args.correlation", pl.Int64),
            "arg_name": col("args.name", pl.String),
        }
    )


def _columns(events: list[Any]):
    def col(attr: str, dtype: pl.DataType | None) -> pl.Series:
        values = list(map(attrgetter(attr), events))
        return values if dtype is None else pl.Series(values, dtype=dtype, strict=False)

    return col


def _tolerant(block: bytes) -> tuple[pl.DataFrame, Counter[str]]:
    """Any JSON values: args that are not objects, ids of any type, numbers as strings."""
    events = _TOLERANT.decode(block)
    for e in events:
        if not isinstance(e.args, dict):
            e.args = {}
        e.args = _Args(e.args.get("External id"), e.args.get("correlation"), e.args.get("name"))
        e.ts = e.ts if isinstance(e.ts, (int, float)) and not isinstance(e.ts, bool) else None
        e.dur = e.dur if isinstance(e.dur, (int, float)) and not isinstance(e.dur, bool) else None
        e.ph = e.ph if isinstance(e.ph, str) else repr(e.ph)
    phases = Counter(e.ph for e in events)
    kept = [e for e in events if e.ph in KEPT_PHASES]
    x = [e for e in kept if e.ph == "X"]
    rest = [e for e in kept if e.ph != "X"]
    frame = pl.concat([_complete(x), _kept([e.ph for e in rest], rest)], how="vertical")
    return _exact_ts(frame, block, ordered=True), phases


def _ids(values: list[Any]) -> pl.Series:
    """pid/tid: ints as they are; a string id (generic traces name their processes) maps to a stable int."""
    series = pl.Series(values, dtype=pl.Int64, strict=False)
    if series.null_count() == values.count(None):
        return series
    return pl.Series([_stable_id(v) for v in values], dtype=pl.Int64)


def _stable_id(value: Any) -> int | None:
    if value is None or isinstance(value, int):
        return value
    text = str(value)
    if text.lstrip("-").isdigit():
        return int(text)
    return -(zlib.crc32(text.encode()) + 1)  # negative: never collides with a real OS pid


def _us_to_ns(us: pl.Series) -> pl.Series:
    """Whole µs and the fraction are converted separately so large values do not drift."""
    whole = us.floor()
    return whole.cast(pl.Int64) * 1000 + ((us - whole) * 1000).round().cast(pl.Int64)


def _exact_ts(frame: pl.DataFrame, block: bytes, ordered: bool) -> pl.DataFrame:
    """Where a float cannot hold 1 ns (absolute epoch µs with a fraction, e.g. ``1712195495519695.812``)
    the timestamps' text is parsed instead."""
    ts = frame["ts_ns"]
    if not len(ts) or (ts.abs().max() or 0) < _EXACT_FLOAT_US * 1000 or (ts % 1000 == 0).all():
        return frame
    raw = [e for e in _TEXT_TS.decode(block) if e.ph in KEPT_PHASES]
    if not ordered:  # the fast path put complete events first
        raw = [e for e in raw if e.ph == "X"] + [e for e in raw if e.ph != "X"]
    text = pl.Series([bytes(e.ts).decode() for e in raw], dtype=pl.String)
    return frame.with_columns(ts_ns=parse_us_text(text))


def parse_us_text(text: pl.Series) -> pl.Series:
    """Decimal µs text to int ns exactly (digits below 1 ns are dropped); exponent forms go through float."""
    parts = text.str.split_exact(".", 1).struct.unnest()
    whole, frac = parts["field_0"], parts["field_1"].fill_null("").str.slice(0, 3).str.pad_end(3, "0")
    sign = pl.select(pl.when(text.str.starts_with("-")).then(-1).otherwise(1)).to_series()
    exact = whole.cast(pl.Int64, strict=False) * 1000 + frac.cast(pl.Int64, strict=False) * sign
    plain = text.str.contains(r"^-?\d+(\.\d*)?$")
    approx = (text.cast(pl.Float64, strict=False) * 1000).round().cast(pl.Int64)
    return pl.select(pl.when(plain).then(exact).otherwise(approx)).to_series().rename("ts_ns")
