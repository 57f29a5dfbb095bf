"""Map: one file's GPU breakdown part (``GpuPart``): its rows (``rows``) and its summaries' partial sums."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import polars as pl

from pipebubble.analysis import hostnames, idle
from pipebubble.analysis.breakdown import facts, medians
from pipebubble.analysis.breakdown.rows import rows_in_memory
from pipebubble.analysis.idle.steps import STEP_NUMBER
from pipebubble.analysis.intervals import SCAN_OPTIMIZATIONS
from pipebubble.analysis.launches import launch_calls, same_process
from pipebubble.report import Breakdown
from pipebubble.spans import GPU_WORK, owner

SHORT_KERNEL_NS = 10_000


@dataclass(frozen=True)
class GpuPart:
    """One file's breakdown rows and its summaries' partial sums."""

    rows: list[Breakdown]
    stats: pl.DataFrame  # kind, name, count, total, min, max, median, sq (Σ dur², exact): GPU operations by name
    api: pl.DataFrame  # name, count, total, max: runtime calls
    ranges: pl.DataFrame  # name, count, total, max: annotation ranges
    delay: dict  # count, total, max, median: launch delays (launch start to op start)
    short: int = 0  # kernels shorter than SHORT_KERNEL_NS
    # Duration value counts, for exact medians over several files (empty for a file that is the whole job):
    ops: pl.DataFrame = field(default_factory=pl.DataFrame)  # kind, name, dur, n
    delays: pl.DataFrame = field(default_factory=pl.DataFrame)  # dur, n
    idle: pl.DataFrame = field(default_factory=pl.DataFrame)  # the idle account summed (``idle.top``)
    # What the findings read (``facts``): per lane, stream, class and tag; tiny-kernel gaps; start-up calls
    streams: pl.DataFrame = field(default_factory=pl.DataFrame)  # lane, stream, cls, tag, count, total, tiny, ...
    gaps: pl.DataFrame = field(default_factory=pl.DataFrame)  # lane, count, total
    calls: pl.DataFrame = field(default_factory=pl.DataFrame)  # lane, name, count, total, inside
    cpu_ops: pl.DataFrame = field(default_factory=pl.DataFrame)  # name, count, total, max: CPU operators
    steps: pl.DataFrame = field(default_factory=pl.DataFrame)  # step: the steps the host marked, distinct

    FRAMES = ("stats", "api", "ranges", "ops", "delays", "idle", "streams", "gaps", "calls", "cpu_ops", "steps")


@dataclass(frozen=True)
class GpuInputs:
    """What the breakdown and the timeline strips (``strips.strip_bins``) both read of a span table, taken
    once: its GPU operations numbered by ``row`` (``gpu_ops``), its host spans, the runtime call that
    launched each operation (``_launched``), its steps as the GPU lives them (``idle.gpu_steps``) and its
    idle account (``idle.idle_account``)."""

    gpu: pl.DataFrame
    cpu: pl.DataFrame
    launch: pl.DataFrame
    steps: pl.DataFrame
    pieces: pl.DataFrame


def inputs(spans: pl.DataFrame, step_regex: str | None = None) -> GpuInputs:
    """The ``GpuInputs`` of ``spans``."""
    gpu = gpu_ops(spans).with_row_index("row")
    cpu = spans.filter(pl.col("device").is_null())
    launch = _launched(gpu, cpu)
    steps = idle.gpu_steps(idle.cpu_steps(cpu.lazy(), step_regex), idle.launched(gpu, launch))
    return GpuInputs(gpu, cpu, launch, steps, idle.idle_account(gpu, cpu, launch))


def gpu_part(spans: pl.DataFrame, step_regex: str | None = None, alone: bool = False,
             given: GpuInputs | None = None) -> GpuPart:
    """Map: the breakdown of every GPU lane of ``spans`` (whole window, then each step) and the summaries'
    parts: exact per-name statistics, and (unless the file is ``alone``, the whole job) the duration value
    counts that keep medians exact when files are combined. ``given``: the table's ``inputs``, where the
    caller has them."""
    given = given or inputs(spans, step_regex)
    gpu, cpu, launch = given.gpu, given.cpu, given.launch
    rows = rows_in_memory(gpu, given.steps, given.pieces) if gpu.height else []
    delays = launch.select(d=(pl.col("start") - pl.col("at")).clip(lower_bound=0))["d"]
    part = summarised(rows, gpu.lazy(), cpu.lazy(), delays, alone, step_regex=step_regex)
    ranks = gpu.lazy().group_by("lane").agg(pl.col("rank").first())
    return replace(part, idle=idle.top(idle.summed(given.pieces, ranks)))


def gpu_ops(spans: pl.DataFrame | pl.LazyFrame):
    """The GPU operations the breakdown reads, with their class (``cls``) and ``owner``."""
    return spans.filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)).select(
        "source", "lane", "rank", "pid", "device", "stream", "name", "start", "end", "correlation", cls=_class(),
        owner=owner(),
    )


def summarised(
    rows: list[Breakdown], gpu: pl.LazyFrame, cpu: pl.LazyFrame, delay: pl.Series | pl.LazyFrame, alone: bool,
    bounded: bool = False, gaps: pl.DataFrame | None = None, step_regex: str | None = None,
) -> GpuPart:
    """The part of ``rows``: the per-name statistics of the GPU operations ``gpu``, the runtime calls,
    ranges and operators of ``cpu`` (``summaries``), and the launch delays ``delay`` (one per launched operation,
    held or a scan of them: column ``d``); ``gaps``: the tiny-kernel gaps where they are counted already."""
    return with_delays(summaries(gpu, cpu, alone, bounded, gaps, step_regex), rows, delay, alone)


def summaries(gpu: pl.LazyFrame, cpu: pl.LazyFrame, alone: bool, bounded: bool = False,
              gaps: pl.DataFrame | None = None, step_regex: str | None = None) -> GpuPart:
    """A part's summaries without its rows and launch delays (``with_delays`` adds them): the per-name
    statistics of the GPU operations ``gpu``, the runtime calls and ranges of ``cpu``, each a query that
    reads only the columns it needs (``gpu`` and ``cpu`` may be scans of a spilled table). ``bounded``: the
    medians in two passes that hold a few values per name (``medians.exact``), not every duration."""
    dur = pl.col("end") - pl.col("start")
    timed = gpu.select("name", "cls", "start", dur=dur)
    sums = dict(
        count=pl.len(),
        total=pl.col("dur").sum(),
        min=pl.col("dur").min(),
        max=pl.col("dur").max(),
        sq=(pl.col("dur").cast(pl.Int128) * pl.col("dur").cast(pl.Int128)).sum(),
    )
    stats = timed.group_by("name").agg(**sums, **({} if bounded else {"median": pl.col("dur").median()}))
    if bounded:
        stats = stats.join(medians.exact(timed, "name", "dur").lazy(), on="name", how="left", nulls_equal=True)
    # A name's class: that of its earliest operation (a name given to two classes is rare).
    kinds = timed.group_by("name", kind=pl.col("cls").cast(pl.String)).agg(first=pl.col("start").min())
    kinds = kinds.sort("name", "first", "kind").unique("name", keep="first").select("name", "kind")
    named = pl.col("name").cast(pl.String)
    stats = stats.join(kinds, on="name", nulls_equal=True).with_columns(named)
    stats = stats.select("kind", "name", "count", "total", "min", "max", "median", "sq")
    api = _calls(cpu.filter(pl.col("kind").is_in(["runtime", "sync"]) & ~hostnames.sync_record()))
    ranges = hostnames.per_range(_calls(cpu.filter(pl.col("kind") == "annotation")))
    short = timed.filter(pl.col("cls").is_in(["compute", "comm"]) & (pl.col("dur") < SHORT_KERNEL_NS)).select(pl.len())
    # Keyed by category, not string: a streaming group-by of many groups keyed by strings holds several times more.
    ops = timed.group_by(pl.col("name").cast(pl.Categorical), "dur").agg(n=pl.len()).with_columns(named).join(
        kinds, on="name", nulls_equal=True)
    ops = ops.with_columns(named).select("kind", "name", "dur", "n")
    cpu_ops = _calls(cpu.filter(pl.col("kind") == "cpu_op"))
    queries = [stats, api, ranges, short, cpu_ops, host_steps(cpu, step_regex)] + ([] if alone else [ops])
    optimized = SCAN_OPTIMIZATIONS if bounded else pl.QueryOptFlags()
    stats, api, ranges, short, cpu_ops, steps, *rest = pl.collect_all(queries, engine="streaming",
                                                                      optimizations=optimized)
    return GpuPart([], stats, api, ranges, {}, short.item(), *rest, cpu_ops=cpu_ops, steps=steps,
                   **facts.collected(gpu, cpu, gaps, optimized))


def host_steps(cpu: pl.LazyFrame, step_regex: str | None) -> pl.LazyFrame:
    """step: the distinct steps the host marked, numbered as the idle account's steps are (``idle.cpu_steps``:
    ``ProfilerStep#N`` is step N; the ranges ``step_regex`` matches, in order on each thread), so the host
    summary's figures can be taken per step."""
    if step_regex:
        found = cpu.filter(pl.col("kind").is_in(["annotation", "step"]) & pl.col("name").str.contains(step_regex))
        found = found.with_columns(owner=owner()).unique(["owner", "name", "start", "end"])
        return found.group_by("owner").agg(n=pl.len()).select(step=pl.int_ranges(0, pl.col("n").max()).explode())
    named = pl.col("name").str.contains(r"^ProfilerStep#\d+$")
    found = cpu.filter((pl.col("kind") == "step") | ((pl.col("kind") == "annotation") & named))
    number = pl.col("name").str.extract(STEP_NUMBER).cast(pl.Int64, strict=False)
    return found.select(step=number).drop_nulls().unique()


