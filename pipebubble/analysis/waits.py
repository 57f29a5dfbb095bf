"""Waits: idle gaps on each stage inside its step window, biggest first, each with a cause.

Causes, in the order they are tried: ``fill`` (before the stage's first compute of the step), ``drain``
(after its last), ``upstream``/``downstream`` from the receives paired with their sends (``p2p``): where
a receive overlaps the gap, the gap waited for the peer's send when that receive's waiting part (before
the send began) covers at least half of it, and then names the sending rank (``waited_for``) and is
``upstream`` when it sent from an earlier stage, ``downstream`` from a later one; a gap holding a paired
receive that did not wait that long did not wait for its peer, and goes on to the causes after these.
Without a paired receive in the gap, the labels decide: ``upstream`` (the next pass is forward of
micro-batch j and stage s−1 was still computing forward j when the gap began: the activation arrived
late), ``downstream`` (the same for backward j and stage s+1: the gradient). The wait stays the whole gap
(the stage's idle: the host's time before it posted the receive, the spin and the transfer).
``sync`` (a host synchronize overlaps the gap), ``comm`` (communication covers
most of the gap), ``host`` (a GPU stage idle while its launching thread was busy: launch-bound), ``unknown``.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.report import Wait
from pipebubble.spans import HOST_CALLS

PASS_LETTER = {"forward": "F", "backward": "B", "weight": "W"}


def find_waits(
    work: pl.DataFrame, windows: pl.DataFrame, host: pl.DataFrame, threshold: float, gpu: bool,
    recvs: pl.DataFrame | None = None,
) -> list[Wait]:
    """Gaps longer than ``threshold`` × |W_k|. ``host`` holds the stages' CPU spans (stage, kind, start, end);
    ``gpu`` says the stages are GPUs (so a busy launching thread can explain a gap); ``recvs`` the paired
    receives (``p2p.reduce_pipeline``: stage, start, end, wait_end, from_stage, from_who)."""
    gaps = _gaps(work, windows, threshold)
    if gaps.is_empty():
        return []
    passes = _passes(work)
    comm = merge(work.filter(pl.col("role") == "comm"), ["stage"])
    labelled = _neighbours(gaps, passes)
    if recvs is None:
        recvs = pl.DataFrame(schema={"stage": pl.Int32, "start": pl.Int64, "end": pl.Int64, "wait_end": pl.Int64,
                                     "from_stage": pl.Int32, "from_who": pl.Int64})
    causes = [_cause(row, passes, comm, host, gpu, recvs) for row in labelled.iter_rows(named=True)]
    waits = [
        Wait(
            stage=r["stage"],
            start_ns=r["start"],
            dur_ns=r["end"] - r["start"],
            cause=c,
            before=r["before"],
            after=r["after"],
            step=r["step"],
            waited_for=who,
        )
        for r, (c, who) in zip(labelled.iter_rows(named=True), causes, strict=True)
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


def _cause(
    gap: dict, passes: pl.DataFrame, comm: pl.DataFrame, host: pl.DataFrame, gpu: bool, recvs: pl.DataFrame
) -> tuple[str, int | None]:
    """The gap's cause, and the rank it waited for (a paired receive's sender)."""
    if gap["kind"] in ("fill", "drain"):
        return gap["kind"], None
    stage, start, end = gap["stage"], gap["start"], gap["end"]
    held = recvs.filter((pl.col("stage") == stage) & (pl.col("start") < end) & (pl.col("wait_end") > start))
    inside = recvs.filter((pl.col("stage") == stage) & (pl.col("start") < end) & (pl.col("end") > start))
    if held.height:
        spun = pl.min_horizontal(pl.col("wait_end"), pl.lit(end)) - pl.max_horizontal(pl.col("start"), pl.lit(start))
        best = held.with_columns(spun=spun).sort("spun", "start", descending=[True, False]).row(0, named=True)
        if 2 * best["spun"] >= end - start:
            return ("upstream" if best["from_stage"] < stage else "downstream"), best["from_who"]
    if not (held.height or inside.height):
        return _label_cause(gap, passes, comm, host, gpu), None
    return _other_cause(stage, start, end, comm, host, gpu), None


def _label_cause(gap: dict, passes: pl.DataFrame, comm: pl.DataFrame, host: pl.DataFrame, gpu: bool) -> str:
    """Upstream or downstream by the micro-batch labels, else the causes after them."""
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
    return _other_cause(stage, start, end, comm, host, gpu)


def _other_cause(stage: int, start: int, end: int, comm: pl.DataFrame, host: pl.DataFrame, gpu: bool) -> str:
    """Sync, comm, host or unknown."""
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
