"""Calibrated replay: the measured pass times plus what they leave out, so that replaying the detected
schedule (``whatif.simulate``) meets the measured step.

In each step, pass a of stage s computes from S_a to E_a; E_prev is the end of the stage's pass before it
(the step's start for its first) and E_dep the end of the pass it depends on (``whatif._dependency``). The
simulator starts a's compute at max(E_prev, E_dep + hop) + setup, so the measured start is met exactly
when the delay is split so:

- the stage was waiting for a dependency on another stage (E_dep > E_prev): setup = min(S_a − E_dep, the
  stage's typical setup G), hop = the rest (the hand-off: send, wire, receive);
- it was not: hop = the stage's typical hop H (at most S_a − E_dep), setup = S_a − max(E_prev, E_dep + hop):
  the stage's own time (Python, posting receives, small operators) and what of the hand-off it did not hide.

A pass's idle gaps inside it count as setup too (its compute is the union of its spans, as
``pipeline.microbatch_times`` has it), and compute after a stage's last pass is its tail. Each step is then
replayed exactly by its own values, per virtual stage when stages hold several chunks (``chunked``). The
replay inputs are their means over steps, so what is left of the error comes from steps whose critical
passes differ, a pass order that is not the schedule's, or clocks that disagree: ``calibration`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from pipebubble.analysis.intervals import unions
from pipebubble.analysis.pipeline.metrics import PASSES, windows
from pipebubble.analysis.schedule import schedules, whatif
from pipebubble.errors import StageSpecError

TOLERANCE = 0.05  # a replay further than this from the measured step gets a note saying why
LETTER = {"forward": "F", "backward": "B", "weight": "W"}
KEYS = ["step", "stage", "phase", "microbatch", "c"]


@dataclass(frozen=True)
class Calibration:
    """The current schedule replayed against the step measured: ``error`` = (replayed − measured) / measured;
    ``note`` says by how much and why when |error| > ``TOLERANCE``."""

    replayed_step_ns: int
    measured_step_ns: int
    error: float
    note: str | None = None


def actions(work: pl.DataFrame, p: int, wins: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per pass and step: S, E, compute (union ns), the chunk index ``c`` and virtual stage ``k``,
    and the end of the pass it depends on (``dep_end``, null for the first virtual stage's forwards) and of
    the stage's previous pass (``prev_end``). ``wins``: the work's step windows (``windows``), when known."""
    passes = work.filter(
        (pl.col("role") == "compute") & pl.col("phase").is_in(PASSES) & pl.col("microbatch").is_not_null()
    ).with_columns(c=(pl.col("chunk").rank("dense").over("stage").fill_null(1) - 1).cast(pl.Int64))
    acts = unions(passes, KEYS).select(*KEYS, S="start", E="end", compute="ns")
    last = (pl.col("c").max() + 1) * p - 1
    k = pl.col("c") * p + pl.col("stage")
    acts = acts.with_columns(phase=pl.col("phase").replace_strict(LETTER), k=k).with_columns(
        dep_phase=pl.when(pl.col("phase") == "F").then(pl.lit("F"))
        .when((pl.col("phase") == "B") & (pl.col("k") == last)).then(pl.lit("F"))
        .otherwise(pl.lit("B")),
        dep_k=pl.when(pl.col("phase") == "F").then(pl.col("k") - 1)
        .when((pl.col("phase") == "B") & (pl.col("k") < last)).then(pl.col("k") + 1)
        .otherwise(pl.col("k")),
    )
    ends = acts.select("step", "microbatch", dep_phase="phase", dep_k="k", dep_end="E")
    acts = acts.join(ends, on=["step", "microbatch", "dep_phase", "dep_k"], how="left")
    start = (windows(work) if wins is None else wins).select("step", "window_start")
    return (
        acts.join(start, on="step")
        .sort("step", "stage", "S")
        .with_columns(prev_end=pl.col("E").shift(1).over("step", "stage").fill_null(pl.col("window_start")))
        .with_columns(crosses=pl.col("dep_k").is_not_null() & (pl.col("dep_k") % p != pl.col("stage")))
    )