def with_delays(part: GpuPart, rows: list[Breakdown], delay: pl.Series | pl.LazyFrame, alone: bool) -> GpuPart:
    """``part`` (``summaries``) with its ``rows`` and the summary of the launch delays ``delay`` (held, or a
    scan of them, column ``d``: read in streaming passes, the median in two, ``medians.exact``); unless the
    file is ``alone``, their value counts too (exact medians over files)."""
    if isinstance(delay, pl.LazyFrame):
        return _with_scanned_delays(part, rows, delay, alone)
    summary = {"count": delay.len(), "total": int(delay.sum() or 0), "max": delay.max(), "median": delay.median()}
    if alone:
        return replace(part, rows=rows, delay=summary)
    delays = delay.value_counts(name="n").rename({delay.name: "dur"})
    return replace(part, rows=rows, delay=summary, delays=delays)


def _with_scanned_delays(part: GpuPart, rows: list[Breakdown], delay: pl.LazyFrame, alone: bool) -> GpuPart:
    """``with_delays`` of delays in files (column ``d``), as it gives them held."""
    d = pl.col("d")
    queries = [delay.select(count=pl.len(), total=d.sum(), max=d.max())]
    if not alone:
        queries.append(delay.group_by(dur="d").agg(n=pl.len().cast(pl.UInt32)))
    found = pl.collect_all(queries, engine="streaming")
    count, total, most = found[0].row(0)
    median = medians.exact(delay.select(k=pl.lit(0), d=d), "k", "d")["median"] if count else None
    summary = {"count": int(count), "total": int(total or 0), "max": most,
               "median": median.item() if median is not None else None}
    if alone:
        return replace(part, rows=rows, delay=summary)
    return replace(part, rows=rows, delay=summary, delays=found[1])


