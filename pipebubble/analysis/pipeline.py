"""Pipeline metrics over labelled stage work (ARCHITECTURE.md definitions).

For each step k, W_k runs from the first to the last compute instant over all stages. Per stage:
busy = |union of compute| inside W_k; comm = |union of communication outside compute|; idle = |W_k| − busy;
fill = first compute − W_k.start; drain = W_k.end − last compute; steady idle = idle − fill − drain.
bubble = Σ idle / (p · Σ|W_k|). Steps present on only some stages (a profile window cutting a step) are left out.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import merge

STEP_KEYS = ["step", "stage"]


def complete_steps(work: pl.DataFrame) -> pl.DataFrame:
    """Work of the steps in which every stage computed."""
    stages = work["stage"].n_unique()
    compute = work.filter(pl.col("role") == "compute")
    full = compute.group_by("step").agg(pl.col("stage").n_unique().alias("n")).filter(pl.col("n") == stages)
    return work.filter(pl.col("step").is_in(full["step"].implode()))


PASSES = ("forward", "backward", "weight")


def windows(work: pl.DataFrame) -> pl.DataFrame:
    """W_k per step: first to last compute instant over all stages. With micro-batch passes known, their
    compute defines it (input creation or an optimizer step outside the schedule do not stretch it)."""
    compute = work.filter(pl.col("role") == "compute")
    passes = compute.filter(pl.col("phase").is_in(PASSES))
    frame = passes if passes.height else compute
    return frame.group_by("step").agg(window_start=pl.col("start").min(), window_end=pl.col("end").max()).sort("step")


def clip_to_windows(work: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """Work cut to its step's window; what lies wholly outside is dropped."""
    return (
        work.join(win, on="step")
        .with_columns(start=pl.max_horizontal("start", "window_start"), end=pl.min_horizontal("end", "window_end"))
        .filter(pl.col("end") > pl.col("start"))
        .drop("window_start", "window_end")
    )


def stage_step_table(work: pl.DataFrame) -> pl.DataFrame:
    """One row per (step, stage): busy, comm, first/last compute, fill, drain, idle, steady idle, per-phase time."""
    win = windows(work)
    work = clip_to_windows(work, win)
    compute = merge(work.filter(pl.col("role") == "compute"), STEP_KEYS)
    busy = compute.group_by(STEP_KEYS).agg(
        busy_ns=(pl.col("end") - pl.col("start")).sum(), first=pl.col("start").min(), last=pl.col("end").max()
    )
    comm = _exposed_comm(work, win)
    phases = _phase_time(work)
    table = (
        busy.join(win, on="step", how="inner")
        .join(comm, on=STEP_KEYS, how="left")
        .join(phases, on=STEP_KEYS, how="left")
    )
    window = pl.col("window_end") - pl.col("window_start")
    return (
        table.with_columns(
            pl.col("comm_ns", "forward_ns", "backward_ns", "weight_ns").fill_null(0),
            idle_ns=window - pl.col("busy_ns"),
            fill_ns=pl.col("first") - pl.col("window_start"),
            drain_ns=pl.col("window_end") - pl.col("last"),
            window_ns=window,
        )
        .with_columns(steady_idle_ns=pl.col("idle_ns") - pl.col("fill_ns") - pl.col("drain_ns"))
        .sort(STEP_KEYS)
    )


def _exposed_comm(clipped: pl.DataFrame, win: pl.DataFrame) -> pl.DataFrame:
    """|comm ∪ compute| − |compute| inside W_k: communication time during which the stage did not compute."""
    both = _union_len(clipped, "both")
    only = _union_len(clipped.filter(pl.col("role") == "compute"), "compute")
    return both.join(only, on=STEP_KEYS, how="left").select(
        *STEP_KEYS, comm_ns=pl.col("both") - pl.col("compute").fill_null(0)
    )


def _union_len(frame: pl.DataFrame, name: str) -> pl.DataFrame:
    merged = merge(frame, STEP_KEYS)
    return merged.group_by(STEP_KEYS).agg((pl.col("end") - pl.col("start")).sum().alias(name))


def _phase_time(work: pl.DataFrame) -> pl.DataFrame:
    """Compute time per pass kind (union within each pass kind)."""
    compute = work.filter((pl.col("role") == "compute") & pl.col("phase").is_in(["forward", "backward", "weight"]))
    merged = merge(compute, [*STEP_KEYS, "phase"])
    per = merged.group_by(*STEP_KEYS, "phase").agg((pl.col("end") - pl.col("start")).sum().alias("ns"))
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
    merged = merge(compute, ["step", "stage", "microbatch", "phase"])
    per = merged.group_by("step", "stage", "microbatch", "phase").agg(
        (pl.col("end") - pl.col("start")).sum().alias("ns")
    )
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


def detect_schedule(work: pl.DataFrame) -> tuple[str | None, int, int | None]:
    """(schedule, chunks per stage, micro-batches) from each stage's pass order in its first complete step."""
    passes = work.filter(pl.col("phase").is_in(["forward", "backward", "weight"]) & pl.col("microbatch").is_not_null())
    if passes.is_empty():
        return None, 1, None
    first = passes.filter(pl.col("step") == pl.col("step").min())
    counts = list(microbatch_counts(work).values())
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
