"""The pipeline summary of the report: bubble against theory, the excess by cause, balance, cost and the
what-if recommendations, from the reduced stage table (``report``)."""

from __future__ import annotations

from fractions import Fraction

import polars as pl

from pipebubble.analysis.pipeline import metrics as pm
from pipebubble.analysis.schedule import calibrate, schedules, whatif
from pipebubble.errors import StageSpecError
from pipebubble.report import Pipeline, Recommendation, StepResult


def summary(table, work, stage_rows, wins, detected, facts, options, waits, lane_flops=None) -> Pipeline:
    """The pipeline's header numbers (ARCHITECTURE.md definitions) over the step windows ``wins``: bubble
    against the detected schedule's theory, its excess split by cause, balance, bounds, cost and what-ifs."""
    schedule, chunks, m = detected
    p = len(stage_rows)
    window = int(wins.select((pl.col("window_end") - pl.col("window_start")).sum()).item())
    idle = sum(s.idle_ns for s in stage_rows)
    bubble = idle / (p * window) if window else 0.0
    busy = [s.busy_ns for s in stage_rows]
    with_comm = [s.busy_ns + s.comm_ns for s in stage_rows]
    steps = len(wins)
    step_ns = window // steps if steps else 0
    times = calibrate.replay_times(work, p, m, wins)
    cal = calibrate.calibration_or_none(times, schedule, chunks, step_ns, work)
    theory = _theory(schedule, p, m, chunks, stage_rows)
    notes = _notes(facts, schedule, m, times, stage_rows) + ([cal.note] if cal and cal.note else [])
    host_ns = sum(w.dur_ns for w in waits if w.cause in ("host", "sync"))
    plain = times.passes_only() if times else None  # imbalance is the replay without delays
    excess, causes = _excess(bubble, theory, schedule, chunks, plain, stage_rows, p * window, host_ns)
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
        throughput_bound_with_comm=1e9 * steps / max(with_comm) if max(with_comm) else 0.0,
        pipeline_efficiency=(1 - bubble) / (1 - theory) if theory is not None and theory < 1 else None,
        microbatches_inferred=facts["inferred"] and m is not None,
        steps=_step_results(table, wins, p),
        step_time_ns=step_ns,
        idle_gpu_ns_per_step=idle // steps if steps else 0,
        **_cost(options.gpu_cost, p, bubble, idle, steps),
        recommendations=_recommendations(times, schedule, chunks, step_ns, cal,
                                         round(sum(busy) / steps) if steps else None,
                                         _stage_flops(stage_rows, lane_flops)),
        replayed_step_ns=cal.replayed_step_ns if cal else None,
        replay_error=cal.error if cal else None,
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


def _stage_flops(stage_rows, lane_flops: dict[str, int] | None) -> list[int] | None:
    """Each stage's model FLOPs (its lanes'), in stage order; None unless every stage has some."""
    if not lane_flops:
        return None
    flops = [sum(lane_flops.get(lane, 0) for lane in s.lanes) for s in sorted(stage_rows, key=lambda s: s.stage)]
    return flops if all(flops) else None


def _recommendations(times, schedule, chunks, step_ns, cal, compute_ns, flops=None) -> list[Recommendation]:
    """What-ifs replayed with the calibrated times; speed-ups against the measured step, bubbles as the measured
    one is defined, over the measured step's compute (``compute_ns``, summed over the stages)."""
    if times is None or schedule is None:
        return []
    try:
        note = (cal.note or "") if cal else ""
        return list(whatif.what_if(times, schedule, chunks, measured_step_ns=step_ns or None, current_note=note,
                                   compute_ns=compute_ns, flops=flops))
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
    counts = sorted({s.microbatches for s in stage_rows})
    if facts["inferred"]:
        notes.append(
            "no micro-batch labels: passes inferred from compute bursts between communication"
            + ("" if m else "; none found")
        )
    if m and len(counts) > 1:
        notes.append(
            f"stages ran {counts[0]}–{counts[-1]} micro-batches in their first step; m = {m}, the most common"
            + (" (inferred passes: m is approximate)" if facts["inferred"] else "")
        )
    if m and times is None:
        notes.append("some passes are missing on some stages: what-if replay skipped")
    return notes
