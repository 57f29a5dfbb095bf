"""Pipeline metrics over labelled stage work (ARCHITECTURE.md definitions).

For each step k, W_k runs from the first to the last compute instant over all stages. Per stage:
busy = |union of compute| inside W_k; comm = |union of communication outside compute|; idle = |W_k| − busy;
fill = first compute − W_k.start; drain = W_k.end − last compute; steady idle = idle − fill − drain.
bubble = Σ idle / (p · Σ|W_k|). Steps present on only some stages (a profile window cutting a step) are left out.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE, unions

STEP_KEYS = ["step", "stage"]


def complete_steps(work: pl.DataFrame) -> pl.DataFrame:
    """Work of the steps in which every stage computed."""
    stages = work["stage"].n_unique()
    computed = pl.col("stage").filter(pl.col("role") == "compute").n_unique().over("step")
    return work.filter(pl.col("step").is_not_null() & (computed == stages))


PASSES = ("forward", "backward", "weight")


def windows(work: pl.DataFrame) -> pl.DataFrame:
    """W_k per step: first to last compute instant over all stages. With micro-batch passes known, their
    compute defines it (input creation or an optimizer step outside the schedule do not stretch it)."""
    is_pass = pl.col("phase").is_in(PASSES)
    per_step = work.lazy().filter(pl.col("role") == "compute").group_by("step").agg(
        passes=is_pass.sum(),
        pass_start=pl.col("start").filter(is_pass).min(), pass_end=pl.col("end").filter(is_pass).max(),
        any_start=pl.col("start").min(), any_end=pl.col("end").max(),
    )
    known = pl.col("passes").sum() > 0  # some step has passes: they alone define the windows
    return (
        per_step.filter(~known | (pl.col("passes") > 0))
        .select("step", window_start=pl.when(known).then("pass_start").otherwise("any_start"),
                window_end=pl.when(known).then("pass_end").otherwise("any_end"))
        .sort("step")
        .collect(engine=ENGINE)
    )


def clip_to_windows(work: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """Work cut to its step's window; what lies wholly outside is dropped."""
    return (
        work.lazy().join(win.lazy(), on="step")
        .with_columns(start=pl.max_horizontal("start", "window_start"), end=pl.min_horizontal("end", "window_end"))
        .filter(pl.col("end") > pl.col("start"))
        .drop("window_start", "window_end")
        .collect(engine=ENGINE)
    )


