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
  launch comes from one join of the window's operations with the launching calls, and the idle account
  (``analysis/idle``) reads the launching threads' spans from the gaps' starts to their launches. The causes
  per (lane, step) add up over windows as the unions do; steps are the GPU's (``idle.steps``), from one
  query over every operation's launch.
- Summaries: group-bys over the scan (``part.summaries``; the medians in two passes, ``medians.exact``),
  with every operation's launch delay; those of operations held in memory (``held``) beside the windows.

What is held whole is the per-name statistics, one launch delay per operation (8 bytes) and each GPU's last
busy period; a window holds about ``rows_per_window`` operations.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import polars as pl

from pipebubble.analysis import idle
from pipebubble.analysis.breakdown import part
from pipebubble.analysis.breakdown import rows as by_lane
from pipebubble.analysis.intervals import merge
from pipebubble.analysis.launches import launch_calls, same_process
from pipebubble.report import Breakdown
from pipebubble.report.idle import CAUSES

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
    calls = launch_calls(scan.filter(pl.col("device").is_null()), "at_call")
    return ops, calls.select("correlation", "at_pid", pl.col("at_lane").cast(_CAT), "at", "at_end",
                             pl.col("at_call").cast(_CAT))


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
        rows, delays, account = _rows(ops, launches, cpu, step_regex, rows_per_window)
        return replace(part.summarised(rows, gpu, cpu, delays, alone, bounded=True), idle=account)
    with ThreadPoolExecutor(1) as side:
        summaries = side.submit(part.summaries, gpu, cpu, alone)
        rows, delays, account = _rows(ops, launches, cpu, step_regex, rows_per_window)
        return replace(part.with_delays(summaries.result(), rows, delays, alone), idle=account)


