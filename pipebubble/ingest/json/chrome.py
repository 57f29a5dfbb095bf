"""Chrome-trace JSON (and torch.profiler/Kineto, which writes it) into the span table.

Kineto facts (checked on real files): ``ts``/``dur`` are µs whatever ``displayTimeUnit`` says; ``ts`` is
relative to ``baseTimeNanoseconds`` when the header has it, else absolute epoch µs; GPU events carry
``pid`` = device and ``tid`` = stream; the rank comes from ``distributedInfo.rank``, never from a pid.

Decoding the JSON is ``trace``; a block's events become span rows in ``spans``; pairing ``B``/``E`` and async
``b``/``e`` events is ``pairs``.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import polars as pl

from pipebubble import allocations, spans
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.json import pairs
from pipebubble.ingest.json import trace as jsontrace
from pipebubble.ingest.json.columns import ARG_FIELDS, ENGINE, MEMORY_PHASE
from pipebubble.ingest.json.events import COLUMNS
from pipebubble.ingest.json.spans import FOREIGN, PAIRED_PHASES, block_spans, span_plans, to_spans, write_part

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
    return _result(path, position, decoded, gzip_warning, spill)


@dataclass
class Pending:
    """A small trace decoded, its spans not yet made: ``read_batch`` makes a batch's in one plan."""

    path: Path
    position: int
    decoded: jsontrace.Decoded  # ``events``: a plan of the file's kept events
    gzip_warning: str | None = None


def decode_pending(path: Path, position: int = 0) -> Pending:
    """``read``'s first half for a small trace (in memory, on this core): the file decoded, each block's
    events left a plan for ``read_batch`` to run with the other files' (a small file's fixed cost is its
    queries). Raises what ``read`` raises for the same file."""
    with jsontrace.opened(path) as trace:
        decoded = jsontrace.decode(path, trace.data, None, lambda header: _deferred)
        return Pending(path, position, decoded, trace.warning)


def _deferred(
    events: pl.DataFrame | pl.LazyFrame, phases: Counter[str] | None = None
) -> tuple[pl.LazyFrame, None, Counter, list[str], None]:
    """A block's work put off (``decode_pending``): its events as a plan, nothing made of them yet."""
    return events.lazy(), None, Counter(), [], None


def read_batch(files: list[Pending]) -> list[FileResult]:
    """Each decoded file as ``read`` gives it. Their spans, counts of events not kept, allocator events and
    events left to pair or name come from one plan over all their events (``span_plans``, each file's
    source, rank and base looked up by its place in the batch), split by file; what only some files have
    (pairs, names, allocator totals) is done for those alone."""
    if not files:
        return []
    events = pl.concat([f.decoded.events.lazy().with_columns(pl.lit(k, pl.Int32).alias(_FILE))
                        for k, f in enumerate(files)], how="vertical").collect(engine=ENGINE)  # run once, not per plan
    phases = sum((f.decoded.phases for f in files), Counter())
    ranks = [_rank(f.decoded.header, f.path, f.position)[0] for f in files]
    each = partial(_of_file, pl.col(_FILE))
    plans = span_plans(events, each([str(f.path) for f in files], pl.String), each(ranks, pl.Int64),
                       each([f.decoded.header.get("base_time_ns") or 0 for f in files], pl.Int64), phases, (_FILE,))
    got = dict(zip(plans, pl.collect_all(list(plans.values()), engine=ENGINE), strict=True))
    kept = _operator_ids(got["table"], len(files))
    tables, rests = _by_file(got["table"], len(files)), _by_file(got.get("rest"), len(files))
    memory = _by_file(got.get("memory"), len(files))
    skipped = [Counter() for _ in files]
    for reasons in (got["reasons"], got.get("memory_reasons")):
        for k, reason, n in reasons.iter_rows() if reasons is not None else ():
            skipped[k][reason] += n
    no_rest = pl.DataFrame(schema=COLUMNS)
    return [
        _result(f.path, f.position, replace(f.decoded, events=no_rest if rest is None else rest, spans=[table],
                                            skipped=skip, memory=[mem] if mem is not None and mem.height else []),
                f.gzip_warning, ids=ids)
        for f, table, rest, mem, skip, ids in zip(files, tables, rests, memory, skipped, kept, strict=True)
    ]


#: The column a batch's plan tells its files apart by: each file's place in the batch.
_FILE = "file"


def _of_file(file: pl.Expr, values: list, dtype: pl.DataType) -> pl.Expr:
    """Each row's value of its file (``values``, by place in the batch)."""
    return pl.lit(pl.Series(values, dtype=dtype)).gather(file)


def _by_file(frame: pl.DataFrame | None, files: int) -> list[pl.DataFrame | None]:
    """A batch's rows split by file (``_FILE`` dropped): each file's are one run, in file order, as every
    plan keeps its rows' order; None for every file without ``frame``."""
    if frame is None:
        return [None] * files
    counts = dict(frame.drop_in_place(_FILE).value_counts().iter_rows())
    rows = [counts.get(k, 0) for k in range(files)]
    return [frame.slice(start, n) for start, n in zip(itertools.accumulate(rows, initial=0), rows, strict=False)]


