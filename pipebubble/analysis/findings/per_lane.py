"""What the findings of copies, streams, kernels and start-up share: a GPU's whole-window facts
(``Host.facts``) brought to a step, the busiest GPU of each step and of the job.

A whole-window fact cannot follow each step's busiest GPU (it is not kept per step), so the findings that
rest on one take the job's busiest GPU (the most time in work over all steps, ``busiest_lane``) and its
every step: per step exact where the facts lie inside the steps.

A fact kept over a GPU's whole window (its first to last busy instant: a count, a time) is brought to a step
at the rate it ran: its total x the step's window / the time it ran over (``on_step``), the GPU's whole
window or, where longer, the sum of its steps' windows (steps reach past the GPU's first and last work, and a
fact inside the steps is then shared among them whole). A trace without steps is one step, its window the
whole one, so the fact is its total.
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import mean, step_rows
from pipebubble.report import Breakdown, Report
from pipebubble.report.breakdown import StreamStat


def busiest(groups: list[list[Breakdown]]) -> list[Breakdown]:
    """Each step's busiest GPU (the most time in work, window minus idle): the GPU that sets the step."""
    return [max(rows, key=lambda b: b.window_ns - b.idle_ns) for rows in groups]


def busiest_lane(groups: list[list[Breakdown]]) -> list[Breakdown]:
    """The step rows of the job's busiest GPU: the most time in work (window minus idle) over all steps."""
    work: dict[str, int] = {}
    for b in (b for rows in groups for b in rows):
        work[b.lane] = work.get(b.lane, 0) + b.window_ns - b.idle_ns
    lane = max(sorted(work), key=work.get)
    return [b for rows in groups for b in rows if b.lane == lane]


def whole_windows(report: Report) -> dict[str, int]:
    """Each GPU lane's time its facts ran over: its whole window (its ``step`` null breakdown row) or, where
    longer, the sum of its steps' windows (the steps ``step_rows`` keeps: those in which a GPU worked)."""
    stepped: dict[str, int] = {}
    for b in (b for rows in step_rows(report) for b in rows):
        if b.step is not None:
            stepped[b.lane] = stepped.get(b.lane, 0) + b.window_ns
    return {b.lane: max(b.window_ns, stepped.get(b.lane, 0)) for b in report.breakdown if b.step is None}


def on_step(total: int, row: Breakdown, whole: dict[str, int], steps: int) -> int:
    """``total`` (a fact over ``row``'s GPU's whole window) brought to ``row``'s step at the rate it ran; the
    total over ``steps`` where the GPU's whole window is not known."""
    window = whole.get(row.lane)
    if not window:
        return round(total / max(steps, 1))
    return round(total * min(row.window_ns, window) / window)


def per_step(totals: dict[str, int], groups: list[list[Breakdown]], whole: dict[str, int]) -> int:
    """The mean over steps of ``totals`` (per GPU lane, whole window) on each step's busiest GPU."""
    return mean([on_step(totals.get(b.lane, 0), b, whole, len(groups)) for b in busiest(groups)])


def by_lane(streams: list[StreamStat], keep) -> dict[str, int]:
    """Per lane, the time of the ``streams`` rows ``keep`` accepts."""
    out: dict[str, int] = {}
    for s in streams:
        if keep(s):
            out[s.lane] = out.get(s.lane, 0) + s.total_ns
    return out


def lanes_of(groups: list[list[Breakdown]]) -> list[str]:
    """The busiest GPUs' lanes, in step order, once each."""
    return list(dict.fromkeys(b.lane for b in busiest(groups)))
