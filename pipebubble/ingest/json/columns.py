"""Per-field lists of one block's events to polars columns (``events.COLUMNS``): times to exact
nanoseconds, ids to int64, and the range checks, shared by the fast and the tolerant decode paths, with
the names both use for what they keep (``KEPT_PHASES``, the argument columns ``ARG_FIELDS``, allocator
events: ``MEMORY_EVENT``, ``MEMORY_FIELDS``).

A ``ts`` or ``dur`` whose nanoseconds do not lie strictly within ``±spans.TIME_LIMIT_NS`` gets
``skip = "out_of_range"``, a pid/tid that does not fit int64 ``skip = "id_out_of_range"``; the event is
counted, never cast with a wrap. A timestamp a float cannot hold to 1 ns (absolute epoch µs with a
fraction) is read again from its text (``exact_ts``).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import polars as pl

from pipebubble.spans import INT64, TIME_LIMIT_NS

# Floats below 2**43 µs still resolve 1 ns; at or above (absolute epoch µs with a fraction) the text is read.
_EXACT_FLOAT_US = 2.0**43
_LIMIT_US = TIME_LIMIT_NS / 1000
#: An allocator event's columns (null on every other event) and the argument of its ``[memory]`` event each
#: holds, as both decode paths name it.
MEMORY_FIELDS = {"mem_bytes": "bytes", "mem_allocated": "allocated", "mem_reserved": "reserved", "mem_type": "type",
                 "mem_device": "device"}
#: The span table's argument columns both decode paths fill (``spans.SCHEMA``'s), null on events without them:
#: ``bytes`` (a copy's or memset's ``bytes`` arg), ``flops`` (an operator's, ``with_flops=True``), ``dims`` and
#: ``dtypes`` (an operator's ``Input Dims`` and ``Input type``, as the JSON text written).
ARG_FIELDS: dict[str, Any] = {"bytes": pl.Int64, "flops": pl.Int64, "dims": pl.String, "dtypes": pl.String}

#: What the decode paths give for ``dims`` and ``dtypes``: each value's JSON text as written (``msgspec.Raw``'s),
#: ``""`` or null where absent, spaced as torch.profiler spaces it as the frame is built (``_torch_spacing``).
_RAW_ARGS = ("dims", "dtypes")
#: The phases both decode paths keep as rows (besides allocator events); every other phase is only counted.
KEPT_PHASES = ("X", "B", "E", "b", "e", "M")
#: The name torch.profiler gives its allocator events (instants, ``profile_memory=True``).
MEMORY_EVENT = "[memory]"
#: Instant phases: an allocator event is kept (as phase "i"), any other counted.
INSTANTS = ("i", "I")
#: What the phase counts call allocator events (they are instants, but not skipped ones).
MEMORY_PHASE = "memory"
#: The polars engine of a block's plans: the streaming engine's start-up costs more than the work of a block
#: (and of a small file's pairs and names); eager operations run in memory too.
ENGINE = "in-memory"


def build_frame(columns: dict[str, list | pl.Series], constants: dict[str, Any] | None = None) -> pl.DataFrame:
    """``COLUMNS`` (plus ``big``: ts needs its text read) from per-field lists: ``ts``/``dur`` in float µs,
    pid/tid as ints or strings, ``skip`` (optional) as reasons found while decoding. A field absent from
    ``columns`` takes its value in ``constants`` (default null) on every row: a block of complete events only
    builds no list of ``"X"`` nor of nulls. One query."""
    raw = _raw(columns)
    return raw.select(_converted(frozenset(raw.columns), tuple(sorted((constants or {}).items()))))


def build_plan(
    columns: dict[str, list | pl.Series], constants: dict[str, Any] | None = None
) -> pl.DataFrame | pl.LazyFrame:
    """``build_frame``'s frame as a plan, not yet run and without ``big``, when no timestamp can need its
    text read (every ``ts`` within ±2**43 µs): the caller's own queries run it, in the same pass. Else the
    frame itself, as ``build_frame`` gives it (``big`` included)."""
    raw = _raw(columns)
    exprs = _converted(frozenset(raw.columns), tuple(sorted((constants or {}).items())))
    if "ts" in raw.columns and _maybe_big(raw["ts"]):
        return raw.select(exprs)
    return raw.lazy().select(exprs[:-1])  # the last is ``big``


def _raw(columns: dict[str, list | pl.Series]) -> pl.DataFrame:
    """The fields as typed series (no query): pid/tid as ids (``id_bad`` when one does not fit int64)."""
    pid, pid_bad = _ids(columns["pid"])
    tid, tid_bad = _ids(columns["tid"])
    raw = {"pid": pid, "tid": tid}
    for name, dtype in _COLUMN_TYPES.items():
        if name in _RAW_ARGS and name in columns:
            raw[name] = _torch_spacing(columns[name], name)
        elif name in columns:
            raw[name] = pl.Series(columns[name], dtype=dtype, strict=dtype == pl.String)  # numbers: non-strict
    bad = [b for b in (pid_bad, tid_bad) if b is not None]
    if bad:
        raw["id_bad"] = bad[0] | bad[1] if len(bad) == 2 else bad[0]
    return pl.DataFrame(raw)


def _maybe_big(ts: pl.Series) -> bool:
    """Whether a ``ts`` may be ``big``: its largest or smallest value (NaN aside; NaN when all are) is not
    strictly within ±2**43 µs."""
    high, low = ts.max(), ts.min()
    return high is not None and not (high < _EXACT_FLOAT_US and low > -_EXACT_FLOAT_US)


@functools.lru_cache(maxsize=64)
def _converted(present: frozenset[str], constants: tuple[tuple[str, Any], ...]) -> list[pl.Expr]:
    """``build_frame``'s expressions for a frame of the ``present`` columns, the others ``constants`` (or
    null): built once per shape, as building them costs a small block more than running them."""
    fixed = dict(constants)

    def column(name: str) -> pl.Expr:
        return pl.col(name) if name in present else pl.lit(fixed.get(name), _COLUMN_TYPES[name]).alias(name)

    ts_us, dur_us = column("ts"), column("dur")
    ts_ok, dur_ok = _in_range(ts_us), _in_range(dur_us)
    out_of_range = (ts_us.is_not_null() & ~ts_ok) | (dur_us.is_not_null() & ~dur_ok)
    id_bad = pl.col("id_bad") if "id_bad" in present else pl.lit(False)
    return [
        column("ph"),
        column("cat"),
        column("name"),
        pl.col("pid"),
        pl.col("tid"),
        pl.when(ts_ok).then(_us_to_ns(ts_us)).alias("ts_ns"),
        pl.when(dur_ok).then((dur_us * 1000).round().cast(pl.Int64, strict=False)).alias("dur_ns"),
        column("id"),
        column("external_id"),
        column("correlation"),
        column("arg_name"),
        column("mb"),
        column("chunk"),
        pl.coalesce(
            column("skip"),
            pl.when(id_bad).then(pl.lit("id_out_of_range")),
            pl.when(out_of_range).then(pl.lit("out_of_range")),
        ).alias("skip"),
        *(column(name) for name in MEMORY_FIELDS),
        *(column(name) for name in ARG_FIELDS),
        (ts_ok.fill_null(False) & (ts_us.abs() >= _EXACT_FLOAT_US)).alias("big"),
    ]


#: Every field ``build_frame`` reads but pid/tid, and its type.
_COLUMN_TYPES: dict[str, Any] = {
    "ph": pl.String,
    "cat": pl.String,
    "name": pl.String,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "id": pl.String,
    "external_id": pl.Int64,
    "correlation": pl.Int64,
    "arg_name": pl.String,
    "mb": pl.Int64,
    "chunk": pl.Int64,
    "skip": pl.String,
    **dict.fromkeys(MEMORY_FIELDS, pl.Int64),
    **ARG_FIELDS,
}
#: Text torch.profiler never writes in a list argument (another layout's whitespace), per argument.
_UNSPACED = {"dims": r"\s\s|[\n\r\t]|,\S|[^,]\s", "dtypes": r'[\n\r\t]|","|,\s\s|"\s+,|\[\s|\s\]'}


def _torch_spacing(raw: list[str | None], name: str) -> pl.Series:
    """A list argument's JSON texts (``raw``: as written; ``""`` or null where absent) as torch.profiler writes
    them, whatever the file's layout (an indented or a compact rewrite reads the same): one space after each
    comma between items, no other whitespace outside strings (``[[4096, 4096], []]``, ``["float", "long
    int"]``); null where absent or JSON ``null``. Torch's own text is left as it is, after one search shows
    there is nothing to respace. Dims hold numbers only; a type's name holds no quote, so ``", "`` bounds its
    items."""
    if raw.count(None) == len(raw):  # most blocks: no operator records its inputs
        return pl.Series(name, raw, dtype=pl.String)
    text = pl.Series(name, raw, dtype=pl.String)
    text = text.to_frame().select(pl.when(~pl.col(name).is_in(["", "null"])).then(pl.col(name))).to_series()
    if not text.str.contains(_UNSPACED[name]).any():
        return text
    if name == "dims":
        spaced = pl.col(name).str.replace_all(r"\s+", "").str.replace_all(",", ", ", literal=True)
    else:
        spaced = pl.col(name).str.replace_all(r'"\s*,\s*"', '", "').str.replace_all(r"^\[\s+", "[").str.replace_all(
            r"\s+\]$", "]")
    return text.to_frame().select(pl.when(pl.col(name) != "null").then(spaced)).to_series()


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


def _ids(values: list[Any]) -> tuple[pl.Series, pl.Series | None]:
    """pid/tid: ints as they are; a string id (generic traces name their processes) maps to a stable int.
    Also a mask of ids that do not fit int64 (their value is null); None when every id is an int64."""
    try:  # strict: a string is never parsed as a number here, so every block maps it the same way
        return pl.Series(values, dtype=pl.Int64, strict=True), None
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
        return value if -INT64 <= value < INT64 else _TOO_BIG
    text = str(value)
    digits = text[1:] if text[:1] == "-" else text
    if digits.isascii() and digits.isdigit():
        if len(digits) > 19:
            return _TOO_BIG
        number = int(text)
        return number if -INT64 <= number < INT64 else _TOO_BIG
    return -(zlib.crc32(text.encode()) + 1)  # negative: never collides with a real OS pid
