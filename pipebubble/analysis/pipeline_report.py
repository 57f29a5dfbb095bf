"""The pipeline part of the report: stages, the pipeline summary, waits and the timeline."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction

import polars as pl

from pipebubble import stages as st
from pipebubble.analysis import pipeline as pm
from pipebubble.analysis import schedules, whatif
from pipebubble.analysis.intervals import merge
from pipebubble.analysis.waits import find_waits
from pipebubble.analysis.work import stage_work
from pipebubble.errors import StageSpecError
from pipebubble.options import PipelineOptions
from pipebubble.report import Pipeline, Segment, Stage, StepResult, Wait


@dataclass(frozen=True)
class PipelineSection:
    stages: list[Stage] = field(default_factory=list)
    pipeline: Pipeline | None = None
    waits: list[Wait] = field(default_factory=list)
    timeline: list[Segment] = field(default_factory=list)


@dataclass(frozen=True)
class StagePart:
    """What one trace file contributes to the pipeline analysis (the map side): its stages' labelled work,
    their host activity (merged), the stages' names with sort keys, and how passes were labelled."""

    names: list[str]
    order: list[tuple]
    work: pl.DataFrame  # WORK_COLUMNS; ``stage`` indexes ``names``
    host: pl.DataFrame  # stage, kind, start, end: merged CPU activity per stage and kind
    facts: dict
    pipeline: int | None = None  # the pipeline group (its lowest rank), when stages came from one


def stage_part(
    spans: pl.DataFrame,
    options: PipelineOptions,
    world: int | None = None,
    alone: bool = False,
    groups: list | None = None,
) -> StagePart | None:
    """Map: one file's (or any subset's) stage work. None when no span belongs to a stage, or when the file
    is ``alone`` (the whole job) and holds a single stage: no pipeline, so no work to label."""
    if alone and not options.stages.rules and one_stage(spans):
        return None
    mapped = st.assign(spans, options.stages, world, groups)
    stages = mapped.spans["stage"].drop_nulls()
    if stages.is_empty() or (alone and stages.n_unique() < 2):
        return None
    work, facts = stage_work(mapped.spans, options.stages.microbatch_regex)
    cpu = mapped.spans.filter(
        pl.col("stage").is_not_null() & pl.col("device").is_null() & pl.col("kind").is_in(["sync", "cpu_op", "runtime"])
    )
    return StagePart(mapped.names, mapped.order, work, merge(cpu, ["stage", "kind"]), facts, mapped.pipeline)


def one_stage(spans: pl.DataFrame | pl.LazyFrame) -> bool:
    """One rank and at most one GPU: whatever the stage rule, a single stage (cheap to tell, unlike assigning)."""
    lazy = spans.lazy()
    ranks = lazy.select(pl.col("rank").n_unique()).collect().item()
    gpus = lazy.filter(pl.col("device").is_not_null()).select(pl.struct("pid", "device").n_unique()).collect().item()
    return ranks <= 1 and gpus <= 1


def combine(parts: list[StagePart]) -> tuple[list[str], pl.DataFrame, pl.DataFrame, dict]:
    """Reduce, first half: one stage numbering over all files (ordered by the stages' keys; a name seen in
    several files is one stage), and the work and host tables renumbered to it. Where ranks name their
    pipeline groups, the pipeline analysed is the one holding the lowest rank (data-parallel replicas of
    it are left out)."""
    groups = {p.pipeline for p in parts if p.pipeline is not None}
    if groups:
        parts = [p for p in parts if p.pipeline == min(groups)]
    used = {
        (n, o)
        for part in parts
        for i, (n, o) in enumerate(zip(part.names, part.order, strict=True))
        if part.work.filter(pl.col("stage") == i).height
    }
    names = [n for n, _ in sorted(used, key=lambda item: (item[1], item[0]))]
    names = list(dict.fromkeys(names))
    index = {n: i for i, n in enumerate(names)}
    works, hosts = [], []
    for part in parts:
        remap = {i: index[n] for i, n in enumerate(part.names) if n in index}
        renumber = pl.col("stage").replace_strict(remap, default=None, return_dtype=pl.Int32)
        works.append(part.work.with_columns(stage=renumber).filter(pl.col("stage").is_not_null()))
        hosts.append(part.host.with_columns(stage=renumber).filter(pl.col("stage").is_not_null()))
    facts = {
        "pattern": next((p.facts["pattern"] for p in parts if p.facts["pattern"]), None),
        "inferred": any(p.facts["inferred"] for p in parts),
        "mode": "gpu" if any(p.facts["mode"] == "gpu" for p in parts) else "cpu",
    }
    work = pl.concat(works, how="vertical_relaxed") if works else pl.DataFrame()
    host = pl.concat(hosts, how="vertical_relaxed") if hosts else pl.DataFrame()
    return names, work, host, facts


