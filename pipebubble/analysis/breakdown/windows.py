"""The GPU time breakdown of a span table too big for memory (a spilled trace's Parquet parts), in one pass
over time windows of a bounded number of operations: the same, to the nanosecond, as ``breakdown.part.gpu_part``
on the whole table.

- The operations and the launching calls are first copied to two narrow tables (``narrow``: ids, times,
  the lane as a category), which the caller writes to disk: each window reads those, not the spans' strings.
- Unions: each window's operations are clipped to it, so the unions per (lane, step, class) add up over the
  disjoint windows. Each GPU's busy periods are the merged intervals of all its work: a window's pieces are
  merged with the last period of the windows before (a period that reaches a window's edge continues in the
  next), and every period but the last is final, with the gaps between them.
- Idle causes: the op that ended a gap starts at its end, so it lies among the window's own operations; its
  launch comes from one join of the window's operations with the launching calls. The causes per (lane,
  step) add up over windows as the unions do.
- Summaries: group-bys over the scan (``part.summaries``; the medians in two passes, ``medians.exact``),
  with every operation's launch delay; those of operations held in memory (``held``) beside the windows.

What is held whole is the per-name statistics, one launch delay per operation (8 bytes) and each GPU's last
busy period; a window holds about ``rows_per_window`` operations.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import polars as pl

from pipebubble.analysis.breakdown import part
from pipebubble.analysis.breakdown import rows as by_lane
from pipebubble.analysis.intervals import merge
from pipebubble.analysis.launches import launch_calls, same_process
from pipebubble.report import Breakdown

_CAT = pl.Categorical


def narrow(scan: pl.LazyFrame, gpu: pl.LazyFrame | None = None) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The two narrow tables the windows read, as queries over the span table ``scan`` (``gpu``: its GPU
    operations, ``part.gpu_ops``, where already held): its GPU operations (lane and class as categories,
    owner, rank, pid, device, start, end, correlation) and its launching calls (correlation, at_pid, at_lane,
    at). The caller writes them out and gives them back as scans."""
    ops = (part.gpu_ops(scan) if gpu is None else gpu).select(
        pl.col("lane").cast(_CAT), pl.col("cls").cast(_CAT), "owner", "rank", "pid", "device", "start", "end",
        "correlation",
    )
    calls = launch_calls(scan.filter(pl.col("device").is_null()))
    return ops, calls.select("correlation", "at_pid", pl.col("at_lane").cast(_CAT), "at")


def narrow_rows(scan: pl.LazyFrame) -> int:
    """The rows of ``narrow``'s bigger table over the span table ``scan``: its GPU operations or its launching
    calls, whichever are more."""
    tables = part.gpu_ops(scan), launch_calls(scan.filter(pl.col("device").is_null()))
    counts = pl.collect_all([table.select(pl.len()) for table in tables])
    return max(count.item() for count in counts)


def held(scan: pl.LazyFrame) -> tuple[pl.LazyFrame, pl.LazyFrame, pl.LazyFrame]:
    """``narrow``'s tables and the GPU operations themselves (``part.gpu_ops``, for the summaries), read once
    and held in memory: for a table whose GPU operations and launching calls fit one window (``narrow_rows``),
    which holds them anyway."""
    gpu = part.gpu_ops(scan).collect()
    ops, launches = pl.collect_all(narrow(scan, gpu.lazy()))
    return ops.lazy(), launches.lazy(), gpu.lazy()


def gpu_part_windowed(
    scan: pl.LazyFrame, ops: pl.LazyFrame, launches: pl.LazyFrame, step_regex: str | None, alone: bool,
    rows_per_window: int, gpu: pl.LazyFrame | None = None,
) -> part.GpuPart:
    """``breakdown.part.gpu_part`` of the span table ``scan`` (one file's), given ``narrow``'s tables written out
    (``ops``, ``launches``), with about ``rows_per_window`` GPU operations in memory at a time. ``gpu``: the
    GPU operations held in memory (``held``), whose summaries then read them, not the scan, take their
    medians whole, and run beside the windows (they hold nothing a window does not)."""
    bounded = gpu is None
    gpu = part.gpu_ops(scan) if bounded else gpu
    cpu = scan.filter(pl.col("device").is_null())
    if bounded:
        rows, delays = _rows(ops, launches, cpu, step_regex, rows_per_window)
        return part.summarised(rows, gpu, cpu, delays, alone, bounded=True)
    with ThreadPoolExecutor(1) as side:
        summaries = side.submit(part.summaries, gpu, cpu, alone)
        rows, delays = _rows(ops, launches, cpu, step_regex, rows_per_window)
        return part.with_delays(summaries.result(), rows, delays, alone)


