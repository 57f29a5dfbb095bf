"""Waits: idle gaps on each stage inside its step window, biggest first, each with a cause.

Causes, in the order they are tried: ``fill`` (before the stage's first compute of the step), ``drain``
(after its last), ``upstream`` (the next pass is forward of micro-batch j and stage s−1 was still computing
forward j when the gap began: the activation arrived late), ``downstream`` (the same for backward j and
stage s+1: the gradient), ``sync`` (a host synchronize overlaps the gap), ``comm`` (communication covers
most of the gap), ``host`` (a GPU stage idle while its launching thread was busy: launch-bound), ``unknown``.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.report import Wait
from pipebubble.spans import HOST_CALLS

PASS_LETTER = {"forward": "F", "backward": "B", "weight": "W"}


def find_waits(
    work: pl.DataFrame, windows: pl.DataFrame, host: pl.DataFrame, threshold: float, gpu: bool
) -> list[Wait]:
    """Gaps longer than ``threshold`` × |W_k|. ``host`` holds the stages' CPU spans (stage, kind, start, end);
    ``gpu`` says the stages are GPUs (so a busy launching thread can explain a gap)."""
    gaps = _gaps(work, windows, threshold)
    if gaps.is_empty():
        return []
    passes = _passes(work)
    comm = merge(work.filter(pl.col("role") == "comm"), ["stage"])
    labelled = _neighbours(gaps, passes)
    causes = [_cause(row, passes, comm, host, gpu) for row in labelled.iter_rows(named=True)]
    waits = [
        Wait(
            stage=r["stage"],
            start_ns=r["start"],
            dur_ns=r["end"] - r["start"],
            cause=c,
            before=r["before"],
            after=r["after"],
            step=r["step"],
        )
        for r, c in zip(labelled.iter_rows(named=True), causes, strict=True)
    ]
    return sorted(waits, key=lambda w: (-w.dur_ns, w.start_ns, w.stage))


def _gaps(work: pl.DataFrame, windows: pl.DataFrame, threshold: float) -> pl.DataFrame:
    """Fill, steady and drain gaps of every (step, stage) above the threshold."""
    merged = merge(work.filter(pl.col("role") == "compute"), ["step", "stage"]).join(windows, on="step")
    inner = (
        merged.with_columns(gap_start=pl.col("end").shift(1).over("step", "stage"))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select("step", "stage", start="gap_start", end="start", kind=pl.lit("steady"))
    )
    edges = merged.group_by("step", "stage").agg(
        first=pl.col("start").min(),
        last=pl.col("end").max(),
        window_start=pl.col("window_start").first(),
        window_end=pl.col("window_end").first(),
    )
    fill = edges.select("step", "stage", start="window_start", end="first", kind=pl.lit("fill"))
    drain = edges.select("step", "stage", start="last", end="window_end", kind=pl.lit("drain"))
    gaps = pl.concat([fill, inner, drain]).join(windows, on="step")
    limit = threshold * (pl.col("window_end") - pl.col("window_start"))
    return gaps.filter((pl.col("end") - pl.col("start")) > limit).sort("stage", "start")


def _passes(work: pl.DataFrame) -> pl.DataFrame:
    """One row per pass occurrence: stage, step, phase, microbatch, chunk, start, end, label."""
    labelled = work.filter((pl.col("role") == "compute") & pl.col("phase").is_not_null()).sort("stage", "start")
    run = pl.struct("phase", "microbatch", "chunk").rle_id().over("stage")
    grouped = (
        labelled.with_columns(run=run)
        .group_by("stage", "run", maintain_order=True)
        .agg(
            pl.col("step", "phase", "microbatch", "chunk").first(), start=pl.col("start").min(), end=pl.col("end").max()
        )
    )
    letter = pl.col("phase").replace_strict(PASS_LETTER, default=None)
    return grouped.with_columns(
        label=pl.when(letter.is_not_null() & pl.col("microbatch").is_not_null())
        .then(pl.format("{}{}", letter, pl.col("microbatch")))
        .otherwise("phase")
    ).drop("run")


def _neighbours(gaps: pl.DataFrame, passes: pl.DataFrame) -> pl.DataFrame:
    """The pass that ended at each gap's start (before) and the one that began at its end (after)."""
    ends = passes.select("stage", at="end", before="label").sort("at")
    starts = passes.select("stage", at="start", after="label", after_phase="phase", after_mb="microbatch").sort("at")
    with_before = gaps.sort("start").join_asof(
        ends, left_on="start", right_on="at", by="stage", strategy="backward", check_sortedness=False
    )
    both = with_before.sort("end").join_asof(
        starts, left_on="end", right_on="at", by="stage", strategy="forward", check_sortedness=False
    )
    return both.sort("stage", "start")


def _cause(gap: dict, passes: pl.DataFrame, comm: pl.DataFrame, host: pl.DataFrame, gpu: bool) -> str:
    if gap["kind"] in ("fill", "drain"):
        return gap["kind"]
    stage, start, end = gap["stage"], gap["start"], gap["end"]
    for phase, neighbour, cause in (("forward", stage - 1, "upstream"), ("backward", stage + 1, "downstream")):
        if gap["after_phase"] == phase and gap["after_mb"] is not None:
            dep = passes.filter(
                (pl.col("stage") == neighbour)
                & (pl.col("phase") == phase)
                & (pl.col("microbatch") == gap["after_mb"])
                & (pl.col("step") == gap["step"])
            )
            if dep.height and dep["end"].max() > start:
                return cause
    if _covered(host.filter((pl.col("stage") == stage) & (pl.col("kind") == "sync")), start, end) > 0:
        return "sync"
    if _covered(comm.filter(pl.col("stage") == stage), start, end) >= 0.5 * (end - start):
        return "comm"
    work = host.filter((pl.col("stage") == stage) & pl.col("kind").is_in(HOST_CALLS))
    if gpu and _covered(merge(work, ["stage"]), start, end) >= 0.5 * (end - start):
        return "host"
    return "unknown"


def _covered(intervals: pl.DataFrame, start: int, end: int) -> int:
    """Length of [start, end) covered by ``intervals`` (assumed disjoint, e.g. merged)."""
    if intervals.is_empty():
        return 0
    clipped = intervals.select(s=pl.col("start").clip(start, end), e=pl.col("end").clip(start, end))
    return int(clipped.select((pl.col("e") - pl.col("s")).sum()).item() or 0)
