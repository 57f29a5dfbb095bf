"""The report's timeline of a pipeline: runs of one pass on a stage's lane, and its communication, as
segments to draw (never to measure)."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.report import Segment

#: A report's timeline is for looking at: communication closer than 1/4000 of the window merges, and past
#: this many segments neighbours merge per phase (dropping micro-batch numbers). Metrics never use it.
MAX_SEGMENTS = 20_000


def timeline(work: pl.DataFrame) -> list[Segment]:
    """Contiguous runs of one pass on a stage's lane, plus communication, as segments."""
    keys = ["stage", "lane"]
    compute = (
        work.filter(pl.col("role") == "compute")
        .sort(*keys, "start")
        .with_columns(phase=pl.col("phase").fill_null("other"))
    )
    run = pl.struct("phase", "microbatch", "chunk", "step").rle_id().over(keys)
    runs = (
        compute.with_columns(run=run)
        .group_by(*keys, "run", maintain_order=True)
        .agg(
            pl.col("phase", "microbatch", "chunk", "step").first(), start=pl.col("start").min(), end=pl.col("end").max()
        )
    )
    tol = max(1, (work["end"].max() - work["start"].min()) // 4000)
    comm = _merge_close(work.filter(pl.col("role") == "comm"), keys, tol).with_columns(phase=pl.lit("comm"))
    cols = ["stage", "start", "end", "phase", "microbatch", "chunk", "step", "lane"]
    both = pl.concat([runs, comm], how="diagonal_relaxed").select(cols)
    if both.height > MAX_SEGMENTS:  # coarser still: each stage gets its share of the budget
        span = work["end"].max() - work["start"].min()
        coarse = max(tol, span * work["stage"].n_unique() // MAX_SEGMENTS)
        both = _merge_close(both, [*keys, "phase"], coarse).select(cols)
    return [Segment(*row) for row in both.sort("stage", "start", "lane").iter_rows()]


def _merge_close(frame: pl.DataFrame, by: list[str], tol: int) -> pl.DataFrame:
    """Union per ``by`` of intervals, joining those less than ``tol`` apart; labels beyond ``by`` are dropped."""
    merged = merge(frame.with_columns(pl.col("end") + tol), by).with_columns(pl.col("end") - tol)
    for column, dtype in (("microbatch", pl.Int32), ("chunk", pl.Int32), ("step", pl.Int32), ("phase", pl.String)):
        if column not in merged.columns:
            merged = merged.with_columns(pl.lit(None, dtype).alias(column))
    return merged
