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

What is held whole is the per-name statistics and each GPU's last busy period; a window holds about
``rows_per_window`` operations. Each window's launch delays and tiny-kernel gaps (``facts.WindowedGaps``) are
counted as it passes: the delays are written to the scratch folder the narrow tables lie in, and their median
taken there in two passes (``medians.exact``), so no pass holds one value per operation.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import polars as pl

from pipebubble.analysis import idle
from pipebubble.analysis.breakdown import facts, part
from pipebubble.analysis.breakdown import rows as by_lane
from pipebubble.analysis.intervals import ENGINE, merge, time_edges
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
    rows_per_window: int, gpu: pl.LazyFrame | None = None, scratch: Path | None = None,
) -> part.GpuPart:
    """``breakdown.part.gpu_part`` of the span table ``scan`` (one file's), given ``narrow``'s tables written out
    (``ops``, ``launches``), with about ``rows_per_window`` GPU operations in memory at a time. ``gpu``: the
    GPU operations held in memory (``held``), whose summaries then read them, not the scan, take their
    medians whole, and run beside the windows (they hold nothing a window does not). ``scratch``: a folder
    for the windows' launch delays (else they are held, one number per operation)."""
    bounded = gpu is None
    gpu = part.gpu_ops(scan) if bounded else gpu
    cpu = scan.filter(pl.col("device").is_null())
    if bounded:
        rows, delays, account, gaps = _rows(ops, launches, cpu, step_regex, rows_per_window, scratch)
        return replace(part.summarised(rows, gpu, cpu, delays, alone, bounded=True, gaps=gaps,
                                       step_regex=step_regex), idle=account)
    with ThreadPoolExecutor(1) as side:
        summaries = side.submit(part.summaries, gpu, cpu, alone, step_regex=step_regex)
        rows, delays, account, _ = _rows(ops, launches, cpu, step_regex, rows_per_window)
        return replace(part.with_delays(summaries.result(), rows, delays, alone), idle=account)


def _rows(ops: pl.LazyFrame, launches: pl.LazyFrame, cpu: pl.LazyFrame, step_regex: str | None,
          rows_per_window: int, scratch: Path | None = None,
          ) -> tuple[list[Breakdown], pl.Series | pl.LazyFrame, pl.DataFrame, pl.DataFrame]:
    """The breakdown rows of the GPU operations ``ops``, every operation's launch delay (held, or a scan of
    them in ``scratch``), the idle account's summary (``idle.top``) and the tiny-kernel gaps
    (``facts.gaps``), window by window (``intervals.time_edges``)."""
    n, edges = time_edges(ops, rows_per_window)
    if not n:
        return [], pl.Series("d", [], pl.Int64), pl.DataFrame(), facts.WindowedGaps().result()
    return _Passes(ops, launches, cpu, step_regex, scratch).run(edges)


