"""Reduce: the kernel and host summaries over every file's ``GpuPart``."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.breakdown.facts import TINY_GAP_NS
from pipebubble.analysis.breakdown.part import SHORT_KERNEL_NS, GpuPart
from pipebubble.report import CallStat, Host, KernelStat
from pipebubble.report.breakdown import Facts, LaneGaps, StreamStat, ThreadCall
from pipebubble.report.names import short_names

MAX_RANGES = 1000  # annotation ranges listed (by total); ``Host.ranges_total`` counts them all
MAX_CALLS = 100  # start-up calls and framework markers kept per host thread (by total), ``Facts.calls``


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
    """Per-name statistics as the kernel summary, each name shortened, unique in the table (``report.names``)."""
    grand = int(stats["total"].sum()) if stats.height else 0
    ordered = stats.sort("total", "name", descending=[True, False])
    short = short_names(ordered["name"].to_list()) if ordered.height else {}
    return [
        KernelStat(short.get(r["name"]), r["name"], r["kind"], r["count"], r["total"], r["total"] / r["count"],
                   float(r["median"]), r["min"], r["max"], _std(r["count"], r["total"], r["sq"]),
                   r["total"] / grand if grand else 0.0)
        for r in ordered.iter_rows(named=True)
    ]


def _std(n: int, total: int, sq: int) -> float:
    """Population standard deviation from exact integer sums: var = (n·Σx² − (Σx)²) / n², in Python ints
    (no cancellation, and the same to the last bit whatever order the values came in)."""
    return ((n * int(sq) - total * total) / (n * n)) ** 0.5


def host(parts: list[GpuPart]) -> Host | None:
    """Runtime calls, annotation ranges, CPU operators, launch delays and short kernels over all files."""
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
        facts=facts(parts),
        ops=_merged([p.cpu_ops for p in parts]),
        steps=_steps(parts),
    )


def _steps(parts: list[GpuPart]) -> int | None:
    """The distinct steps the host marked over every file (a job's ranks mark the same steps), None without."""
    frames = [p.steps for p in parts if p.steps.width]
    count = pl.concat(frames, how="vertical_relaxed")["step"].n_unique() if frames else 0
    return count or None


def _merged(frames: list[pl.DataFrame]) -> list[CallStat]:
    frames = [f for f in frames if f.width]  # a frame without columns holds no rows either
    frame = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    if frame.is_empty():
        return []
    total = frame.group_by("name").agg(pl.col("count", "total").sum(), pl.col("max").max())
    rows = total.sort("total", "name", descending=[True, False]).select("name", "count", "total", "max").rows()
    return [CallStat(name, count, ns, ns / count, longest) for name, count, ns, longest in rows]


def facts(parts: list[GpuPart]) -> Facts:
    """The findings' facts (``breakdown.facts``) over all files: sums per lane, stream, class and tag; per
    lane; per thread and name, the ``MAX_CALLS`` with the most time of each thread (a lane is one file's, so
    the sums only join a batch's ranks)."""
    streams = _summed(parts, "streams", ["lane", "stream", "cls", "tag"], ["count", "total", "tiny", "tiny_total"])
    gaps = _summed(parts, "gaps", ["lane"], ["count", "total"])
    calls = _summed(parts, "calls", ["lane", "name"], ["count", "total", "inside"])
    if calls.height:
        calls = calls.sort("lane", "total", "name", descending=[False, True, False]).group_by(
            "lane", maintain_order=True).head(MAX_CALLS)
    return Facts(
        streams=[StreamStat(*row) for row in streams.rows()],
        tiny_gaps=[LaneGaps(*row, max_gap_ns=TINY_GAP_NS) for row in gaps.rows()],
        calls=[ThreadCall(*row) for row in calls.rows()],
    )


def _summed(parts: list[GpuPart], key: str, by: list[str], sums: list[str]) -> pl.DataFrame:
    """``key``'s frames of ``parts`` summed per ``by``, in ``by`` order (nulls first); columns ``by`` + ``sums``."""
    frames = [f for f in (getattr(p, key) for p in parts) if f.width and f.height]
    if not frames:
        return pl.DataFrame()
    summed = pl.concat([f.select(*by, *sums) for f in frames], how="vertical_relaxed").group_by(by).agg(
        pl.col(sums).sum())
    return summed.sort(by, nulls_last=False)