def reduce_stages(parts: list[StagePart], options: PipelineOptions = PipelineOptions()) -> PipelineSection:
    """Reduce: everything pipeline-shaped from the files' parts; empty when fewer than two stages."""
    parts = [p for p in parts if p is not None]
    if not parts:
        return PipelineSection()
    names, work, host, facts = combine(parts)
    p = len(names)
    if p < 2:
        return PipelineSection()
    work = pm.complete_steps(work)
    if work.is_empty():
        return PipelineSection()
    wins = pm.windows(work)
    work = pm.clip_to_windows(work, wins)
    table = pm.stage_step_table(work)
    schedule, chunks, m = pm.detect_schedule(work)
    stage_rows = _stages(table, work, names, p)
    if len(stage_rows) < 2 or not _measurable(wins):
        return PipelineSection()  # no two stages with work of any length: nothing pipeline-shaped to measure
    waits = find_waits(work, wins, host, options.wait_threshold, facts["mode"] == "gpu")
    pipeline = _pipeline(table, work, stage_rows, wins, (schedule, chunks, m), facts, options, waits)
    lane_of = {s.stage: s.lanes[0] for s in stage_rows if s.lanes}
    waits = [replace(w, lane=lane_of.get(w.stage)) for w in waits]
    return PipelineSection(stage_rows, pipeline, waits, _timeline(work))


def _measurable(wins: pl.DataFrame) -> bool:
    """Every step window has a length (zero-length work alone gives windows of 0 ns)."""
    return bool(wins.height) and bool(wins.select((pl.col("window_end") > pl.col("window_start")).all()).item())


def _stages(table: pl.DataFrame, work: pl.DataFrame, names: list[str], p: int) -> list[Stage]:
    sums = (
        table.group_by("stage")
        .agg(
            pl.col(c).sum()
            for c in (
                "busy_ns",
                "comm_ns",
                "idle_ns",
                "fill_ns",
                "drain_ns",
                "steady_idle_ns",
                "window_ns",
                "forward_ns",
                "backward_ns",
                "weight_ns",
            )
        )
        .sort("stage")
    )
    lanes = work.group_by("stage").agg(pl.col("lane").unique().sort())
    per_mb = pm.microbatch_times(work).group_by("stage", "microbatch").agg(pl.col("ns").sum())
    out = []
    for row in sums.join(lanes, on="stage").sort("stage").iter_rows(named=True):
        mb = per_mb.filter(pl.col("stage") == row["stage"])["ns"].to_list()
        out.append(
            Stage(
                stage=row["stage"],
                name=names[row["stage"]] if row["stage"] < len(names) else str(row["stage"]),
                lanes=row["lane"],
                busy_ns=row["busy_ns"],
                comm_ns=row["comm_ns"],
                idle_ns=row["idle_ns"],
                fill_ns=row["fill_ns"],
                drain_ns=row["drain_ns"],
                steady_idle_ns=row["steady_idle_ns"],
                utilization=row["busy_ns"] / row["window_ns"] if row["window_ns"] else 0.0,
                forward_ns=row["forward_ns"],
                backward_ns=row["backward_ns"],
                weight_ns=row["weight_ns"],
                microbatches=len(mb),
                microbatch_cv=pm.cv(mb) if len(mb) > 1 else None,
            )
        )
    return out


def _pipeline(table, work, stage_rows, wins, detected, facts, options, waits) -> Pipeline:
    schedule, chunks, m = detected
    p = len(stage_rows)
    window = int(wins.select((pl.col("window_end") - pl.col("window_start")).sum()).item())
    idle = sum(s.idle_ns for s in stage_rows)
    bubble = idle / (p * window) if window else 0.0
    busy = [s.busy_ns for s in stage_rows]
    steps = len(wins)
    times = _stage_times(work, p, m)
    theory = _theory(schedule, p, m, chunks, stage_rows)
    notes = _notes(facts, schedule, m, times, stage_rows)
    host_ns = sum(w.dur_ns for w in waits if w.cause in ("host", "sync"))
    excess, causes = _excess(bubble, theory, schedule, chunks, times, stage_rows, p * window, host_ns)
    return Pipeline(
        stages=p,
        microbatches=m,
        schedule=schedule,
        chunks=chunks,
        window_ns=window,
        window_start_ns=int(wins["window_start"].min()),
        bubble_fraction=bubble,
        theoretical_bubble_fraction=theory,
        excess_bubble_fraction=excess,
        excess_causes=causes,
        stage_time_cv=pm.cv(busy),
        imbalance=max(busy) / (sum(busy) / p) if sum(busy) else 0.0,
        throughput_bound=1e9 * steps / max(busy) if max(busy) else 0.0,
        pipeline_efficiency=(1 - bubble) / (1 - theory) if theory is not None and theory < 1 else None,
        microbatches_inferred=facts["inferred"] and m is not None,
        steps=_step_results(table, wins, p),
        step_time_ns=window // steps if steps else 0,
        **_cost(options.gpu_cost, p, bubble, idle, steps),
        recommendations=_recommendations(times, schedule, chunks),
        notes=notes,
    )