class _Passes:
    """The windows, in time order, and what carries from one to the next (each GPU's last busy period)."""

    def __init__(self, ops: pl.LazyFrame, launches: pl.LazyFrame, cpu: pl.LazyFrame, step_regex: str | None,
                 scratch: Path | None = None):
        self.ops, self.launches, self.cpu, self.scratch = ops, launches, cpu, scratch
        self.host_steps = idle.cpu_steps(cpu, step_regex)
        self.steps = pl.DataFrame(schema=idle.STEP_SCHEMA)  # ``run`` extends the host's over the windows
        # The copies and memsets (few) first, then their launches: a join that holds no launch of a kernel. Each
        # by its earliest launch (``part.earliest``), as the whole table's account takes it.
        copies = ops.filter(pl.col("cls").is_in(["memcpy", "memset"])).with_row_index("row").select(
            "row", "pid", "start", "end", "correlation", cls=pl.col("cls").cast(pl.String)).collect(
            engine="streaming")
        calls = launches.filter(pl.col("correlation").is_in(copies["correlation"].drop_nulls().implode()))
        launched = part.earliest(calls.collect(engine="streaming").join(copies, on="correlation").filter(
            same_process()))
        self.held = idle.held_calls(launched.with_columns(pl.col("at_lane").cast(pl.String)))
        self.owners = ops.select("lane", "owner").unique().collect(engine="streaming")
        self.ranks = ops.group_by("lane").agg(pl.col("rank").first()).collect(engine="streaming").with_columns(
            pl.col("lane").cast(pl.String))
        self.tail = pl.DataFrame(schema={"lane": _CAT, "start": pl.Int64, "end": pl.Int64})
        self.lookback = idle.lookback(cpu)
        self.gaps = facts.WindowedGaps()
        self.delays: list[pl.Series] = []
        self.files: list[str] = []

    def run(self, edges: list[int]) -> tuple[list[Breakdown], pl.Series | pl.LazyFrame, pl.DataFrame, pl.DataFrame]:
        self.steps = self._steps(edges)
        lengths, causes, sums = [], [], []
        for k, (a, b) in enumerate(zip(edges, edges[1:], strict=False)):
            window_lengths, window_causes, window_delays, window_sums = self._window(a, b)
            lengths.append(window_lengths)
            causes.append(window_causes)
            self._keep(k, window_delays)
            sums.append(window_sums)
        unions = _summed(lengths)
        causes_ = _summed(causes).cast({c: pl.Int64 for c in CAUSES})
        named = self.ops.with_columns(pl.col("lane").cast(pl.String))
        owners = self.owners.with_columns(pl.col("lane").cast(pl.String))
        wins = by_lane.windows_of(named, owners, self.steps, engine="streaming")
        rows = by_lane.rows_of(wins, unions, causes_, by_lane.attrs_of(named, engine="streaming"))
        if self.files:
            every: pl.Series | pl.LazyFrame = pl.scan_parquet(self.files)
        else:
            every = pl.concat(self.delays) if self.delays else pl.Series("d", [], pl.Int64)
        return rows, every, idle.top(pl.concat(sums, how="vertical_relaxed")), self.gaps.result()

    def _steps(self, edges: list[int]) -> pl.DataFrame:
        """The steps as the GPU lives them (``idle.gpu_steps``): the host's, each extended to the end of the GPU
        work launched inside it, which is read a window at a time (``idle.step_reach`` of each window's
        operations, by their earliest launch, as ``part.earliest`` takes it), not joined whole."""
        if self.host_steps.is_empty():
            return self.steps
        reach = []
        for a, b in zip(edges, edges[1:], strict=False):
            own = self.ops.filter((pl.col("start") >= a) & (pl.col("start") < b)).collect().with_row_index("row")
            launched = self._launched(own).lazy().select("row", "at").join(
                own.lazy().select("row", "owner", "end"), on="row")
            reach.append(idle.step_reach(self.host_steps, launched).collect(engine=ENGINE))
        summed = pl.concat(reach).group_by("owner", "step", "ws").agg(pl.col("gpu_end").max())
        return idle.gpu_steps(self.host_steps, reach=summed)

    def _keep(self, k: int, delays: pl.Series) -> None:
        """A window's launch delays, written to the scratch folder; held where there is none, or once
        writing there failed (with those written before read back)."""
        delays = delays.rename("d")
        if self.scratch is not None:
            path = str(self.scratch / f"delays-{k:06d}.parquet")
            try:
                delays.to_frame().write_parquet(path)
                self.files.append(path)
                return
            except OSError:
                self.scratch = None
                self.delays = [pl.read_parquet(f)["d"] for f in self.files]
                self.files = []
        self.delays.append(delays)

    def _window(self, a: int, b: int) -> tuple[pl.DataFrame, pl.DataFrame, pl.Series, pl.DataFrame]:
        """Window [a, b): the unions' lengths and idle causes per (lane, step), its ops' launch delays and its
        idle account summed (``idle.summed``)."""
        overlapping = (pl.col("start") < b) & ((pl.col("end") > a) | (pl.col("start") >= a))
        window = self.ops.filter(overlapping).collect()
        clipped = window.with_columns(pl.col("start").clip(lower_bound=a), pl.col("end").clip(upper_bound=b))
        lengths, merged = by_lane.unions(clipped, self.owners, self.steps)
        own = window.filter(pl.col("start") >= a).with_row_index("row")  # the ops that start in it
        self.gaps.add(facts.gap_ops(own).collect())
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
        """The host spans of the threads that launched the ops ending ``ended``'s gaps, over the gaps (and the
        launches that came after a gap began), and as far before as a blocking call's refill can reach
        (``idle.lookback``). The launch of an op queued before its gap began is not read: the account reads
        the thread over the gap alone there (what blocked, or held the op queued), so a GPU far behind its
        host reads no more of the host than the gaps' own time."""
        known = ended.filter(pl.col("at").is_not_null())
        if known.is_empty():
            return pl.DataFrame(schema={"lane": pl.String, "kind": pl.String, "name": pl.String,
                                        "start": pl.Int64, "end": pl.Int64})
        lo = known["start"].min() - self.lookback
        hi = max(known["end"].max(), known["at"].max())
        lanes = known["at_lane"].unique().implode()
        near = (pl.col("end") >= lo) & (pl.col("start") <= hi) & pl.col("lane").is_in(lanes)
        # And each launching thread's last launch call among them, so every one is there to be read, as the
        # whole table has it, even where it has no span near the gaps (its time there is then its own).
        last = known.group_by("at_lane").agg(pl.col("at").max())
        calls = [(pl.col("lane") == lane) & (pl.col("start") <= at) & (pl.col("end") >= at)
                 for lane, at in last.iter_rows()]
        return self.cpu.filter(pl.any_horizontal(near, *calls)).select("lane", "kind", "name", "start", "end").collect()

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
        # Only the launches whose ids lie among the window's (the scan reads no other): ids rise with time.
        lo, hi = keyed["correlation"].min(), keyed["correlation"].max()
        near = pl.col("correlation").is_between(lo, hi) if lo is not None else pl.lit(False)
        calls = self.launches.filter(near).join(keyed.lazy(), on="correlation").filter(same_process())
        return part.earliest(calls.collect())


def _named(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.with_columns(pl.col("lane").cast(pl.String))


def _summed(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Per (lane, step), the sums of every other column over ``frames`` (a column missing from one is 0)."""
    both = pl.concat(frames, how="diagonal_relaxed")
    return both.group_by(by_lane.KEYS).agg(pl.all().fill_null(0).sum())