def _result(
    path: Path, position: int, decoded: jsontrace.Decoded, gzip_warning: str | None, spill: Path | None = None,
    ids: list[int] | None | object = ...,
) -> FileResult:
    """A decoded file whose blocks' spans are made: its B/E and async events paired, its names read, its
    parts put together (and spilled, with ``spill``)."""
    header, events = decoded.header, decoded.events
    rank, rank_warning = _rank(header, path, position)
    skipped = _not_spans(decoded.phases) + decoded.skipped
    parts = list(decoded.spans)
    if any(decoded.phases[ph] for ph in PAIRED_PHASES):  # most traces have none to pair
        paired, unmatched = pairs.paired_spans(events)
        skipped.update(unmatched)
        no_args = [pl.lit(None, dtype).alias(name) for name, dtype in ARG_FIELDS.items()]  # a pair's: none kept
        table, reasons = to_spans(paired.lazy().with_columns(*no_args, reason=pl.lit(None, pl.String)),
                                  pl.lit(str(path)), pl.lit(rank), paired.height)
        paired_spans, reasons = pl.collect_all([table, reasons], engine=ENGINE)
        skipped.update(Counter(dict(reasons.iter_rows())))
        parts.append(paired_spans)
    table = pl.concat(parts, how="vertical") if parts else spans.empty()
    process_names, thread_names = _names(events) if decoded.phases["M"] else ({}, {})
    table = _named_stages(table, thread_names)
    memory = allocations.with_running_totals(pl.concat(decoded.memory)) if decoded.memory else None
    spilled = {}
    if spill is not None:
        write_part(table, str(spill))
        written = sorted(Path(spill).glob("part-*.parquet"))  # the spans: the blocks' parts and these
        ids = _operator_ids(pl.scan_parquet(written).with_columns(pl.lit(0, pl.Int32).alias(_FILE)), 1)[0] if (
            written) else None
        table, spilled = (
            table.clear(),
            {"spill": str(spill), "spans": _spilled_rows(spill)},
        )
    kept = _operator_ids(table.with_columns(pl.lit(0, pl.Int32).alias(_FILE)), 1)[0] if ids is ... else ids
    fmt = "kineto" if header.get("kineto") else "chrome"
    foreign = _foreign(path, skipped, fmt)
    warnings = [w for w in (gzip_warning, rank_warning, foreign) if w] + decoded.warnings + _repair_warnings(
        path, decoded)
    if decoded.unread_bytes:
        warnings.append(
            f"{path}: trace cut off; read up to its last whole event, {decoded.unread_bytes} bytes unreadable"
        )
    meta = {
        **header,
        "rank": rank,
        "unread_bytes": decoded.unread_bytes,
        "process_names": process_names,
        "thread_names": thread_names,
        "operator_ids": kept,
        **spilled,
    }
    return FileResult(str(path), table, decoded.phases.total(), skipped, warnings, meta, fmt, memory)


def _operator_ids(table: pl.DataFrame | pl.LazyFrame, files: int) -> list[list[int] | None]:
    """Per file of ``table`` (its rows' ``_FILE``), [kept, range]: how many distinct operator ids (Kineto's
    ``External id`` of its ``cpu_op`` events, which the profiler numbers one by one) the file holds, and how
    many its lowest to highest span. A complete trace holds nearly all of its range; a filtered or sampled one
    (events removed after profiling) a few. None without them. One query for a batch's files. A spilled trace's
    parts (a scan) are counted without holding every id: a bit per id in 64-bit words, words counted apart."""
    cpu_ops = table.lazy().filter((pl.col("kind") == "cpu_op") & pl.col("external_id").is_not_null())
    ident = pl.col("external_id")
    if isinstance(table, pl.LazyFrame):  # a spilled trace's parts: never whole
        bit = pl.lit(2, pl.UInt64).pow((ident % 64).cast(pl.UInt32))  # id = 64 * word + bit, negative ids too
        words = cpu_ops.group_by(_FILE, word=ident // 64).agg(
            bits=bit.bitwise_or(), lo=ident.min(), hi=ident.max())
        ids = words.group_by(_FILE).agg(kept=pl.col("bits").bitwise_count_ones().cast(pl.Int64).sum(),
                                        lo=pl.col("lo").min(), hi=pl.col("hi").max())
        got = ids.collect(engine="streaming")
    else:
        got = cpu_ops.group_by(_FILE).agg(kept=ident.n_unique(), lo=ident.min(), hi=ident.max()).collect(
            engine=ENGINE)
    found = {k: [int(n), int(hi - lo + 1)] for k, n, lo, hi in got.iter_rows()}
    return [found.get(k) for k in range(files)]