def _split_delays(acts: pl.DataFrame) -> pl.DataFrame:
    """Each pass's delay split into setup and hop (the module's rule), exact per step. Typical values are
    medians per stage and kind of pass, else 0: the hop H over the passes that waited for their dependency
    (else over that kind of pass on every stage), the setup G over those whose hand-off the stage's own work
    surely hid (else over every pass of the stage)."""
    after_dep = pl.col("S") - pl.col("dep_end")
    waited = pl.col("crosses") & (pl.col("dep_end") > pl.col("prev_end"))
    rough = _typical(after_dep.filter(waited), "phase")
    hidden = ~pl.col("crosses") | (pl.col("dep_end") + rough <= pl.col("prev_end"))
    own = (pl.col("S") - pl.col("prev_end")).filter(hidden)
    acts = acts.with_columns(waited=waited, G=_typical(own, "stage"))
    waited_hop = after_dep - pl.min_horizontal(after_dep, pl.col("G"))
    acts = acts.with_columns(H=_typical(waited_hop.filter(pl.col("waited")), "phase"))
    hop = (
        pl.when(~pl.col("crosses")).then(None)
        .when(pl.col("waited")).then(waited_hop)
        .otherwise(pl.min_horizontal(after_dep, pl.col("H")))
        .clip(0)
    )
    ready = pl.max_horizontal("prev_end", pl.col("dep_end") + pl.col("hop").fill_null(0))
    gaps = pl.col("E") - pl.col("S") - pl.col("compute")  # idle inside the pass
    return acts.with_columns(hop=hop).with_columns(setup=(pl.col("S") - ready).clip(0) + gaps)


def _typical(values: pl.Expr, fallback: str) -> pl.Expr:
    median = values.clip(0).median()
    return median.over("stage", "phase").fill_null(median.over(fallback)).fill_null(0).round().cast(pl.Int64)


