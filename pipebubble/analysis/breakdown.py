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

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.report import Breakdown, CallStat, Host, KernelStat
from pipebubble.spans import GPU_WORK, is_comm

CAUSES = ("host_launch", "sync", "peer", "other")
SHORT_KERNEL_NS = 10_000
MAX_RANGES = 1000  # annotation ranges listed (by total); ``Host.ranges_total`` counts them all


@dataclass(frozen=True)
class GpuPart:
    """One file's breakdown rows and its summaries' partial sums."""

    rows: list[Breakdown]
    ops: pl.DataFrame  # kind, name, dur, n: GPU operations' duration value counts
    api: pl.DataFrame  # name, count, total, max: runtime calls
    ranges: pl.DataFrame  # name, count, total, max: annotation ranges
    delays: pl.DataFrame  # dur, n: launch delays (launch start to op start)


def owner() -> pl.Expr:
    """Whose GPU or thread a span is: its rank, or its process where the file names no ranks."""
    return pl.coalesce(pl.col("rank").cast(pl.Int64), pl.col("pid"))


def gpu_part(spans: pl.DataFrame, step_regex: str | None = None) -> GpuPart:
    """Map: the breakdown of every GPU lane of ``spans`` (whole window, then each step) and the partial
    summaries."""
    gpu = spans.filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK))
    gpu = gpu.with_columns(cls=_class(), owner=owner())
    rows = _rows(gpu, spans, step_regex) if gpu.height else []
    ops = gpu.group_by("cls", "name", dur=pl.col("end") - pl.col("start")).agg(n=pl.len()).rename({"cls": "kind"})
    cpu = spans.filter(pl.col("device").is_null())
    api = _calls(cpu.filter(pl.col("kind").is_in(["runtime", "sync"])))
    ranges = _calls(cpu.filter(pl.col("kind") == "annotation"))
    return GpuPart(rows, ops, api, ranges, _delays(gpu, spans))


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


def _launches(spans: pl.DataFrame) -> pl.DataFrame:
    return spans.filter(pl.col("kind") == "runtime").select(
        "source", "correlation", at_pid="pid", at_lane="lane", at="start"
    )