def _rows(ops: pl.LazyFrame, launches: pl.LazyFrame, cpu: pl.LazyFrame, step_regex: str | None,
          rows_per_window: int) -> tuple[list[Breakdown], pl.Series]:
    """The breakdown rows of the GPU operations ``ops`` and every operation's launch delay, window by window."""
    n = ops.select(pl.len()).collect().item()
    if not n:
        return [], pl.Series("d", [], pl.Int64)
    return _Passes(ops, launches, cpu, step_regex).run(_edges(ops, n, rows_per_window))


def _edges(ops: pl.LazyFrame, n: int, rows_per_window: int) -> list[int]:
    """Window edges, in integer ns, at quantiles of the operations' starts (about ``rows_per_window``
    starting in each; quantiles taken from the first start, as a float keeps no ns at epoch times); the
    last edge lies past every start and end."""
    k = max(1, -(-n // max(1, rows_per_window)))
    since = pl.col("start") - pl.col("start").min()
    qs = [since.quantile(i / k, "lower").alias(str(i)) for i in range(1, k)]
    last = pl.max_horizontal(pl.col("start").max(), pl.col("end").max()) + 1
    first, end, *inner = ops.select(pl.col("start").min(), last.alias("k"), *qs).collect().row(0)
    return sorted({first, *(first + int(q) for q in inner), end})


class _Passes:
    """The windows, in time order, and what carries from one to the next (each GPU's last busy period)."""

    def __init__(self, ops: pl.LazyFrame, launches: pl.LazyFrame, cpu: pl.LazyFrame, step_regex: str | None):
        self.ops, self.launches = ops, launches
        self.steps = by_lane.steps_of(cpu, step_regex)
        self.owners = ops.select("lane", "owner").unique().collect()
        self.blocked = {k: v.with_columns(pl.col("lane").cast(_CAT)) for k, v in by_lane.blocked_of(cpu).items()}
        self.tail = pl.DataFrame(schema={"lane": _CAT, "start": pl.Int64, "end": pl.Int64})

    def run(self, edges: list[int]) -> tuple[list[Breakdown], pl.Series]:
        lengths, causes, delays = [], [], []
        for a, b in zip(edges, edges[1:], strict=False):
            window_lengths, window_causes, window_delays = self._window(a, b)
            lengths.append(window_lengths)
            causes.append(window_causes)
            delays.append(window_delays)
        unions = _summed(lengths)
        idle = _summed(causes).cast({c: pl.Int64 for c in by_lane.CAUSES})
        named = self.ops.with_columns(pl.col("lane").cast(pl.String))
        owners = self.owners.with_columns(pl.col("lane").cast(pl.String))
        wins = by_lane.windows_of(named, owners, self.steps)
        return by_lane.rows_of(wins, unions, idle, by_lane.attrs_of(named)), pl.concat(delays)

    def _window(self, a: int, b: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series]:
        """Window [a, b): the unions' lengths and idle causes per (lane, step), and its ops' launch delays."""
        overlapping = (pl.col("start") < b) & ((pl.col("end") > a) | (pl.col("start") >= a))
        window = self.ops.filter(overlapping).collect()
        clipped = window.with_columns(pl.col("start").clip(lower_bound=a), pl.col("end").clip(upper_bound=b))
        lengths, merged = by_lane.unions(clipped, self.owners, self.steps)
        own = window.filter(pl.col("start") >= a).with_row_index("row")  # the ops that start in it
        launch = self._launched(own)
        gaps = self._gaps(merged)
        ended = by_lane.ending_ops(gaps, own.select("lane", "row", "correlation", op_start="start"))
        ended = ended.join(launch.drop("start"), on="row", how="left")
        causes = by_lane.idle_causes(ended, self.blocked, self.steps)
        delays = launch.select(d=(pl.col("start") - pl.col("at")).clip(lower_bound=0))["d"]
        return _named(lengths), _named(causes), delays

    def _gaps(self, merged: pl.DataFrame) -> pl.DataFrame:
        """The gaps that end in this window: between the busy periods of the pieces ``merged`` (lane, start,
        end) and the last period before it, which is kept back (per GPU, the last period may go on)."""
        both = merge(pl.concat([self.tail, merged.select(self.tail.columns)]), ["lane"])
        last = pl.int_range(pl.len()).over("lane") == pl.len().over("lane") - 1
        self.tail = both.filter(last)
        return by_lane.gaps_of(both.join(self.owners, on="lane", maintain_order="left"))

    def _launched(self, own: pl.DataFrame) -> pl.DataFrame:
        """row, at_lane, at, start: the earliest call that launched each op of ``own`` (where one is known)."""
        keyed = own.filter(pl.col("correlation").is_not_null()).select("row", "correlation", "pid", "start")
        return part.earliest(self.launches.join(keyed.lazy(), on="correlation").filter(same_process()).collect())


def _named(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("lane").cast(pl.String))


def _summed(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Per (lane, step), the sums of every other column over ``frames`` (a column missing from one is 0)."""
    both = pl.concat(frames, how="diagonal_relaxed")
    return both.group_by(by_lane.KEYS).agg(pl.all().fill_null(0).sum())