def _tails(work: pl.DataFrame, acts: pl.DataFrame) -> pl.DataFrame:
    """Per stage: the mean over steps of its compute after its last pass (its union; what it waited for
    before it is left out, so a tail never stretches the step it was measured in)."""
    last = acts.group_by("step", "stage").agg(last=pl.col("E").max())
    after = (
        work.filter(pl.col("role") == "compute")
        .join(last, on=["step", "stage"])
        .filter(pl.col("end") > pl.col("last"))
        .with_columns(start=pl.max_horizontal("start", "last"))
    )
    per_step = unions(after, ["step", "stage"]).select("step", "stage", tail="ns")
    return per_step.group_by("stage").agg(pl.col("tail").sum() // last["step"].n_unique())


def replay_times(
    work: pl.DataFrame, p: int, m: int | None, wins: pl.DataFrame | None = None
) -> whatif.StageTimes | None:
    """The replay inputs from the labelled work of complete, clipped steps: pass compute as
    ``pipeline.microbatch_times`` measures it, with the hops, set-up and tails that make each step's replay
    exact (per virtual stage too, in ``chunked``, when stages hold several chunks); None when m is unknown
    or some stage lacks a forward or backward of some micro-batch. ``wins``: the steps' windows, when known."""
    if not m or work.is_empty():
        return None
    acts = _split_delays(actions(work, p, wins))
    mbs = sorted(acts["microbatch"].unique().to_list())
    if len(mbs) != m:
        return None
    times = _times(acts, "stage", p, mbs)
    if times is None:
        return None
    v = int(acts["c"].max()) + 1
    tails = dict(_tails(work, acts).iter_rows())
    tail = tuple(tails.get(s, 0) for s in range(p))
    return replace(times, tail_ns=tail, chunked=_times(acts, "k", p * v, mbs) if v > 1 else None)


def _times(acts: pl.DataFrame, row: str, rows: int, mbs: list[int]) -> whatif.StageTimes | None:
    """Grids over ``row`` (stage or virtual stage): per step, compute and setup summed over what shares a
    cell, then averaged over steps; hops averaged over every hand-off into the cell."""
    cell = [row, "phase", "microbatch"]
    per_step = acts.group_by("step", *cell).agg(pl.col("compute", "setup").sum())
    per = per_step.group_by(cell).agg(pl.col("compute", "setup").mean().round().cast(pl.Int64)).join(
        acts.group_by(cell).agg(pl.col("hop").mean().round().cast(pl.Int64)), on=cell
    )
    # Every (phase, row, micro-batch) cell in grid order, null where nothing was measured: one join, then
    # each grid is a slice of a column cut into rows.
    every = (
        pl.DataFrame({"phase": list("FBW"), "_p": [0, 1, 2]})
        .join(pl.DataFrame({row: range(rows)}, schema={row: per.schema[row]}), how="cross")
        .join(pl.DataFrame({"microbatch": mbs}, schema={"microbatch": per.schema["microbatch"]}), how="cross")
    )
    cells = every.join(per, on=cell, how="left").sort("_p", row, "microbatch")
    size, m = rows * len(mbs), len(mbs)

    def grid(phase: str, column: str, fill: int | None = None) -> whatif.Grid:
        values = cells[column].slice("FBW".index(phase) * size, size).to_list()
        if fill is not None:
            values = [fill if v is None else v for v in values]
        return tuple(tuple(values[r * m:(r + 1) * m]) for r in range(rows))

    forward, backward, weight = (grid(ph, "compute") for ph in "FBW")
    if any(v is None for r in forward + backward for v in r):
        return None
    has_w = all(v is not None for r in weight for v in r)
    hops = (_fill(grid("F", "hop")), _fill(grid("B", "hop")))
    setup = (grid("F", "setup", 0), grid("B", "setup", 0), grid("W", "setup", 0) if has_w else None)
    return whatif.StageTimes(forward, backward, weight if has_w else None, 0, hops, setup)


def _fill(grid: whatif.Grid) -> whatif.Grid:
    """Hand-offs never measured (into stage 0's forward, the last stage's backward, which an interleaved
    what-if needs) take the mean of those measured."""
    seen = [v for row in grid for v in row if v is not None]
    mean = round(sum(seen) / len(seen)) if seen else 0
    return tuple(tuple(mean if v is None else v for v in row) for row in grid)


def calibration(
    times: whatif.StageTimes, schedule: str, chunks: int, measured_step_ns: int, work: pl.DataFrame | None = None
) -> Calibration:
    """``times`` replayed under the detected schedule against the measured mean step; given the ``work``
    the times came from, a note beyond ``TOLERANCE`` names the causes it finds there."""
    plan = schedules.make_schedule(schedule, times.stages, times.microbatches, chunks)
    replayed = whatif.simulate(plan, times).step_time_ns
    error = whatif.replay_error(replayed, measured_step_ns)
    if abs(error) <= TOLERANCE:
        return Calibration(replayed, measured_step_ns, error)
    found = reasons(work, plan) if work is not None else []
    why = "; ".join(found) or "the passes' hand-offs and set-up vary more than their means show"
    return Calibration(replayed, measured_step_ns, error, whatif.off_note(replayed, measured_step_ns, why))


def reasons(work: pl.DataFrame, plan: schedules.Schedule) -> list[str]:
    """What in the measured work a replay of mean times under ``plan`` cannot follow."""
    acts = actions(work, plan.stages)
    out = []
    bad = _out_of_order(acts, plan)
    if bad:
        out.append(f"stage{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} ran passes in another order "
                   f"than {plan.name}'s")
    early = acts.filter(pl.col("crosses") & (pl.col("dep_end") > pl.col("S"))).height
    if early:
        out.append(f"{early} passes start before the pass they depend on ends (the ranks' clocks disagree)")
    alone = [_step_error(one, plan) for _, one in work.group_by("step")]
    if len(alone) > 1 and all(e is not None and abs(e) <= 0.01 for e in alone):
        out.append(f"each of the {len(alone)} steps replayed alone meets its own time within 1 %, but the passes "
                   "that hold a step up change from step to step, which one replay of their mean times cannot follow")
    return out


def _step_error(work: pl.DataFrame, plan: schedules.Schedule) -> float | None:
    """The replay error of one step on its own times (None when it cannot be replayed)."""
    times = replay_times(work, plan.stages, plan.microbatches)
    if times is None:
        return None
    window = windows(work).select(pl.col("window_end") - pl.col("window_start")).item()
    return whatif.replay_error(whatif.simulate(plan, times).step_time_ns, window)


def _out_of_order(acts: pl.DataFrame, plan: schedules.Schedule) -> list[int]:
    """Stages whose measured pass order, in some step, is not the schedule's."""
    index = {j: i for i, j in enumerate(sorted(acts["microbatch"].unique().to_list()))}
    bad = set()
    for (_, stage), rows in acts.sort("S").group_by("step", "stage", maintain_order=True):
        order = tuple(schedules.Action(ph, index[j], c) for ph, j, c in rows.select("phase", "microbatch", "c").rows())
        if stage < plan.stages and order != plan.orders[stage]:
            bad.add(stage)
    return sorted(bad)


def calibration_or_none(
    times: whatif.StageTimes | None,
    schedule: str | None,
    chunks: int,
    measured_step_ns: int,
    work: pl.DataFrame | None = None,
) -> Calibration | None:
    """``calibration``, or None when there is nothing to replay (no times, no schedule, no step measured,
    times the schedule cannot run)."""
    if times is None or schedule is None or not measured_step_ns:
        return None
    try:
        return calibration(times, schedule, chunks, measured_step_ns, work)
    except StageSpecError:
        return None
