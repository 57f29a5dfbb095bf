"""Chrome-trace JSON (and torch.profiler/Kineto, which writes it) into the span table.

Kineto facts (checked on real files): ``ts``/``dur`` are µs whatever ``displayTimeUnit`` says; ``ts`` is
relative to ``baseTimeNanoseconds`` when the header has it, else absolute epoch µs; GPU events carry
``pid`` = device and ``tid`` = stream; the rank comes from ``distributedInfo.rank``, never from a pid.

Decoding the JSON is ``jsontrace``; pairing ``B``/``E`` and async ``b``/``e`` events is ``jsonpairs``.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from concurrent.futures import Executor
from functools import partial
from pathlib import Path

import polars as pl

from pipebubble import spans
from pipebubble.ingest import jsonpairs, jsontrace
from pipebubble.ingest.base import FileResult

# Category -> kind. Old Kineto names (Kernel, Memcpy, Runtime) included; matching is case-insensitive.
CATEGORY_KINDS = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "cuda_driver": "runtime",
    "hip_runtime": "runtime",
    "cuda_sync": "sync",
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "annotation",
    "gpu_user_annotation": "gpu_annotation",
    "python_function": "annotation",  # Python stack frames label time; they are not work of their own
}
#: Kinds whose events sit on a GPU (pid = device, tid = stream).
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync_gpu")
HOST_SYNC = r"(?i)synchronize"
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_NOT_SPANS = {
    "s": "flow",
    "t": "flow",
    "f": "flow",
    "C": "counter",
    "M": "metadata",
    "i": "instant",
    "I": "instant",
    "n": "instant",
    "R": "instant",
    "O": "object",
    "N": "object",
    "D": "object",
    "P": "sample",
    "<not an object>": "not_an_event",
}
_INT32 = 2**31
#: Begin/end and async begin/end events: paired into spans after every block is decoded.
PAIRED_PHASES = ("B", "E", "b", "e")


def read(
    path: Path,
    position: int = 0,
    pool: Executor | None = None,
    scratch: Path | None = None,
    spill: Path | None = None,
) -> FileResult:
    """Read one Chrome/Kineto JSON trace (``.json`` or ``.json.gz``); ``pool`` decodes blocks in parallel,
    ``scratch`` holds a big trace's gunzipped text meanwhile. Complete events become spans where their
    block was decoded; only B/E, async and metadata events (few) come back here to be paired and named.
    With ``spill``, spans go to Parquet files in that folder instead of memory (``meta["spill"]``)."""

    def finish(header: dict) -> jsontrace.Finish:
        rank, base = _rank(header, path, position)[0], header.get("base_time_ns") or 0
        return partial(block_spans, source=str(path), rank=rank, base=base, spill=str(spill) if spill else None)

    with jsontrace.opened(path, scratch) as trace:
        decoded = jsontrace.decode(path, trace.data, pool, finish, trace.disk)
        gzip_warning = trace.warning
    header, events = decoded.header, decoded.events
    rank, rank_warning = _rank(header, path, position)
    skipped = _not_spans(decoded.phases) + decoded.skipped
    parts = list(decoded.spans)
    if any(decoded.phases[ph] for ph in PAIRED_PHASES):  # most traces have none to pair
        paired, unmatched = jsonpairs.paired_spans(events)
        skipped.update(unmatched)
        paired_spans, off_device = _to_spans(paired, str(path), rank)
        skipped.update(off_device)
        parts.append(paired_spans)
    table = pl.concat(parts, how="vertical") if parts else spans.empty()
    spilled = {}
    if spill is not None:
        _write_part(table, str(spill))
        table, spilled = (
            table.clear(),
            {"spill": str(spill), "spans": _spilled_rows(spill)},
        )
    warnings = [w for w in (gzip_warning, rank_warning) if w] + decoded.warnings + _repair_warnings(path, decoded)
    if decoded.unread_bytes:
        warnings.append(
            f"{path}: trace cut off; read up to its last whole event, {decoded.unread_bytes} bytes unreadable"
        )
    meta = {
        **header,
        "rank": rank,
        "unread_bytes": decoded.unread_bytes,
        "process_names": _names(events, "process_name"),
        "thread_names": _names(events, "thread_name"),
        **spilled,
    }
    fmt = "kineto" if header.get("kineto") else "chrome"
    return FileResult(str(path), table, decoded.phases.total(), skipped, warnings, meta, fmt)


def _repair_warnings(path: Path, decoded: jsontrace.Decoded) -> list[str]:
    """One line per kind of repair the JSON text needed before it could be read."""
    out = []
    if decoded.repairs["utf8"]:
        out.append(f"{path}: {decoded.repairs['utf8']} invalid UTF-8 sequences or lone surrogates replaced by U+FFFD")
    if decoded.repairs["deep"]:
        out.append(f"{path}: values nested too deep to decode were replaced by null")
    return out


def _rank(header: dict, path: Path, position: int) -> tuple[int, str | None]:
    """``distributedInfo.rank`` (checked to fit Int32 when the header was read), else a ``rank-N``/``rankN``
    file name, else the file's position; a file name whose rank does not fit Int32 is ignored, with a
    warning."""
    if header.get("rank") is not None:
        return header["rank"], None
    match = _RANK_IN_NAME.search(path.name)
    if match is None:
        return position, None
    digits = match.group(1).lstrip("0") or "0"
    if len(digits) <= 10 and int(digits) < _INT32:
        return int(digits), None
    return position, f"{path}: rank in the file name does not fit Int32; using the file's position {position}"


def block_spans(
    events: pl.DataFrame, source: str, rank: int, base: int, spill: str | None = None
) -> tuple[pl.DataFrame, pl.DataFrame, Counter, list[str]]:
    """One block's complete events as spans (written to a Parquet file in ``spill`` instead, when given);
    the events to pair or name later (with ``base`` added), the count of events not kept, and the file
    written.

    ``ts_ns`` and ``base`` both lie strictly within ±2**62, so their sum cannot overflow; a sum beyond the
    limit marks the event ``out_of_range``."""
    limit = spans.TIME_LIMIT_NS
    ts = pl.col("ts_ns") + base
    events = events.with_columns(
        ts_ns=pl.when(ts.abs() < limit).then(ts),
        skip=pl.coalesce("skip", pl.when(ts.abs() >= limit).then(pl.lit("out_of_range"))),
    )
    complete, skipped = _complete_spans(events)
    rest = events.filter(pl.col("ph").is_in(["B", "E", "b", "e", "M"]))
    table, off_device = _to_spans(complete, source, rank)
    skipped.update(off_device)
    written = []
    if spill is not None:
        written = _write_part(table, spill)
        table = table.clear()
    return rest, table, skipped, written


def _spilled_rows(folder: Path) -> int:
    """Rows in the parts written to a spill folder (none when the trace has no span)."""
    written = sorted(Path(folder).glob("part-*.parquet"))
    return pl.scan_parquet(written).select(pl.len()).collect().item() if written else 0


def _write_part(table: pl.DataFrame, folder: str) -> list[str]:
    """One part of a spilled span table, sorted by start so a time window reads few row groups; lz4, as the
    cache's tables (twice zstd's size, half its time to write and to read back)."""
    if not table.height:
        return []
    part = Path(folder) / f"part-{uuid.uuid4().hex}.parquet"
    table.sort("start").write_parquet(part, row_group_size=256_000, compression="lz4")
    return [str(part)]


def _not_spans(phases: Counter[str]) -> Counter[str]:
    """Every phase that never becomes a span, counted by what it is."""
    skipped: Counter[str] = Counter()
    for ph, n in phases.items():
        if ph not in ("X", "B", "E", "b", "e"):
            skipped[_NOT_SPANS.get(ph, f"phase {ph!r}")] += n
    return skipped


def _complete_spans(events: pl.DataFrame) -> tuple[pl.DataFrame, Counter[str]]:
    """``X`` events with a valid time as span rows; those without, and Kineto's own profile span, counted.
    Start and duration are each below 2**62, so their sum cannot overflow; an end beyond the limit is
    ``out_of_range``."""
    x = events.filter(pl.col("ph") == "X")
    end = pl.col("ts_ns") + pl.col("dur_ns")
    reason = pl.coalesce(
        "skip",
        pl.when(pl.col("ts_ns").is_null() | pl.col("dur_ns").is_null() | (pl.col("dur_ns") < 0)).then(
            pl.lit("bad_time")
        ),
        pl.when(end >= spans.TIME_LIMIT_NS).then(pl.lit("out_of_range")),
        pl.when(pl.col("cat") == "Trace").then(pl.lit("profiler_trace")),  # Kineto's own whole-profile span
    )
    x = x.with_columns(reason=reason)
    skipped = jsonpairs.count(x["reason"])
    return x.filter(pl.col("reason").is_null()).select(
        "cat",
        "name",
        "pid",
        "tid",
        "external_id",
        "correlation",
        start=pl.col("ts_ns"),
        end=end,
    ), skipped


def _to_spans(raw: pl.DataFrame, source: str, rank: int) -> tuple[pl.DataFrame, Counter[str]]:
    """Categories to kinds, GPU events to (device, stream), lanes named; GPU events whose pid (the device)
    does not fit Int32 are counted as ``device_out_of_range``. Names and ids repeat heavily, so the regexes
    and string formatting run once per distinct value and are joined back."""
    kinds = raw.select("cat", "name").unique().with_columns(kind=_kind(), on_device=_on_device())
    frame = raw.join(kinds, on=["cat", "name"], how="left", nulls_equal=True, maintain_order="left")
    off = frame["on_device"] & ((frame["pid"] < -_INT32) | (frame["pid"] >= _INT32)).fill_null(False)
    skipped = Counter({"device_out_of_range": off.sum()}) if off.any() else Counter()
    frame = frame.filter(~off).with_columns(
        device=pl.when("on_device").then(pl.col("pid")),
        stream=pl.when("on_device").then(pl.col("tid")),
        pid=pl.when("on_device").then(None).otherwise(pl.col("pid")),
        tid=pl.when("on_device").then(None).otherwise(pl.col("tid")),
    )
    ids = ["on_device", "pid", "tid", "device"]
    lanes = (
        frame.select(ids)
        .unique()
        .with_columns(
            lane=pl.when("on_device")
            .then(pl.format("rank{}/gpu{}", pl.lit(rank), pl.col("device")))
            .otherwise(pl.format("rank{}/pid{}/tid{}", pl.lit(rank), pl.col("pid"), pl.col("tid")))
        )
    )
    frame = frame.join(lanes, on=ids, how="left", nulls_equal=True, maintain_order="left")
    return spans.conform(frame.with_columns(source=pl.lit(source), rank=pl.lit(rank))), skipped


def _kind() -> pl.Expr:
    mapped = pl.col("cat").str.to_lowercase().replace_strict(CATEGORY_KINDS, default="cpu_op")
    return (
        pl.when(pl.col("name").str.starts_with("ProfilerStep#"))
        .then(pl.lit("step"))
        .when((mapped == "kernel") & pl.col("name").str.contains(spans.COMM_KERNELS))
        .then(pl.lit("comm"))
        .when((mapped == "annotation") & pl.col("name").str.contains(spans.COLLECTIVE_RANGES))
        .then(pl.lit("comm"))
        .when((mapped == "runtime") & pl.col("name").str.contains(HOST_SYNC))
        .then(pl.lit("sync"))
        .otherwise(mapped)
    )


def _on_device() -> pl.Expr:
    on = (
        pl.col("cat")
        .str.to_lowercase()
        .is_in(["kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset", "gpu_user_annotation", "cuda_sync"])
    )
    return on.fill_null(False)


def _names(events: pl.DataFrame, which: str) -> dict[str, str]:
    rows = events.filter((pl.col("ph") == "M") & (pl.col("name") == which) & pl.col("arg_name").is_not_null())
    key = ["pid"] if which == "process_name" else ["pid", "tid"]
    out = rows.select(
        key=pl.concat_str([pl.col(k).cast(pl.String) for k in key], separator="/"), value=pl.col("arg_name")
    )
    return dict(out.unique("key", keep="last").iter_rows())
