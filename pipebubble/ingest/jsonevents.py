"""Typed decoding of one block of Chrome-trace events straight into polars columns.

The fast path is a msgspec tagged union on ``ph``: complete events (``X``) decode into a small typed
struct holding only the fields we use, flows/counters/instants into empty structs that are only counted.
A block the fast path rejects (an unknown phase, a string where a number belongs, a name that is not a
string) is decoded again by the tolerant path (``jsontolerant``), which gives the same columns for the same
events. Before either, a block's invalid UTF-8 is replaced; a block too deeply nested for the decoder has
its deep values replaced by ``null`` (``jsonbytes``).

Times are checked here: a ``ts`` or ``dur`` whose nanoseconds do not lie strictly within
``±spans.TIME_LIMIT_NS`` gets ``skip = "out_of_range"``, a pid/tid that does not fit int64
``skip = "id_out_of_range"``; the event is counted, never cast with a wrap.
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Union

import msgspec
import polars as pl

from pipebubble.ingest import jsonbytes
from pipebubble.spans import TIME_LIMIT_NS

# Floats below 2**43 µs still resolve 1 ns; at or above (absolute epoch µs with a fraction) the text is read.
_EXACT_FLOAT_US = 2.0**43
_LIMIT_US = TIME_LIMIT_NS / 1000
_INT64 = 2**63
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
    "skip": pl.String,
}
KEPT_PHASES = ("X", "B", "E", "b", "e", "M")


@dataclass
class BlockEvents:
    """One block's kept events (``COLUMNS``), a count of every phase, and the repairs made to its text
    (``utf8``: sequences replaced; ``deep``: 1 when values nested too deep were nulled)."""

    frame: pl.DataFrame
    phases: Counter[str]
    repairs: Counter[str] = field(default_factory=Counter)


class _Args(msgspec.Struct, frozen=True, gc=False):
    external_id: int | None = msgspec.field(default=None, name="External id")
    correlation: int | None = None
    name: str | None = None  # process/thread names in metadata events


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


class _Counted(msgspec.Struct, tag_field="ph", gc=False):
    """Flows, counters, instants, samples, objects: counted, not kept."""


_KEPT = {ph: msgspec.defstruct(f"_{ph}", [], bases=(_Kept,), tag=ph) for ph in ("B", "E", "b", "e", "M")}
_COUNTED = {
    ph: msgspec.defstruct(f"_c{ord(ph)}", [], bases=(_Counted,), tag=ph)
    for ph in ("s", "t", "f", "C", "i", "I", "n", "R", "O", "N", "D", "P", "(", ")", "S", "T", "p", "F")
}
_PHASE = {_X: "X", **{cls: ph for ph, cls in (_KEPT | _COUNTED).items()}}
_FAST = msgspec.json.Decoder(list[Union[(_X, *_KEPT.values(), *_COUNTED.values())]])  # type: ignore[misc]  # noqa: UP007
_KEPT_TYPES = frozenset(_KEPT.values())


class _EventTs(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw(b"")


_TEXT_TS = msgspec.json.Decoder(list[_EventTs])


class BlockError(Exception):
    """A block that is not valid JSON even after repair: the decoder's message, the offset in the block as
    given (None when the input simply ran out) and whether only its end is missing."""

    def __init__(self, message: str, offset: int | None, truncated: bool) -> None:
        super().__init__(message, offset, truncated)
        self.message, self.offset, self.truncated = message, offset, truncated


def decode_block(block: bytes) -> BlockEvents:
    """The kept events of ``block`` (a JSON array) as columns, a count of every phase, and repairs made.
    Raises BlockError when the block is not valid JSON even after repair."""
    repairs: Counter[str] = Counter()
    fixed, replaced, shifts = jsonbytes.fix_unicode(block)
    if replaced:
        repairs["utf8"] = replaced
    deep: list[tuple[int, int]] = []
    try:
        try:
            return _decode(fixed, repairs)
        except RecursionError:
            fixed, deep = jsonbytes.flatten_deep(fixed)
            repairs["deep"] = 1
            return _decode(fixed, repairs)
    except msgspec.DecodeError as exc:
        exc = _syntax_error(fixed) or exc
        length = len(fixed)
        truncated = jsonbytes.is_truncation(exc, length)
        at = jsonbytes.original_offset(jsonbytes.error_offset(exc, length), deep)
        offset = None if "truncated" in str(exc) else jsonbytes.original_offset(at, shifts)
        raise BlockError(jsonbytes.one_line(exc), offset, truncated) from None


_SYNTAX = msgspec.json.Decoder(list[msgspec.Raw])


def _syntax_error(block: bytes) -> msgspec.DecodeError | None:
    """The syntax error in ``block`` as one decoder words it, whichever typed decoder met it first."""
    try:
        _SYNTAX.decode(block)
    except msgspec.DecodeError as exc:
        return exc
    return None


def _decode(block: bytes, repairs: Counter[str]) -> BlockEvents:
    try:
        frame, phases = _decode_fast(block)
    except msgspec.ValidationError:
        from pipebubble.ingest.jsontolerant import decode_tolerant

        frame, phases = decode_tolerant(block)
    return BlockEvents(frame, phases, repairs)


def _decode_fast(block: bytes) -> tuple[pl.DataFrame, Counter[str]]:
    events = _FAST.decode(block)
    by_type = Counter(map(type, events))
    phases = Counter({_PHASE[t]: n for t, n in by_type.items()})
    all_x = by_type[_X] == len(events)
    xs = events if all_x else [e for e in events if type(e) is _X]
    has_rest = any(by_type[t] for t in _KEPT_TYPES)
    rest = [e for e in events if type(e) in _KEPT_TYPES] if has_rest else []
    col = _joined(_columns(xs), _columns(rest), len(rest))
    columns = {
        "ph": ["X"] * len(xs) + [_PHASE[type(e)] for e in rest] if rest else _repeat("X", len(xs)),
        **{k: col(k) for k in ("cat", "name", "pid", "tid", "ts", "args.external_id", "args.correlation")},
        "dur": col("dur", rest=[None] * len(rest)),
        "id": [None] * len(xs) + [_id_text(e.id) for e in rest] if rest else _repeat(None, len(xs)),
        "arg_name": col("args.name", xs=[None] * len(xs)) if rest else _repeat(None, len(xs)),
    }
    columns["external_id"], columns["correlation"] = columns.pop("args.external_id"), columns.pop("args.correlation")
    del xs, rest
    frame = build_frame(columns)
    if frame["big"].any():

        def positions() -> list[int]:
            kept = [i for i, e in enumerate(events) if type(e) in _KEPT_TYPES] if has_rest else []
            x = range(len(events)) if all_x else [i for i, e in enumerate(events) if type(e) is _X]
            return [*x, *kept]

        raw = _TEXT_TS.decode(block)
        frame = exact_ts(frame, [bytes(raw[i].ts) for i in positions()])
    return frame.drop("big"), phases


def _repeat(value: str | None, n: int) -> pl.Series:
    return pl.repeat(value, n, dtype=pl.String, eager=True)


def _columns(events: list[Any]):
    def col(attr: str) -> list:
        return list(map(attrgetter(attr), events))

    return col


def _joined(col_x, col_r, n_rest: int):
    """A column over the complete events then the others, without copying when there are no others."""

    def col(attr: str, xs: list | None = None, rest: list | None = None) -> list:
        head = col_x(attr) if xs is None else xs
        if not n_rest:
            return head
        return head + (col_r(attr) if rest is None else rest)

    return col


def build_frame(columns: dict[str, list]) -> pl.DataFrame:
    """``COLUMNS`` (plus ``big``: ts needs its text read) from per-field lists: ``ts``/``dur`` in float µs,
    pid/tid as ints or strings, ``skip`` (optional) as reasons found while decoding."""
    pid, pid_bad = _ids(columns["pid"])
    tid, tid_bad = _ids(columns["tid"])
    n = len(pid)
    frame = pl.DataFrame(
        {
            "ph": pl.Series(columns["ph"], dtype=pl.String),
            "cat": pl.Series(columns["cat"], dtype=pl.String),
            "name": pl.Series(columns["name"], dtype=pl.String),
            "pid": pid,
            "tid": tid,
            "ts_us": pl.Series(columns["ts"], dtype=pl.Float64, strict=False),
            "dur_us": pl.Series(columns["dur"], dtype=pl.Float64, strict=False),
            "id": pl.Series(columns["id"], dtype=pl.String),
            "external_id": pl.Series(columns["external_id"], dtype=pl.Int64, strict=False),
            "correlation": pl.Series(columns["correlation"], dtype=pl.Int64, strict=False),
            "arg_name": pl.Series(columns["arg_name"], dtype=pl.String),
            "id_bad": pid_bad | tid_bad,
            "skip": pl.Series(columns.get("skip") or [None] * n, dtype=pl.String),
        }
    )
    ts_ok, dur_ok = _in_range(pl.col("ts_us")), _in_range(pl.col("dur_us"))
    out_of_range = (pl.col("ts_us").is_not_null() & ~ts_ok) | (pl.col("dur_us").is_not_null() & ~dur_ok)
    return frame.select(
        "ph",
        "cat",
        "name",
        "pid",
        "tid",
        ts_ns=pl.when(ts_ok).then(_us_to_ns(pl.col("ts_us"))),
        dur_ns=pl.when(dur_ok).then((pl.col("dur_us") * 1000).round().cast(pl.Int64, strict=False)),
        id="id",
        external_id="external_id",
        correlation="correlation",
        arg_name="arg_name",
        skip=pl.coalesce(
            "skip",
            pl.when(pl.col("id_bad")).then(pl.lit("id_out_of_range")),
            pl.when(out_of_range).then(pl.lit("out_of_range")),
        ),
        big=ts_ok.fill_null(False) & (pl.col("ts_us").abs() >= _EXACT_FLOAT_US),
    )


def _in_range(us: pl.Expr) -> pl.Expr:
    """Finite and strictly within the time limit (NaN compares false)."""
    return us.abs() < _LIMIT_US


def _us_to_ns(us: pl.Expr) -> pl.Expr:
    """Whole µs and the fraction are converted separately so large values do not drift."""
    whole = us.floor()
    return whole.cast(pl.Int64, strict=False) * 1000 + ((us - whole) * 1000).round().cast(pl.Int64, strict=False)


def exact_ts(frame: pl.DataFrame, texts: list[bytes]) -> pl.DataFrame:
    """``ts_ns`` from each event's own timestamp text (``texts[i]`` belongs to row ``i``) where a float cannot
    hold 1 ns (``big``: absolute epoch µs with a fraction, e.g. ``1712195495519695.812``)."""
    big = frame["big"]
    text = pl.Series([t.decode("utf-8", "replace") for t in texts], dtype=pl.String).filter(big)
    exact = pl.Series([None] * frame.height, dtype=pl.Int64).scatter(big.arg_true(), parse_us_text(text))
    usable = pl.col("big") & (pl.col("exact").abs() < TIME_LIMIT_NS)
    return (
        frame.with_columns(exact=exact)
        .with_columns(ts_ns=pl.when(usable).then("exact").otherwise("ts_ns"))
        .drop("exact")
    )


def parse_us_text(text: pl.Series) -> pl.Series:
    """Decimal µs text to int ns exactly (digits below 1 ns are dropped); exponent forms go through float."""
    parts = text.str.split_exact(".", 1).struct.unnest()
    whole, frac = parts["field_0"], parts["field_1"].fill_null("").str.slice(0, 3).str.pad_end(3, "0")
    sign = pl.select(pl.when(text.str.starts_with("-")).then(-1).otherwise(1)).to_series()
    plain = text.str.contains(r"^-?\d{1,16}(\.\d*)?$")
    exact = whole.cast(pl.Int64, strict=False) * 1000 + frac.cast(pl.Int64, strict=False) * sign
    approx = (text.cast(pl.Float64, strict=False) * 1000).round()
    approx = pl.select(pl.when(approx.abs() < TIME_LIMIT_NS).then(approx)).to_series().cast(pl.Int64, strict=False)
    return pl.select(pl.when(plain).then(exact).otherwise(approx)).to_series().rename("ts_ns")


def _ids(values: list[Any]) -> tuple[pl.Series, pl.Series]:
    """pid/tid: ints as they are; a string id (generic traces name their processes) maps to a stable int.
    Also a mask of ids that do not fit int64 (their value is null)."""
    try:  # strict: a string is never parsed as a number here, so every block maps it the same way
        return pl.Series(values, dtype=pl.Int64, strict=True), pl.repeat(False, len(values), eager=True)
    except (TypeError, OverflowError):
        pass
    ids = [_stable_id(v) for v in values]
    bad = pl.Series([v is _TOO_BIG for v in ids], dtype=pl.Boolean)
    return pl.Series([None if v is _TOO_BIG else v for v in ids], dtype=pl.Int64), bad


_TOO_BIG = object()


def _stable_id(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, int):
        return value if -_INT64 <= value < _INT64 else _TOO_BIG
    text = str(value)
    digits = text[1:] if text[:1] == "-" else text
    if digits.isascii() and digits.isdigit():
        if len(digits) > 19:
            return _TOO_BIG
        number = int(text)
        return number if -_INT64 <= number < _INT64 else _TOO_BIG
    return -(zlib.crc32(text.encode()) + 1)  # negative: never collides with a real OS pid


def _id_text(value: Any) -> str | None:
    """An async event's id as text: strings as they are, ints that fit int64 in decimal, else null."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64:
        return str(value)
    return None
