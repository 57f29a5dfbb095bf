"""`pipebubble theory`: the closed-form bubble of each schedule and a simulated step, no trace needed."""

from __future__ import annotations

import json
import math
from enum import Enum
from fractions import Fraction
from typing import Annotated

import typer

from pipebubble.analysis.schedules import Schedule, closed_form_bubble, make_schedule
from pipebubble.analysis.whatif import Simulation, StageTimes, TimedAction, ideal_step_time_ns, simulate
from pipebubble.cli.output import write_text
from pipebubble.errors import StageSpecError

NS_PER_MS = 1_000_000
GRID_WIDTH = 150
ZB_FORMULA = "(p-1)(F+B-W)/(m(F+B+W)+(p-1)(F+B-W))"


class ScheduleName(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved_1f1b = "interleaved_1f1b"
    zero_bubble = "zero_bubble"


class Format(str, Enum):
    text = "text"
    json = "json"


def theory(
    stages: Annotated[int, typer.Option("--stages", "-p", min=1, help="Pipeline stages p.")],
    microbatches: Annotated[int, typer.Option("--microbatches", "-m", min=1, help="Micro-batches per step.")],
    schedule: Annotated[
        ScheduleName, typer.Option("--schedule", "-s", help="Schedule to simulate.")
    ] = ScheduleName.one_f_one_b,
    chunks: Annotated[
        int | None, typer.Option("--chunks", "-v", min=1, help="Model chunks per stage (interleaved: 2).")
    ] = None,
    stage_times: Annotated[
        str | None, typer.Option("--stage-times", help="Forward ms of one micro-batch per stage: 1,1,1.5,1.")
    ] = None,
    fwd_bwd_ratio: Annotated[
        float, typer.Option("--fwd-bwd-ratio", min=0.0, help="Backward time as a multiple of forward.")
    ] = 2.0,
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.text,
) -> None:
    """Closed-form bubble fractions and one simulated step of a pipeline schedule.

    Backward takes --fwd-bwd-ratio times forward; zero_bubble splits it into equal halves, B and W.

    Examples:

      pipebubble theory --stages 4 --microbatches 8

      pipebubble theory -p 4 -m 8 --schedule interleaved_1f1b --chunks 2

      pipebubble theory -p 4 -m 16 -s zero_bubble --stage-times 1,1,1.5,1 -f json
    """
    v = chunks or (2 if schedule is ScheduleName.interleaved_1f1b else 1)
    forward = _parse_stage_times(stage_times, stages)
    times = StageTimes.uniform(forward, microbatches, Fraction(fwd_bwd_ratio))
    sim = simulate(make_schedule(schedule.value, stages, microbatches, v), times)
    forms = _closed_forms(stages, microbatches, v, Fraction(fwd_bwd_ratio))
    if format is Format.json:
        write_text(json.dumps(_to_json(forms, sim, times), indent=2) + "\n", None)
    else:
        write_text("\n".join(_text(forms, sim, times)) + "\n", None)


def _parse_stage_times(text: str | None, stages: int) -> tuple[int, ...]:
    if text is None:
        return (NS_PER_MS,) * stages
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        values = []
    if len(values) != stages or min(values) <= 0:
        raise StageSpecError(f"--stage-times: expected {stages} positive numbers (one a stage), got {text!r}")
    return tuple(round(x * NS_PER_MS) for x in values)


def _closed_forms(p: int, m: int, v: int, ratio: Fraction) -> list[tuple[str, str, Fraction]]:
    """(name, formula, value); ZB-H1 takes T_B = T_W = ratio/2 · T_F, as the simulation does."""
    zb, v = (Fraction(1), ratio / 2, ratio / 2), max(v, 2)
    return [
        ("gpipe / 1f1b", "(p-1)/(m+p-1)", closed_form_bubble("1f1b", p, m)),
        (f"interleaved_1f1b v={v}", "(p-1)/(v*m+p-1)", closed_form_bubble("interleaved_1f1b", p, m, v)),
        ("zero_bubble (ZB-H1)", ZB_FORMULA, closed_form_bubble("zero_bubble", p, m, 1, zb)),
    ]


def _ms(ns: int) -> str:
    return f"{ns / NS_PER_MS:.3f} ms"


def _text(forms: list[tuple[str, str, Fraction]], sim: Simulation, times: StageTimes) -> list[str]:
    s = sim.schedule
    lines = [f"pipeline: p={s.stages} stages, m={s.microbatches} micro-batches"]
    lines.append("closed forms (equal stages):")
    lines += [f"  {name:<22} {formula:<40} = {v} = {_pct(float(v))}" for name, formula, v in forms]
    lines.append(
        f"simulated {s.name}" + (f" v={s.chunks}" if s.chunks > 1 else "")
        + f": step {_ms(sim.step_time_ns)} (busiest stage's work {_ms(ideal_step_time_ns(times))}),"
        f" bubble {_pct(sim.bubble_fraction)}"
    )
    idle = sim.idle_ns
    lines += [f"  stage {i}: busy {_ms(b)}, idle {_ms(idle[i])}" for i, b in enumerate(sim.busy_ns)]
    return [*lines, "", *_grid(sim)]


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f} %"