def _rows(ops: pl.LazyFrame, launches: pl.LazyFrame, cpu: pl.LazyFrame, step_regex: str | None,
          rows_per_window: int) -> tuple[list[Breakdown], pl.Series, pl.DataFrame]:
    """The breakdown rows of the GPU operations ``ops``, every operation's launch delay and the idle account's
    summary (``idle.top``), window by window."""
    n = ops.select(pl.len()).collect().item()
    if not n:
        return [], pl.Series("d", [], pl.Int64), pl.DataFrame()
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
        self.ops, self.launches, self.cpu = ops, launches, cpu
        joined = ops.select("owner", "pid", "end", "correlation", cls=pl.col("cls").cast(pl.String)).join(
            launches, on="correlation").filter(same_process())
        self.steps = idle.gpu_steps(idle.cpu_steps(cpu, step_regex), joined.select("owner", "at", "end"))
        copies = joined.filter(pl.col("cls").is_in(["memcpy", "memset"]))
        self.held = idle.held_calls(copies.with_columns(
            held=(pl.col("end") <= pl.col("at_end")) & (pl.col("end") > pl.col("at")),
            at_lane=pl.col("at_lane").cast(pl.String)))
        self.owners = ops.select("lane", "owner").unique().collect()
        self.ranks = ops.group_by("lane").agg(pl.col("rank").first()).collect().with_columns(
            pl.col("lane").cast(pl.String))
        self.tail = pl.DataFrame(schema={"lane": _CAT, "start": pl.Int64, "end": pl.Int64})
        self.lookback = idle.lookback(cpu)

    def run(self, edges: list[int]) -> tuple[list[Breakdown], pl.Series, pl.DataFrame]:
        lengths, causes, delays, sums = [], [], [], []
        for a, b in zip(edges, edges[1:], strict=False):
            window_lengths, window_causes, window_delays, window_sums = self._window(a, b)
            lengths.append(window_lengths)
            causes.append(window_causes)
            delays.append(window_delays)
            sums.append(window_sums)
        unions = _summed(lengths)
        causes_ = _summed(causes).cast({c: pl.Int64 for c in CAUSES})
        named = self.ops.with_columns(pl.col("lane").cast(pl.String))
        owners = self.owners.with_columns(pl.col("lane").cast(pl.String))
        wins = by_lane.windows_of(named, owners, self.steps)
        rows = by_lane.rows_of(wins, unions, causes_, by_lane.attrs_of(named))
        return rows, pl.concat(delays), idle.top(pl.concat(sums, how="vertical_relaxed"))

    def _window(self, a: int, b: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series, pl.DataFrame]:
        """Window [a, b): the unions' lengths and idle causes per (lane, step), its ops' launch delays and its
        idle account summed (``idle.summed``)."""
        overlapping = (pl.col("start") < b) & ((pl.col("end") > a) | (pl.col("start") >= a))
        window = self.ops.filter(overlapping).collect()
        clipped = window.with_columns(pl.col("start").clip(lower_bound=a), pl.col("end").clip(upper_bound=b))
        lengths, merged = by_lane.unions(clipped, self.owners, self.steps)
        own = window.filter(pl.col("start") >= a).with_row_index("row")  # the ops that start in it
        launch = self._launched(own)
        gaps = self._gaps(merged)
        ended = idle.ending_ops(gaps, own.select("lane", "row", "correlation", op_start="start"))
        ended = ended.join(launch.drop("start"), on="row", how="left").with_columns(
            pl.col("lane").cast(pl.String), pl.col("at_lane").cast(pl.String), pl.col("at_call").cast(pl.String))
        pieces = idle.pieces(ended, self._threads(ended), self.held)
        causes = by_lane.caused(pieces, self.steps)
        delays = launch.select(d=(pl.col("start") - pl.col("at")).clip(lower_bound=0))["d"]
        return _named(lengths), causes, delays, idle.summed(pieces, self.ranks)

    def _threads(self, ended: pl.DataFrame) -> pl.DataFrame:
        """The host spans of the threads that launched the ops ending ``ended``'s gaps, over the gaps and their
        launches, and as far before as a blocking call's refill can reach (``idle.lookback``)."""
        known = ended.filter(pl.col("at").is_not_null())
        if known.is_empty():
            return pl.DataFrame(schema={"lane": pl.String, "kind": pl.String, "name": pl.String,
                                        "start": pl.Int64, "end": pl.Int64})
        lo = min(known["start"].min(), known["at"].min()) - self.lookback
        hi = max(known["end"].max(), known["at"].max())
        lanes = known["at_lane"].unique().implode()
        near = (pl.col("end") >= lo) & (pl.col("start") <= hi) & pl.col("lane").is_in(lanes)
        return self.cpu.filter(near).select("lane", "kind", "name", "start", "end").collect()

    def _gaps(self, merged: pl.DataFrame) -> pl.DataFrame:
        """The gaps that end in this window: between the busy periods of the pieces ``merged`` (lane, start,
        end) and the last period before it, which is kept back (per GPU, the last period may go on)."""
        both = merge(pl.concat([self.tail, merged.select(self.tail.columns)]), ["lane"])
        last = pl.int_range(pl.len()).over("lane") == pl.len().over("lane") - 1
        self.tail = both.filter(last)
        return idle.gaps_of(both.join(self.owners, on="lane", maintain_order="left"))

    def _launched(self, own: pl.DataFrame) -> pl.DataFrame:
        """row, at_lane, at, at_end, at_call, start, held: the earliest call that launched each op of ``own``
        (where one is known)."""
        keyed = own.filter(pl.col("correlation").is_not_null()).select(
            "row", "correlation", "pid", "start", "end", cls=pl.col("cls").cast(pl.String))
        return part.earliest(self.launches.join(keyed.lazy(), on="correlation").filter(same_process()).collect())


def _named(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("lane").cast(pl.String))


def _summed(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Per (lane, step), the sums of every other column over ``frames`` (a column missing from one is 0)."""
    both = pl.concat(frames, how="diagonal_relaxed")
    return both.group_by(by_lane.KEYS).agg(pl.all().fill_null(0).sum())
