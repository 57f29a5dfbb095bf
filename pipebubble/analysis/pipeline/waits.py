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

from pipebubble.analysis.intervals import ENGINE, merge
from pipebubble.report import Wait
from pipebubble.spans import HOST_CALLS

PASS_LETTER = {"forward": "F", "backward": "B", "weight": "W"}


def find_waits(
    work: pl.DataFrame, windows: pl.DataFrame, host: pl.DataFrame, threshold: float, gpu: bool,
    recvs: pl.DataFrame | None = None,
) -> list[Wait]:
    """Gaps longer than ``threshold`` × |W_k|. ``host`` holds the stages' CPU spans (stage, kind, start, end);
    ``gpu`` says the stages are GPUs (so a busy launching thread can explain a gap); ``recvs`` the paired
    receives (``p2p.reduce_pipeline``: stage, start, end, wait_end, from_stage, from_who). Every gap's cause
    is found at once (joins over all gaps, not queries per gap)."""
    gaps = _gaps(work, windows, threshold)
    if gaps.is_empty():
        return []
    passes = _passes(work)
    if recvs is None:
        recvs = pl.DataFrame(schema={"stage": pl.Int32, "start": pl.Int64, "end": pl.Int64, "wait_end": pl.Int64,
                                     "from_stage": pl.Int32, "from_who": pl.Int64})
    labelled = _causes(_neighbours(gaps, passes).with_row_index("gap"), passes, work, host, gpu, recvs)
    waits = [
        Wait(
            stage=r["stage"],
            start_ns=r["start"],
            dur_ns=r["end"] - r["start"],
            cause=r["cause"],
            before=r["before"],
            after=r["after"],
            step=r["step"],
            waited_for=r["waited_for"],
        )
        for r in labelled.iter_rows(named=True)
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


def _causes(
    gaps: pl.DataFrame, passes: pl.DataFrame, work: pl.DataFrame, host: pl.DataFrame, gpu: bool, recvs: pl.DataFrame
) -> pl.DataFrame:
    """``gaps`` with ``cause`` and ``waited_for`` (a paired receive's sender), tried in the module's order:
    fill and drain; a paired receive whose waiting part covers half the gap; without a receive in the gap,
    the labels; then sync, comm, host or unknown."""
    steady = gaps.filter(pl.col("kind") == "steady").select("gap", "stage", "step", "start", "end", "after_phase",
                                                             "after_mb")
    found = _peer_waits(steady, recvs).join(_label_waits(steady, passes), on="gap", how="left").join(
        _other_causes(steady, work, host, gpu), on="gap", how="left"
    )
    length = pl.col("end") - pl.col("start")
    peer = pl.col("held").fill_null(False) & (2 * pl.col("spun") >= length)
    cause = (
        pl.when(pl.col("kind").is_in(["fill", "drain"])).then(pl.col("kind"))
        .when(peer).then(pl.when(pl.col("from_stage") < pl.col("stage")).then(pl.lit("upstream"))
                         .otherwise(pl.lit("downstream")))
        .when(~pl.col("held").fill_null(False) & ~pl.col("inside").fill_null(False) & pl.col("by_label").is_not_null())
        .then(pl.col("by_label"))
        .otherwise(pl.col("other"))
    )
    joined = gaps.join(found.drop("stage", "step", "start", "end", "after_phase", "after_mb"), on="gap", how="left")
    return joined.with_columns(cause=cause, waited_for=pl.when(peer).then(pl.col("from_who"))).sort("gap")


def _peer_waits(steady: pl.DataFrame, recvs: pl.DataFrame) -> pl.DataFrame:
    """Per gap: ``held`` (a paired receive on its stage was waiting for its send during the gap), ``inside``
    (one overlaps it at all), and of those that waited, the one that waited longest in it (``spun``; the
    earliest at equal length): its ``from_stage`` and ``from_who``."""
    marks = recvs.select(
        "from_stage", "from_who", r_stage="stage", r_start="start", r_end="end", wait_end="wait_end",
        reach=pl.max_horizontal("end", "wait_end"),
    )
    overlapping = steady.join_where(
        marks, pl.col("stage") == pl.col("r_stage"), pl.col("r_start") < pl.col("end"),
        pl.col("reach") > pl.col("start"),
    ).with_columns(
        held_one=(pl.col("r_start") < pl.col("end")) & (pl.col("wait_end") > pl.col("start")),
        inside_one=(pl.col("r_start") < pl.col("end")) & (pl.col("r_end") > pl.col("start")),
        spun=pl.min_horizontal("wait_end", "end") - pl.max_horizontal("r_start", "start"),
    )
    flags = overlapping.group_by("gap").agg(held=pl.col("held_one").any(), inside=pl.col("inside_one").any())
    best = (
        overlapping.filter("held_one")
        .sort("gap", "spun", "r_start", descending=[False, True, False], maintain_order=True)
        .unique("gap", keep="first", maintain_order=True)
        .select("gap", "spun", "from_stage", "from_who")
    )
    return steady.join(flags, on="gap", how="left").join(best, on="gap", how="left")


def _label_waits(steady: pl.DataFrame, passes: pl.DataFrame) -> pl.DataFrame:
    """Per gap, by the micro-batch labels (``by_label``): upstream when the pass after it is forward j and the
    stage before was still computing forward j of the step when the gap began; downstream the same for
    backward j and the stage after; else null."""
    neighbour = pl.when(pl.col("after_phase") == "forward").then(pl.col("stage") - 1).otherwise(pl.col("stage") + 1)
    probes = steady.filter(pl.col("after_phase").is_in(["forward", "backward"]) & pl.col("after_mb").is_not_null())
    probes = probes.select("gap", "start", "after_phase", n_stage=neighbour.cast(pl.Int32), step=pl.col("step"),
                           mb=pl.col("after_mb"))
    ends = passes.group_by(n_stage="stage", after_phase="phase", mb="microbatch", step="step").agg(
        dep_end=pl.col("end").max()
    )
    late = probes.join(ends, on=["n_stage", "after_phase", "mb", "step"]).filter(pl.col("dep_end") > pl.col("start"))
    cause = pl.when(pl.col("after_phase") == "forward").then(pl.lit("upstream")).otherwise(pl.lit("downstream"))
    return late.select("gap", by_label=cause)


def _other_causes(steady: pl.DataFrame, work: pl.DataFrame, host: pl.DataFrame, gpu: bool) -> pl.DataFrame:
    """Per gap (``other``): sync (a host synchronize overlaps it), comm (communication covers half of it),
    host (a GPU stage's launching thread was busy for half of it) or unknown."""
    length = pl.col("end") - pl.col("start")
    sync = _covered(steady, host.filter(pl.col("kind") == "sync"))
    comm = _covered(steady, merge(work.filter(pl.col("role") == "comm"), ["stage"]))
    calls = _covered(steady, merge(host.filter(pl.col("kind").is_in(HOST_CALLS)), ["stage"]))
    covered = steady.select("gap", "start", "end").with_columns(sync=sync, comm=comm, calls=calls)
    other = (
        pl.when(pl.col("sync") > 0).then(pl.lit("sync"))
        .when(pl.col("comm") >= 0.5 * length).then(pl.lit("comm"))
        .when(pl.lit(gpu) & (pl.col("calls") >= 0.5 * length)).then(pl.lit("host"))
        .otherwise(pl.lit("unknown"))
    )
    return covered.select("gap", other=other)


def _covered(gaps: pl.DataFrame, intervals: pl.DataFrame) -> pl.Series:
    """Per gap (in ``gaps``' order), the length of it that ``intervals`` (stage, start, end; disjoint within a
    stage, as merged ones are) cover: C(end) − C(start), C(t) being the length covered before t (the
    intervals' lengths before the last one starting at or before t, plus what of that one lies before t).
    One query: both ends of every gap looked up at once."""
    length = pl.col("end") - pl.col("start")
    marks = (
        intervals.lazy().sort("stage", "start")
        .select("stage", at="start", iv_start="start", iv_end="end", before=length.cum_sum().over("stage") - length)
        .sort("at")
    )
    probes = pl.concat([
        gaps.lazy().select("gap", "stage", at="start", sign=pl.lit(-1, pl.Int64)),
        gaps.lazy().select("gap", "stage", at="end", sign=pl.lit(1, pl.Int64)),
    ]).sort("at")
    joined = probes.join_asof(marks, on="at", by="stage", strategy="backward", check_sortedness=False)
    upto = (pl.col("before") + pl.min_horizontal("at", "iv_end") - pl.col("iv_start")).fill_null(0)
    per = joined.group_by("gap").agg(covered=(pl.col("sign") * upto).sum())
    order = gaps.lazy().select("gap").join(per, on="gap", how="left", maintain_order="left")
    return order.collect(engine=ENGINE)["covered"].fill_null(0)
