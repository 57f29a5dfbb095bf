"""Where every GPU's time went, for every trace: the breakdown per GPU and per profiler step, the kernel
summary and the host side (what HolisticTraceAnalysis's temporal, idle and kernel breakdowns and
``nsys stats`` report), as unions over the span table, never sums of overlapping work.

Per GPU lane (``report.Breakdown``): compute = |∪ non-communication kernels|, comm = |∪ communication
kernels|, exposed comm = |∪(comm ∪ compute)| − compute, memory = |∪ memcpy/memset|, exposed memory =
|∪ all| − |∪(compute ∪ comm)|, idle = window − |∪ all|: compute + exposed comm + exposed memory + idle =
window. The whole-window row's window is the GPU's first to last busy instant; a step row's is the step's
range (``ProfilerStep#N``, or annotations matching ``--step-regex``), work clipped to it.

Each gap between a GPU's work gets a cause from the op that ended it and the runtime call that launched
that op: ``sync`` (the launching thread was in a synchronize when the GPU went idle), ``peer`` (it was in
a collective or point-to-point call: waiting on another rank), ``host_launch`` (the launch began after the
GPU went idle: the host was late), ``other`` (launched before the gap: a stream or event dependency; or no
launch is known).

Map (one file): the breakdown rows (a GPU's lane and steps are in one file) and partial sums of the
summaries (duration value counts, so medians stay exact across files); reduce: the summaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.analysis.launches import launch_calls, same_process
from pipebubble.report import Breakdown, CallStat, Host, KernelStat
from pipebubble.spans import GPU_WORK, is_comm, owner

CAUSES = ("host_launch", "sync", "peer", "other")
SHORT_KERNEL_NS = 10_000
MAX_RANGES = 1000  # annotation ranges listed (by total); ``Host.ranges_total`` counts them all


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


def gpu_part(spans: pl.DataFrame, step_regex: str | None = None, alone: bool = False) -> GpuPart:
    """Map: the breakdown of every GPU lane of ``spans`` (whole window, then each step) and the summaries'
    parts: exact per-name statistics, and (unless the file is ``alone``, the whole job) the duration value
    counts that keep medians exact when files are combined."""
    gpu = spans.filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)).select(
        "source", "lane", "rank", "pid", "device", "name", "start", "end", "correlation", cls=_class(), owner=owner()
    ).with_row_index("row")
    cpu = spans.filter(pl.col("device").is_null())
    launch = _launched(gpu, cpu)
    rows = _rows(gpu, cpu, launch, step_regex) if gpu.height else []
    dur = pl.col("end") - pl.col("start")
    timed = gpu.select("name", "cls", dur=dur)
    stats = timed.group_by("name").agg(
        kind=pl.col("cls").first(),
        count=pl.len(),
        total=pl.col("dur").sum(),
        min=pl.col("dur").min(),
        max=pl.col("dur").max(),
        median=pl.col("dur").median(),
        sq=(pl.col("dur").cast(pl.Int128) * pl.col("dur").cast(pl.Int128)).sum(),
    ).select("kind", "name", "count", "total", "min", "max", "median", "sq")
    api = _calls(cpu.filter(pl.col("kind").is_in(["runtime", "sync"])))
    ranges = _calls(cpu.filter(pl.col("kind") == "annotation"))
    delay = launch.select(d=(pl.col("start") - pl.col("at")).clip(lower_bound=0))["d"]
    summary = {"count": delay.len(), "total": int(delay.sum() or 0), "max": delay.max(), "median": delay.median()}
    short = timed.filter(pl.col("cls").is_in(["compute", "comm"]) & (pl.col("dur") < SHORT_KERNEL_NS)).height
    if alone:
        return GpuPart(rows, stats, api, ranges, summary, short)
    ops = timed.group_by("name", "dur").agg(kind=pl.col("cls").first(), n=pl.len()).select("kind", "name", "dur", "n")
    delays = delay.value_counts(name="n").rename({"d": "dur"})
    return GpuPart(rows, stats, api, ranges, summary, short, ops, delays)


def _class() -> pl.Expr:
    kind = pl.col("kind")
    return (
        pl.when(kind == "comm").then(pl.lit("comm"))
        .when(kind.is_in(["memcpy", "memset"])).then(kind.cast(pl.String))
        .otherwise(pl.lit("compute"))
    )


def _calls(frame: pl.DataFrame) -> pl.DataFrame:
    dur = pl.col("end") - pl.col("start")
    return frame.group_by("name").agg(count=pl.len(), total=dur.sum(), max=dur.max())


def _launched(gpu: pl.DataFrame, cpu: pl.DataFrame) -> pl.DataFrame:
    """row (of ``gpu``), at_lane, at, start: the runtime call that launched each GPU op (where one is known)
    and the op's start.
    Correlation ids are per file in Kineto (a GPU op has no pid) and per process in Nsight; a table of one
    file is joined on the id alone."""
    keys = ["correlation"] if gpu["source"].n_unique() <= 1 else ["source", "correlation"]
    launches = launch_calls(cpu).select(*keys, "at_pid", "at_lane", "at")
    ops = gpu.filter(pl.col("correlation").is_not_null()).select("row", "pid", "start", *keys)
    joined = ops.join(launches, on=keys).filter(same_process())
    if joined.height > ops.height:  # an id launched twice (rare): the first launch
        joined = joined.unique("row", keep="first", maintain_order=True)
    return joined.select("row", "at_lane", "at", "start")


# --- the breakdown rows ---

KEYS = ["lane", "step"]


def _rows(gpu: pl.DataFrame, cpu: pl.DataFrame, launch: pl.DataFrame, step_regex: str | None) -> list[Breakdown]:
    windows = gpu.group_by("lane").agg(ws=pl.col("start").min(), we=pl.col("end").max())
    windows = windows.with_columns(step=pl.lit(None, pl.Int64)).select("lane", "step", "ws", "we")
    steps = _steps(cpu, step_regex)
    owners = gpu.select("lane", "owner").unique()
    step_windows = owners.join(steps, on="owner").select("lane", "step", "ws", "we")
    wins = pl.concat([windows, step_windows.cast(windows.schema)])  # type: ignore[arg-type]
    unions, merged = _unions(gpu, owners, steps)
    table = wins.join(unions, on=KEYS, how="left", nulls_equal=True).with_columns(
        pl.col(c).fill_null(0) for c in unions.columns if c not in KEYS
    )
    causes = _idle_causes(gpu, merged, cpu, launch, steps)
    table = table.join(causes, on=KEYS, how="left", nulls_equal=True)
    attrs = gpu.group_by("lane").agg(pl.col("rank", "pid", "device").first())
    table = table.join(attrs, on="lane").sort("lane", pl.col("step").is_not_null(), "step")
    return [_row(r) for r in table.iter_rows(named=True)]


def _row(r: dict) -> Breakdown:
    window = r["we"] - r["ws"]
    busy = r["all"]
    idle = window - busy
    causes = {c: int(r.get(c) or 0) for c in CAUSES}
    causes["other"] += idle - sum(causes.values())  # idle outside every gap (before or after the GPU's work)
    comm = r["comm"]
    return Breakdown(
        lane=r["lane"], rank=r["rank"], pid=r["pid"], device=r["device"], step=r["step"],
        window_start_ns=r["ws"], window_ns=window, compute_ns=r["compute"], comm_ns=comm,
        comm_exposed_ns=r["busy"] - r["compute"], memory_ns=r["memory"], memory_exposed_ns=busy - r["busy"],
        idle_ns=idle, idle_causes=causes, overlap=(comm - (r["busy"] - r["compute"])) / comm if comm else None,
    )


def _unions(gpu: pl.DataFrame, owners: pl.DataFrame, steps: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """|∪| per (lane, step) of compute, comm, memory, compute ∪ comm (``busy``) and all work (``all``), and
    the merged intervals of all work (lane, owner, start, end). Each class is merged once over the whole
    window, the wider unions from those (fewer) merged intervals, and each is then cut to the steps: a
    union inside a step is the whole union's part in it."""
    cls = pl.col("cls")
    merged = {
        "compute": merge(gpu.filter(cls == "compute"), ["lane"]),
        "comm": merge(gpu.filter(cls == "comm"), ["lane"]),
        "memory": merge(gpu.filter(cls.is_in(["memcpy", "memset"])), ["lane"]),
    }
    merged["busy"] = _union_of(merged["compute"], merged["comm"])
    merged["all"] = _union_of(merged["busy"], merged["memory"])
    # One table of every union's intervals, tagged by union: one group-by (and one cut to the steps).
    tagged = pl.concat([m.select("lane", "start", "end", union=pl.lit(name)) for name, m in merged.items()])
    pieces = tagged.with_columns(step=pl.lit(None, pl.Int64))
    if steps.height:
        stepped = _by_step(tagged.join(owners, on="lane"), steps)
        pieces = pl.concat([pieces, stepped.select(pieces.columns)])
    lengths = pieces.group_by(*KEYS, "union").agg(ns=(pl.col("end") - pl.col("start")).sum())
    wide = lengths.pivot(on="union", index=KEYS, values="ns")
    wide = wide.with_columns(
        (pl.col(name).fill_null(0) if name in wide.columns else pl.lit(0, pl.Int64)).alias(name) for name in merged
    )
    return wide, merged["all"].join(owners, on="lane")