def stage_step_table(work: pl.DataFrame, win: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per (step, stage): busy, comm, first/last compute, fill, drain, idle, steady idle, per-phase time.
    ``win``: the windows ``work`` is already clipped to (``windows``, ``clip_to_windows``), else found here."""
    if win is None:
        win = windows(work)
        work = clip_to_windows(work, win)
    compute = work.filter(pl.col("role") == "compute")
    busy = unions(compute, STEP_KEYS).select(*STEP_KEYS, busy_ns="ns", first="start", last="end")
    both = unions(work, STEP_KEYS).select(*STEP_KEYS, comm_ns="ns")  # |comm ∪ compute|, less |compute| below
    phases = _phase_time(compute)
    table = (
        busy.lazy().join(win.lazy(), on="step", how="inner")
        .join(both.lazy(), on=STEP_KEYS, how="left")
        .join(phases.lazy(), on=STEP_KEYS, how="left")
    )
    window = pl.col("window_end") - pl.col("window_start")
    return (
        table.with_columns(
            pl.col("forward_ns", "backward_ns", "weight_ns").fill_null(0),
            comm_ns=(pl.col("comm_ns") - pl.col("busy_ns")).fill_null(0),
            idle_ns=window - pl.col("busy_ns"),
            fill_ns=pl.col("first") - pl.col("window_start"),
            drain_ns=pl.col("window_end") - pl.col("last"),
            window_ns=window,
        )
        .with_columns(steady_idle_ns=pl.col("idle_ns") - pl.col("fill_ns") - pl.col("drain_ns"))
        .sort(STEP_KEYS)
        .collect(engine=ENGINE)
    )


def _phase_time(compute: pl.DataFrame) -> pl.DataFrame:
    """Compute time per pass kind (union within each pass kind)."""
    per = unions(compute.filter(pl.col("phase").is_in(PASSES)), [*STEP_KEYS, "phase"])
    wide = per.pivot(on="phase", index=STEP_KEYS, values="ns")
    for phase in ("forward", "backward", "weight"):
        if phase not in wide.columns:
            wide = wide.with_columns(pl.lit(0, pl.Int64).alias(phase))
    return wide.select(*STEP_KEYS, forward_ns="forward", backward_ns="backward", weight_ns="weight")


def microbatch_times(work: pl.DataFrame) -> pl.DataFrame:
    """Compute ns per (stage, microbatch, phase), averaged over steps: the input of the what-if replay."""
    compute = work.filter(
        (pl.col("role") == "compute")
        & pl.col("phase").is_in(["forward", "backward", "weight"])
        & pl.col("microbatch").is_not_null()
    )
    per = unions(compute, ["step", "stage", "microbatch", "phase"])
    return (
        per.group_by("stage", "microbatch", "phase")
        .agg(pl.col("ns").mean().round().cast(pl.Int64))
        .sort("stage", "microbatch", "phase")
    )


def microbatch_counts(work: pl.DataFrame) -> dict[int, int]:
    """Micro-batches per stage: the distinct forward micro-batches of its first complete step (the count
    ``detect_schedule`` takes the most common of, so the headline m and the stage rows agree)."""
    forward = work.filter((pl.col("phase") == "forward") & pl.col("microbatch").is_not_null())
    first = forward.filter(pl.col("step") == pl.col("step").min())
    counts = first.group_by("stage").agg(pl.col("microbatch").n_unique())
    return dict(counts.iter_rows())


def detect_schedule(work: pl.DataFrame, counts: dict[int, int] | None = None) -> tuple[str | None, int, int | None]:
    """(schedule, chunks per stage, micro-batches) from each stage's pass order in its first complete step
    (``counts``: ``microbatch_counts(work)``, when the caller has them)."""
    passes = work.filter(pl.col("phase").is_in(["forward", "backward", "weight"]) & pl.col("microbatch").is_not_null())
    if passes.is_empty():
        return None, 1, None
    first = passes.filter(pl.col("step") == pl.col("step").min())
    counts = list((microbatch_counts(work) if counts is None else counts).values())
    m = max(set(counts), key=lambda c: (counts.count(c), c)) if counts else int(first["microbatch"].n_unique())
    chunks = int(first.group_by("stage").agg(pl.col("chunk").n_unique())["chunk"].max() or 1)
    if not first.filter(pl.col("phase") == "backward").height:
        return None, chunks, None  # forward only (inference, or passes that could not be told apart)
    if first.filter(pl.col("phase") == "weight").height:
        return "zero_bubble", chunks, m
    if chunks > 1:
        return "interleaved_1f1b", chunks, m
    order = (
        first.sort("start")
        .group_by("stage", maintain_order=True)
        .agg(
            last_f=pl.col("start").filter(pl.col("phase") == "forward").max(),
            first_b=pl.col("start").filter(pl.col("phase") == "backward").min(),
        )
    )
    gpipe = order.filter(pl.col("first_b").is_not_null()).select((pl.col("last_f") < pl.col("first_b")).all()).item()
    return ("gpipe" if gpipe else "1f1b"), chunks, m


def cv(values: list[float]) -> float:
    """Coefficient of variation (population standard deviation / mean); 0 for fewer than two values. The
    values are summed in sorted order, so the same values in any order give the same float to the last bit
    (group-by order is not fixed)."""
    values = sorted(values)
    if len(values) < 2 or not sum(values):
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5 / mean