def _foreign(path: Path, skipped: Counter[str], fmt: str) -> str | None:
    """The one line saying which categories of a Kineto trace were not understood (an accelerator's events
    pipebubble does not know), each with its count, read as CPU work; taken out of ``skipped`` (the events are
    kept). A generic Chrome trace's categories are its writer's own: nothing to say."""
    counts = {key.removeprefix(FOREIGN): skipped.pop(key) for key in [k for k in skipped if k.startswith(FOREIGN)]}
    if not counts or fmt != "kineto":
        return None
    listed = ", ".join(f"{cat!r} ({n:,} event{'' if n == 1 else 's'})" for cat, n in sorted(counts.items()))
    return f"{path}: event categories not understood, read as CPU work: {listed}"


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
    if len(digits) <= 10 and int(digits) < spans.INT32:
        return int(digits), None
    return position, f"{path}: rank in the file name does not fit Int32; using the file's position {position}"


def _spilled_rows(folder: Path) -> int:
    """Rows in the parts written to a spill folder (none when the trace has no span)."""
    written = sorted(Path(folder).glob("part-*.parquet"))
    return pl.scan_parquet(written).select(pl.len()).collect().item() if written else 0


def _not_spans(phases: Counter[str]) -> Counter[str]:
    """Every phase that never becomes a span, counted by what it is."""
    skipped: Counter[str] = Counter()
    for ph, n in phases.items():
        if ph not in ("X", *PAIRED_PHASES, MEMORY_PHASE):
            skipped[_NOT_SPANS.get(ph, f"phase {ph!r}")] += n
    return skipped


#: A thread named for its pipeline rank, as Megatron's step timers name them (``PP rank 1, TP rank 0, compute``),
#: with its tensor- and data-parallel ranks where named (``pp_rank``, ``TP rank``, ``DP rank`` spellings too).
PP_RANK = re.compile(r"(?i)\bPP[ _-]?rank[ _:=]*(\d+)")
TP_RANK = re.compile(r"(?i)\bTP[ _-]?rank[ _:=]*(\d+)")
DP_RANK = re.compile(r"(?i)\bDP[ _-]?rank[ _:=]*(\d+)")


def _named_stages(table: pl.DataFrame, thread_names: dict[str, str]) -> pl.DataFrame:
    """``stage``: the pipeline rank a span's thread is named for (``PP_RANK``), where any is; the stage
    assignment reads it (``analysis.pipeline.stages``). Such a thread's lane is named by its coordinates and
    class: ``pp1/dp0 compute`` (``pid`` is the data-parallel rank, as the step timers write it, unless the
    name says another; ``/tp1`` for a tensor-parallel rank other than 0)."""
    named = []
    for key, name in thread_names.items():
        if (pp := PP_RANK.search(name)) is None:
            continue
        tp, dp = TP_RANK.search(name), DP_RANK.search(name)
        replica = dp.group(1) if dp else key.split("/")[0]
        role = name.rsplit(",", 1)[1].strip() if "," in name else ""
        lane = f"pp{int(pp.group(1))}" + (f"/tp{int(tp.group(1))}" if tp and int(tp.group(1)) else "") + (
            f"/dp{replica}") + (f" {role}" if role else "")
        named.append((key, int(pp.group(1)), lane))
    if not named or table.is_empty():
        return table
    keys = pl.DataFrame(named, schema={"_key": pl.String, "_stage": pl.Int32, "_lane": pl.String}, orient="row")
    key = pl.concat_str([pl.col("pid").cast(pl.String), pl.col("tid").cast(pl.String)], separator="/")
    joined = table.with_columns(_key=key).join(keys, on="_key", how="left", maintain_order="left")
    on_cpu = pl.col("device").is_null()
    return joined.with_columns(
        stage=pl.coalesce("_stage", "stage"),
        lane=pl.when(on_cpu & pl.col("_lane").is_not_null()).then("_lane").otherwise("lane"),
    ).drop("_key", "_stage", "_lane")


def _names(events: pl.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
    """Process names by pid and thread names by ``pid/tid``, from the metadata events (the last of each
    wins), in one query."""
    process = pl.col("name") == "process_name"
    ids = [pl.col(c).cast(pl.String) for c in ("pid", "tid")]
    rows = (
        events.lazy()
        .filter(
            (pl.col("ph") == "M")
            & pl.col("name").is_in(["process_name", "thread_name"])
            & pl.col("arg_name").is_not_null()
        )
        .select(process=process, key=pl.when(process).then(ids[0]).otherwise(pl.concat_str(ids, separator="/")),
                value="arg_name")
        .unique(["process", "key"], keep="last", maintain_order=True)
        .collect(engine=ENGINE)
    )
    names: tuple[dict[str, str], dict[str, str]] = ({}, {})
    for is_process, key, value in rows.iter_rows():
        names[0 if is_process else 1][key] = value
    return names