def _launched(ops: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with the lane and start of the runtime call that launched each (null: unknown). Correlation
    ids are per file in Kineto (a GPU op has no pid) and per process in Nsight."""
    joined = ops.join(_launches(spans), on=["source", "correlation"], how="left")
    joined = joined.filter(pl.col("pid").is_null() | pl.col("at_pid").is_null() | (pl.col("pid") == pl.col("at_pid")))
    return joined.unique(["lane", "stream", "start", "end", "name", "correlation"], keep="first", maintain_order=True)


def _delays(gpu: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    linked = _launched(gpu.filter(pl.col("correlation").is_not_null()), spans).filter(pl.col("at").is_not_null())
    return linked.group_by(dur=(pl.col("start") - pl.col("at")).clip(lower_bound=0)).agg(n=pl.len())


# --- the breakdown rows ---

KEYS = ["lane", "step"]


def _rows(gpu: pl.DataFrame, spans: pl.DataFrame, step_regex: str | None) -> list[Breakdown]:
    whole = gpu.with_columns(step=pl.lit(None, pl.Int64))
    windows = whole.group_by("lane", "step").agg(ws=pl.col("start").min(), we=pl.col("end").max())
    steps = _steps(spans, step_regex)
    stepped = _by_step(gpu, steps)
    step_windows = gpu.select("lane", "owner").unique().join(steps, on="owner").select("lane", "step", "ws", "we")
    work = pl.concat([whole.select(*KEYS, "cls", "start", "end"), stepped.select(*KEYS, "cls", "start", "end")])
    wins = pl.concat([windows, step_windows.cast(windows.schema)])  # type: ignore[arg-type]
    unions = _unions(work)
    table = wins.join(unions, on=KEYS, how="left", nulls_equal=True).with_columns(
        pl.col(c).fill_null(0) for c in unions.columns if c not in KEYS
    )
    causes = _idle_causes(gpu, spans, steps)
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


def _unions(work: pl.DataFrame) -> pl.DataFrame:
    """|∪| per (lane, step) of compute, comm, memory, compute ∪ comm (``busy``) and all work (``all``)."""
    parts = {
        "compute": pl.col("cls") == "compute",
        "comm": pl.col("cls") == "comm",
        "memory": pl.col("cls").is_in(["memcpy", "memset"]),
        "busy": pl.col("cls").is_in(["compute", "comm"]),
        "all": pl.lit(True),
    }
    out = None
    for name, keep in parts.items():
        merged = merge(work.filter(keep), KEYS)
        length = merged.group_by(KEYS).agg((pl.col("end") - pl.col("start")).sum().alias(name))
        out = length if out is None else out.join(length, on=KEYS, how="full", coalesce=True, nulls_equal=True)
    return out.with_columns(pl.col(name).fill_null(0) for name in parts)


STEP_NUMBER = r"#(\d+)$"


def _steps(spans: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """owner, step, ws, we: the profiler steps (``ProfilerStep#N``: step N) or the ranges ``step_regex``
    matches (numbered in order), per owner."""
    cpu = spans.filter(pl.col("device").is_null())
    if step_regex:
        found = cpu.filter(pl.col("kind").is_in(["annotation", "step"]) & pl.col("name").str.contains(step_regex))
    else:
        named = pl.col("name").str.contains(r"^ProfilerStep#\d+$")
        found = cpu.filter((pl.col("kind") == "step") | ((pl.col("kind") == "annotation") & named))
    found = found.with_columns(owner=owner()).unique(["owner", "start", "end"]).sort("owner", "start")
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
    cut = crossing.join(steps, on="owner").filter((pl.col("start") < pl.col("we")) & (pl.col("end") > pl.col("ws")))
    cut = cut.with_columns(start=pl.max_horizontal("start", "ws"), end=pl.min_horizontal("end", "we")).drop("ws", "we")
    return pl.concat([simple, cut.select(simple.columns)])


def _idle_causes(gpu: pl.DataFrame, spans: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Idle ns per (lane, step) and cause, from the gaps between each GPU's merged work."""
    merged = merge(gpu, ["lane"])
    gaps = (
        merged.with_columns(gap_start=pl.col("end").shift(1).over("lane"))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select("lane", start="gap_start", end="start")
    )
    empty = pl.DataFrame(schema={"lane": pl.String, "step": pl.Int64, **{c: pl.Int64 for c in CAUSES}})
    if gaps.is_empty():
        return empty
    first = gpu.sort("start", "correlation", "name", nulls_last=True, maintain_order=True).unique(
        ["lane", "start"], keep="first", maintain_order=True
    ).select(
        "lane", "start", "source", "correlation", "pid", "owner"
    )
    nxt = gaps.join(first, left_on=["lane", "end"], right_on=["lane", "start"], how="left")
    nxt = nxt.join(_launches(spans), on=["source", "correlation"], how="left").filter(
        pl.col("pid").is_null() | pl.col("at_pid").is_null() | (pl.col("pid") == pl.col("at_pid"))
    ).unique(["lane", "start"], keep="first", maintain_order=True)
    cpu = spans.filter(pl.col("device").is_null())
    blocked = {
        "in_sync": merge(cpu.filter(pl.col("kind") == "sync"), ["lane"]),
        "in_peer": merge(cpu.filter(is_comm()), ["lane"]),
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
    ops = pl.concat([p.ops for p in parts], how="vertical_relaxed") if parts else pl.DataFrame()
    if ops.is_empty():
        return []
    ops = ops.group_by("kind", "name", "dur").agg(pl.col("n").sum())
    grand = int((ops["dur"] * ops["n"]).sum())
    stats = (
        ops.sort("kind", "name", "dur")
        .group_by("kind", "name", maintain_order=True)
        .agg(
            count=pl.col("n").sum(),
            total=(pl.col("dur") * pl.col("n")).sum(),
            sq=(pl.col("dur").cast(pl.Float64).pow(2) * pl.col("n")).sum(),
            min=pl.col("dur").min(),
            max=pl.col("dur").max(),
            lo=pl.col("dur").filter(pl.col("n").cum_sum() > (pl.col("n").sum() - 1) // 2).first(),
            hi=pl.col("dur").filter(pl.col("n").cum_sum() > pl.col("n").sum() // 2).first(),
        )
        .sort("total", "name", descending=[True, False])
    )
    out = []
    for r in stats.iter_rows(named=True):
        mean = r["total"] / r["count"]
        var = max(0.0, r["sq"] / r["count"] - mean * mean)
        out.append(KernelStat(r["name"], r["kind"], r["count"], r["total"], mean, (r["lo"] + r["hi"]) / 2,
                              r["min"], r["max"], var**0.5, r["total"] / grand if grand else 0.0))
    return out


def host(parts: list[GpuPart]) -> Host | None:
    """Runtime calls, annotation ranges, launch delays and short kernels over all files."""
    if not parts:
        return None
    api, ranges = (_merged([getattr(p, key) for p in parts]) for key in ("api", "ranges"))
    delays = pl.concat([p.delays for p in parts], how="vertical_relaxed").group_by("dur").agg(pl.col("n").sum())
    ops = pl.concat([p.ops for p in parts], how="vertical_relaxed")
    short = ops.filter(pl.col("kind").is_in(["compute", "comm"]) & (pl.col("dur") < SHORT_KERNEL_NS))["n"].sum()
    launches = int(delays["n"].sum()) if delays.height else 0
    median = _median(delays) if launches else None
    return Host(
        api=api,
        ranges=ranges[:MAX_RANGES],
        launches=launches,
        launch_delay_mean_ns=float((delays["dur"] * delays["n"]).sum() / launches) if launches else None,
        launch_delay_median_ns=median,
        launch_delay_max_ns=int(delays["dur"].max()) if launches else None,
        short_kernels=int(short or 0),
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


def _median(values: pl.DataFrame) -> float:
    ordered = values.sort("dur")
    n = int(ordered["n"].sum())
    cum = ordered["n"].cum_sum()
    lo = ordered.filter(cum > (n - 1) // 2)["dur"][0]
    hi = ordered.filter(cum > n // 2)["dur"][0]
    return (lo + hi) / 2
