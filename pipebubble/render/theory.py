"""`pipebubble theory`'s output: the closed forms and one simulated step as text (with a character grid) or JSON.

The command computes a ``Theory``; these functions only lay it out and return strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipebubble.analysis.schedule.schedules import Schedule
    from pipebubble.analysis.schedule.whatif import Simulation, TimedAction

NS_PER_MS = 1_000_000
GRID_WIDTH = 150


@dataclass(frozen=True)
class Theory:
    """What the command computed: (name, formula, bubble) per closed form, the simulated step, and the busiest
    stage's work (the step time with no bubble)."""

    forms: list[tuple[str, str, Fraction]]
    sim: Simulation
    busiest_stage_work_ns: int


def text(theory: Theory) -> str:
    """The closed forms, the simulated step per stage, then the grid."""
    return "\n".join(lines(theory)) + "\n"


def to_json(theory: Theory) -> str:
    """``as_dict`` as two-space-indented JSON with a trailing newline."""
    return json.dumps(as_dict(theory), indent=2) + "\n"


def lines(theory: Theory) -> list[str]:
    """The text output, one string a line."""
    sim = theory.sim
    s = sim.schedule
    out = [f"pipeline: p={s.stages} stages, m={s.microbatches} micro-batches"]
    out.append("closed forms (equal stages):")
    out += [f"  {name:<22} {formula:<40} = {v} = {_pct(float(v))}" for name, formula, v in theory.forms]
    out.append(
        f"simulated {s.name}" + (f" v={s.chunks}" if s.chunks > 1 else "")
        + f": step {_ms(sim.step_time_ns)} (busiest stage's work {_ms(theory.busiest_stage_work_ns)}),"
        f" bubble {_pct(sim.bubble_fraction)}"
    )
    idle = sim.idle_ns
    out += [f"  stage {i}: busy {_ms(b)}, idle {_ms(idle[i])}" for i, b in enumerate(sim.busy_ns)]
    return [*out, "", *grid(sim)]


def _ms(ns: int) -> str:
    return f"{ns / NS_PER_MS:.3f} ms"


def _pct(fraction: float) -> str:
    return f"{fraction * 100:.1f} %"


def _label(sim: Simulation, t: TimedAction, labelled: bool) -> str:
    """``F3`` (``F3.1`` with chunks) when labelled, else the phase letter, lower case on odd chunks."""
    a = t.action
    if not labelled:
        return a.phase.lower() if a.chunk % 2 else a.phase
    return f"{a.phase}{a.microbatch}" + (f".{a.chunk}" if sim.schedule.chunks > 1 else "")


def grid(sim: Simulation) -> list[str]:
    """One row per stage, time left to right. Each pass shows its label when every label fits in
    GRID_WIDTH columns; otherwise a pass starts with its phase letter (lower case on odd chunks)."""
    step = sim.step_time_ns
    timed = [t for row in sim.actions for t in row]
    shortest = min(t.end_ns - t.start_ns for t in timed) or 1
    chars = max(len(_label(sim, t, True)) for t in timed) + 1
    labelled = step * chars <= GRID_WIDTH * shortest
    cols = math.ceil(step * chars / shortest) if labelled else GRID_WIDTH
    rows = [legend(sim.schedule, labelled) + f"; one column = {_ms(step // cols)}"]
    for i, row in enumerate(sim.actions):
        cells = ["."] * cols
        for t in row:
            a, b = t.start_ns * cols // step, t.end_ns * cols // step
            label = _label(sim, t, labelled)
            cells[a:b] = (label + (" " if labelled else "-") * cols)[: b - a]
        rows.append(f"  s{i:<3}|{''.join(cells)}|")
    return rows


def legend(s: Schedule, labelled: bool) -> str:
    """What the grid's characters mean."""
    text = "F forward, B backward" + (" (input gradient), W weight gradient" if s.split_backward else "")
    if labelled:
        return text + "; number = micro-batch" + (", .c = chunk" if s.chunks > 1 else "") + "; '.' idle"
    return text + "; a pass is its letter then '-', lower case on odd chunks; '.' idle"


def as_dict(theory: Theory) -> dict[str, object]:
    """The JSON output's body: the schedule, the closed forms (float and exact) and every simulated action."""
    sim = theory.sim
    s = sim.schedule
    actions = [
        {"stage": t.stage, "phase": t.action.phase, "microbatch": t.action.microbatch,
         "chunk": t.action.chunk, "start_ns": t.start_ns, "end_ns": t.end_ns}
        for row in sim.actions for t in row
    ]
    return {
        "stages": s.stages, "microbatches": s.microbatches, "schedule": s.name, "chunks": s.chunks,
        "closed_forms": [{"schedule": n, "formula": f, "bubble_fraction": float(v), "exact": str(v)}
                         for n, f, v in theory.forms],
        "simulated": {"step_time_ns": sim.step_time_ns, "busiest_stage_work_ns": theory.busiest_stage_work_ns,
                      "bubble_fraction": sim.bubble_fraction, "busy_ns": list(sim.busy_ns),
                      "idle_ns": list(sim.idle_ns), "actions": actions},
    }