def _union_of(a: pl.DataFrame, b: pl.DataFrame) -> pl.DataFrame:
    """The merged union of two sets of merged intervals (one of them empty: the other, unchanged)."""
    if b.is_empty():
        return a
    if a.is_empty():
        return b
    return merge(pl.concat([a, b]), ["lane"])


STEP_NUMBER = r"#(\d+)$"


def _steps(cpu: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """owner, step, ws, we: the profiler steps (``ProfilerStep#N``: step N) or the ranges ``step_regex``
    matches (numbered in order), per owner."""
    if step_regex:
        found = cpu.filter(pl.col("kind").is_in(["annotation", "step"]) & pl.col("name").str.contains(step_regex))
    else:
        named = pl.col("name").str.contains(r"^ProfilerStep#\d+$")
        found = cpu.filter((pl.col("kind") == "step") | ((pl.col("kind") == "annotation") & named))
    found = found.with_columns(owner=owner()).unique(["owner", "name", "start", "end"]).sort("owner", "start")
    number = pl.col("name").str.extract(STEP_NUMBER).cast(pl.Int64, strict=False)
    order = pl.int_range(pl.len()).over("owner").cast(pl.Int64)
    step = order if step_regex else number.fill_null(order)
    return found.select("owner", step=step, ws="start", we="end")


def _by_step(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s intervals (with ``owner``) cut to the steps they overlap, with ``step``: most lie in one
    step (found by an as-of join on their start); the few that cross a step's edge are cut by a join with
    their owner's steps."""
    if frame.is_empty() or steps.is_empty():
        return frame.with_columns(step=pl.lit(None, pl.Int64)).clear()
    steps = steps.sort("owner", "ws")
    # Owners whose steps overlap (nested ranges a --step-regex matched): every span joins each step it meets.
    overlapping = steps.filter(pl.col("ws") < pl.col("we").shift(1).over("owner"))["owner"].unique()
    if overlapping.len():
        mine = pl.col("owner").is_in(overlapping.implode())
        nested = _cut(frame.filter(mine), steps.filter(mine))
        rest = _by_step(frame.filter(~mine), steps.filter(~mine))
        return pl.concat([rest.select(*frame.columns, "step"), nested.select(*frame.columns, "step")])
    steps = steps.sort("ws")
    probe = frame.sort("start").join_asof(
        steps, left_on="start", right_on="ws", by="owner", strategy="backward", check_sortedness=False
    )
    inside = pl.col("we").is_not_null() & (pl.col("end") <= pl.col("we"))
    simple = probe.filter(inside).drop("ws", "we")
    rest = probe.filter(~inside).drop("step", "ws", "we")
    after = steps.select("owner", next_ws="ws")
    rest = rest.sort("start").join_asof(after, left_on="start", right_on="next_ws", by="owner",
                                        strategy="forward", check_sortedness=False)
    # Only what reaches past a step's edge or into the next step is cut; the rest lies outside every step.
    prev_end = rest.join_asof(steps.select("owner", prev_ws="ws", prev_we="we"), left_on="start",
                              right_on="prev_ws", by="owner", strategy="backward", check_sortedness=False)
    crossing = prev_end.filter(
        (pl.col("prev_we").is_not_null() & (pl.col("end") > pl.col("prev_we")) & (pl.col("start") < pl.col("prev_we")))
        | (pl.col("next_ws").is_not_null() & (pl.col("end") > pl.col("next_ws")))
    ).drop("next_ws", "prev_ws", "prev_we")
    return pl.concat([simple, _cut(crossing, steps).select(simple.columns)])


def _cut(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each span of ``frame`` cut to every step of its owner it overlaps."""
    cut = frame.join(steps, on="owner").filter((pl.col("start") < pl.col("we")) & (pl.col("end") > pl.col("ws")))
    return cut.with_columns(start=pl.max_horizontal("start", "ws"), end=pl.min_horizontal("end", "we")).drop("ws", "we")


def _idle_causes(
    gpu: pl.DataFrame, merged: pl.DataFrame, cpu: pl.DataFrame, launch: pl.DataFrame, steps: pl.DataFrame
) -> pl.DataFrame:
    """Idle ns per (lane, step) and cause, from the gaps between each GPU's ``merged`` work."""
    gaps = (
        merged.with_columns(gap_start=pl.col("end").shift(1).over("lane"))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select("lane", start="gap_start", end="start")
    )
    empty = pl.DataFrame(schema={"lane": pl.String, "step": pl.Int64, **{c: pl.Int64 for c in CAUSES}})
    if gaps.is_empty():
        return empty
    # The op that ended each gap (one that starts at its end; the lowest row among equals) and its launch.
    ops = gpu.select("lane", op_start="start", row="row", owner="owner").sort("op_start", "row")
    nxt = gaps.sort("end").join_asof(ops, left_on="end", right_on="op_start", by="lane", strategy="forward",
                                     check_sortedness=False)
    nxt = nxt.join(launch.drop("start"), on="row", how="left")
    ranges = cpu.filter(pl.col("kind").is_in(["cpu_op", "annotation", "comm"]))
    blocked = {
        "in_sync": merge(cpu.filter(pl.col("kind") == "sync"), ["lane"]),
        "in_peer": merge(ranges.filter(is_comm()), ["lane"]),
    }
    for flag, intervals in blocked.items():
        marks = intervals.select(at_lane="lane", b_start="start", b_end="end").sort("b_start")
        nxt = nxt.sort("start").join_asof(marks, left_on="start", right_on="b_start", by="at_lane",
                                          strategy="backward", check_sortedness=False)
        nxt = nxt.with_columns((pl.col("start") < pl.col("b_end")).fill_null(False).alias(flag)).drop(
            "b_start", "b_end"
        )
    cause = (
        pl.when(pl.col("in_sync")).then(pl.lit("sync"))
        .when(pl.col("in_peer")).then(pl.lit("peer"))
        .when(pl.col("at") > pl.col("start")).then(pl.lit("host_launch"))
        .otherwise(pl.lit("other"))
    )
    gaps = nxt.select("lane", "owner", "start", "end", cause=cause)
    whole = gaps.with_columns(step=pl.lit(None, pl.Int64))
    stepped = _by_step(gaps.filter(pl.col("owner").is_not_null()), steps)
    both = pl.concat([whole.select(*KEYS, "cause", "start", "end"), stepped.select(*KEYS, "cause", "start", "end")])
    per = both.group_by(*KEYS, "cause").agg(ns=(pl.col("end") - pl.col("start")).sum())
    wide = per.pivot(on="cause", index=KEYS, values="ns")
    for c in CAUSES:
        if c not in wide.columns:
            wide = wide.with_columns(pl.lit(0, pl.Int64).alias(c))
    wide = wide.select(*KEYS, *CAUSES).cast(empty.schema)  # type: ignore[arg-type]
    return wide.with_columns(pl.col(c).fill_null(0) for c in CAUSES)


# --- the reduce: the summaries over every file ---


def kernels(parts: list[GpuPart]) -> list[KernelStat]:
    """Per (name, class) over all files: count, total, mean, exact median, min, max, population std, share."""
    if len(parts) == 1:
        return _stats(parts[0].stats)
    ops = pl.concat([p.ops for p in parts], how="vertical_relaxed") if parts else pl.DataFrame()
    if ops.is_empty():
        return []
    # Value counts over every file, laid out in duration order: the exact median from their running counts.
    keys = ["kind", "name"]
    ops = ops.group_by(*keys, "dur").agg(pl.col("n").sum()).sort(*keys, "dur")
    wide = pl.col("dur").cast(pl.Int128)
    stats = ops.group_by(keys, maintain_order=True).agg(
        count=pl.col("n").sum(),
        total=(pl.col("dur") * pl.col("n")).sum(),
        min=pl.col("dur").first(),
        max=pl.col("dur").last(),
        median=_counted_median(),
        sq=(wide * wide * pl.col("n")).sum(),
    )
    return _stats(stats)


def _counted_median() -> pl.Expr:
    """The exact median of durations given as value counts (``dur``, ``n``; rows in duration order): the mean
    of the values at the two middle positions of the expanded list."""
    cum, count = pl.col("n").cum_sum(), pl.col("n").sum()
    return (pl.col("dur").filter(cum > (count - 1) // 2).first() + pl.col("dur").filter(cum > count // 2).first()) / 2


def _stats(stats: pl.DataFrame) -> list[KernelStat]:
    """One file's per-name statistics as the kernel summary."""
    grand = int(stats["total"].sum()) if stats.height else 0
    ordered = stats.sort("total", "name", descending=[True, False])
    return [
        KernelStat(r["name"], r["kind"], r["count"], r["total"], r["total"] / r["count"], float(r["median"]),
                   r["min"], r["max"], _std(r["count"], r["total"], r["sq"]), r["total"] / grand if grand else 0.0)
        for r in ordered.iter_rows(named=True)
    ]


def _std(n: int, total: int, sq: int) -> float:
    """Population standard deviation from exact integer sums: var = (n·Σx² − (Σx)²) / n², in Python ints
    (no cancellation, and the same to the last bit whatever order the values came in)."""
    return ((n * int(sq) - total * total) / (n * n)) ** 0.5


def host(parts: list[GpuPart]) -> Host | None:
    """Runtime calls, annotation ranges, launch delays and short kernels over all files."""
    if not parts:
        return None
    api, ranges = (_merged([getattr(p, key) for p in parts]) for key in ("api", "ranges"))
    launches = sum(p.delay["count"] for p in parts)
    if len(parts) == 1:
        median = parts[0].delay["median"]
    else:
        delays = pl.concat([p.delays for p in parts], how="vertical_relaxed").group_by("dur").agg(pl.col("n").sum())
        median = delays.sort("dur").select(_counted_median()).item() if launches else None
    maxima = [p.delay["max"] for p in parts if p.delay["max"] is not None]
    return Host(
        api=api,
        ranges=ranges[:MAX_RANGES],
        launches=launches,
        launch_delay_mean_ns=sum(p.delay["total"] for p in parts) / launches if launches else None,
        launch_delay_median_ns=None if median is None else float(median),
        launch_delay_max_ns=max(maxima) if maxima else None,
        short_kernels=sum(p.short for p in parts),
        short_kernel_ns=SHORT_KERNEL_NS,
        ranges_total=len(ranges),
    )


def _merged(frames: list[pl.DataFrame]) -> list[CallStat]:
    frame = pl.concat(frames, how="vertical_relaxed")
    if frame.is_empty():
        return []
    total = frame.group_by("name").agg(pl.col("count", "total").sum(), pl.col("max").max())
    total = total.sort("total", "name", descending=[True, False])
    return [CallStat(r["name"], r["count"], r["total"], r["total"] / r["count"], r["max"])
            for r in total.iter_rows(named=True)]