def _class() -> pl.Expr:
    kind = pl.col("kind")
    return (
        pl.when(kind == "comm").then(pl.lit("comm"))
        .when(kind.is_in(["memcpy", "memset"])).then(kind.cast(pl.String))
        .otherwise(pl.lit("compute"))
    )


def _calls(frame: pl.LazyFrame) -> pl.LazyFrame:
    dur = pl.col("end") - pl.col("start")
    return frame.group_by("name").agg(count=pl.len(), total=dur.sum(), max=dur.max())


def _launched(gpu: pl.DataFrame, cpu: pl.DataFrame) -> pl.DataFrame:
    """row (of ``gpu``), at_lane, at, at_end, at_call, start, held: the runtime call that launched each GPU op
    (where one is known), the op's start, and whether the op is a copy or memset that ended before its call
    returned (the call blocked on it, a copy to pageable memory say).
    Correlation ids are per file in Kineto (a GPU op has no pid) and per process in Nsight; a table of one
    file is joined on the id alone."""
    keys = ["correlation"] if gpu["source"].n_unique() <= 1 else ["source", "correlation"]
    launches = launch_calls(cpu, "at_call").select(*keys, "at_pid", "at_lane", "at", "at_end", "at_call")
    ops = gpu.filter(pl.col("correlation").is_not_null()).select("row", "pid", "start", "end", "cls", *keys)
    return earliest(ops.join(launches, on=keys).filter(same_process()))


def earliest(joined: pl.DataFrame) -> pl.DataFrame:
    """row, at_lane, at, at_end, at_call, start, held: of ops (``row``, with ``end`` and ``cls``) joined with
    the calls that share their correlation id, each op's earliest launch (an id launched twice is rare)."""
    if joined["row"].n_unique() < joined.height:
        joined = joined.sort("row", "at", "at_lane").unique("row", keep="first", maintain_order=True)
    held = pl.col("cls").is_in(["memcpy", "memset"]) & (pl.col("end") <= pl.col("at_end")) & (
        pl.col("end") > pl.col("at"))
    return joined.select("row", "at_lane", "at", "at_end", "at_call", "start", held=held)