def _label(sim: Simulation, t: TimedAction, labelled: bool) -> str:
    a = t.action
    if not labelled:
        return a.phase.lower() if a.chunk % 2 else a.phase
    return f"{a.phase}{a.microbatch}" + (f".{a.chunk}" if sim.schedule.chunks > 1 else "")


def _grid(sim: Simulation) -> list[str]:
    """One row per stage, time left to right. Each pass shows its label when every label fits in
    GRID_WIDTH columns; otherwise a pass starts with its phase letter (lower case on odd chunks)."""
    step = sim.step_time_ns
    timed = [t for row in sim.actions for t in row]
    shortest = min(t.end_ns - t.start_ns for t in timed) or 1
    chars = max(len(_label(sim, t, True)) for t in timed) + 1
    labelled = step * chars <= GRID_WIDTH * shortest
    cols = math.ceil(step * chars / shortest) if labelled else GRID_WIDTH
    rows = [_legend(sim.schedule, labelled) + f"; one column = {_ms(step // cols)}"]
    for i, row in enumerate(sim.actions):
        cells = ["."] * cols
        for t in row:
            a, b = t.start_ns * cols // step, t.end_ns * cols // step
            text = _label(sim, t, labelled)
            cells[a:b] = (text + (" " if labelled else "-") * cols)[: b - a]
        rows.append(f"  s{i:<3}|{''.join(cells)}|")
    return rows


def _legend(s: Schedule, labelled: bool) -> str:
    legend = "F forward, B backward" + (" (input gradient), W weight gradient" if s.split_backward else "")
    if labelled:
        return legend + "; number = micro-batch" + (", .c = chunk" if s.chunks > 1 else "") + "; '.' idle"
    return legend + "; a pass is its letter then '-', lower case on odd chunks; '.' idle"


def _to_json(forms: list[tuple[str, str, Fraction]], sim: Simulation, times: StageTimes) -> dict[str, object]:
    s = sim.schedule
    actions = [
        {"stage": t.stage, "phase": t.action.phase, "microbatch": t.action.microbatch,
         "chunk": t.action.chunk, "start_ns": t.start_ns, "end_ns": t.end_ns}
        for row in sim.actions for t in row
    ]
    return {
        "stages": s.stages, "microbatches": s.microbatches, "schedule": s.name, "chunks": s.chunks,
        "closed_forms": [{"schedule": n, "formula": f, "bubble_fraction": float(v), "exact": str(v)}
                         for n, f, v in forms],
        "simulated": {"step_time_ns": sim.step_time_ns, "busiest_stage_work_ns": ideal_step_time_ns(times),
                      "bubble_fraction": sim.bubble_fraction, "busy_ns": list(sim.busy_ns),
                      "idle_ns": list(sim.idle_ns), "actions": actions},
    }


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(theory)