def _step_results(table: pl.DataFrame, wins: pl.DataFrame, p: int) -> list[StepResult]:
    idle = table.group_by("step").agg(pl.col("idle_ns").sum()).join(wins, on="step").sort("step")
    return [
        StepResult(
            r["step"], r["window_start"], r["window_end"], r["idle_ns"] / (p * (r["window_end"] - r["window_start"]))
        )
        for r in idle.iter_rows(named=True)
    ]


def _theory(schedule, p, m, chunks, stage_rows) -> float | None:
    """Closed form for the detected schedule (ZB-H1's depends on the measured F/B/W ratio)."""
    if schedule is None or m is None:
        return None
    total = [sum(getattr(s, f"{k}_ns") for s in stage_rows) for k in ("forward", "backward", "weight")]
    passes = tuple(Fraction(t) for t in total) if all(total[:2]) else (Fraction(1), Fraction(2), Fraction(0))
    try:
        return float(schedules.closed_form_bubble(schedule, p, m, chunks, passes))
    except (StageSpecError, ZeroDivisionError):
        return None


def _stage_times(work: pl.DataFrame, p: int, m: int | None) -> whatif.StageTimes | None:
    """Measured per-stage, per-micro-batch F/B/W ns (None when some pass is missing)."""
    if not m:
        return None
    per = pm.microbatch_times(work)
    grid = {(r["stage"], r["microbatch"], r["phase"]): r["ns"] for r in per.iter_rows(named=True)}
    mbs = sorted(per["microbatch"].unique().to_list())
    if len(mbs) != m:
        return None

    def rows(phase: str):
        return tuple(tuple(grid.get((s, j, phase)) for j in mbs) for s in range(p))

    forward, backward, weight = rows("forward"), rows("backward"), rows("weight")
    if any(v is None for r in forward + backward for v in r):
        return None
    has_w = all(v is not None for r in weight for v in r)
    return whatif.StageTimes(forward, backward, weight if has_w else None)


def _excess(
    bubble, theory, schedule, chunks, times, stage_rows, capacity, host_ns
) -> tuple[float | None, dict[str, float]]:
    """Measured bubble beyond theory, split in this order into imbalance (the schedule replayed with the
    measured per-stage times, no delays), exposed communication, host/launch and sync waits, and the rest;
    each share is capped by what is left, so the parts add up to the excess."""
    if theory is None:
        return None, {}
    excess = bubble - theory
    imbalance = 0.0
    if times is not None:
        try:
            sim = whatif.simulate(schedules.make_schedule(schedule, len(stage_rows), times.microbatches, chunks), times)
            imbalance = max(0.0, min(excess, sim.bubble_fraction - theory))
        except StageSpecError:
            pass
    left = max(0.0, excess - imbalance)
    comm = min(left, sum(s.comm_ns for s in stage_rows) / capacity) if capacity else 0.0
    host = min(left - comm, host_ns / capacity) if capacity else 0.0
    return excess, {"imbalance": imbalance, "communication": comm, "host": host, "other": max(0.0, left - comm - host)}


def _recommendations(times, schedule, chunks) -> list[whatif.Recommendation]:
    if times is None or schedule is None:
        return []
    try:
        return list(whatif.what_if(times, schedule, chunks))
    except StageSpecError:
        return []


def _cost(price: float | None, p: int, bubble: float, idle_ns: int, steps: int) -> dict:
    """Idle dollars: the GPUs' hourly price times the idle fraction; a useful GPU-hour costs price / utilization
    (8 GPUs at $3/h, 60 % utilised: $5 per useful GPU-hour)."""
    if price is None:
        return {}
    utilization = 1 - bubble
    return {
        "idle_cost_per_hour": price * p * bubble,
        "idle_cost_per_step": price * idle_ns / 3.6e12 / max(steps, 1),
        "effective_price_per_useful_gpu_hour": price / utilization if utilization else None,
    }


def _notes(facts: dict, schedule, m, times, stage_rows) -> list[str]:
    notes = []
    if facts["inferred"]:
        counts = sorted({s.microbatches for s in stage_rows})
        spread = "" if len(counts) < 2 else f"; stages disagree ({counts[0]}–{counts[-1]} passes), so m is approximate"
        notes.append(
            "no micro-batch labels: passes inferred from compute bursts between communication"
            + (spread if m else "; none found")
        )
    if facts["pattern"]:
        notes.append(f"micro-batch labels: {facts['pattern']}")
    if m and times is None:
        notes.append("some passes are missing on some stages: what-if replay skipped")
    return notes


#: A report's timeline is for looking at: communication closer than 1/4000 of the window merges, and past
#: this many segments neighbours merge per phase (dropping micro-batch numbers). Metrics never use it.
MAX_SEGMENTS = 20_000


def _timeline(work: pl.DataFrame) -> list[Segment]:
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
