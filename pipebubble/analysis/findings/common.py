"""What every group of findings shares: the job's step (its length and how many were measured), the GPUs a
shorter step frees, and one way to build a ``Finding`` (worth per GPU, share of the step).

A finding's step is the time its worth is part of: a pipeline's measured step (``Pipeline.step_time_ns``),
else the mean over profiler steps of the longest GPU window in that step (``Breakdown`` step rows; a trace
without steps is one step: each GPU's first-to-last window). Every finding's evidence holds that step as
``step_ns``, so its share and cost can be checked against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipebubble.report import Breakdown, Report
from pipebubble.report.findings import Finding, Where


@dataclass(frozen=True)
class Step:
    """The step a finding's worth is part of: ``ns`` long (a mean over ``count`` measured steps); ``per`` is
    ``"step"``, or ``"window"`` for a trace without step markers (its GPUs' windows stand for the step, and a
    report must not say "per step" of them)."""

    ns: int
    count: int
    per: str = "step"

    @property
    def per_words(self) -> str:
        """How a title says "each time": ``a step``, or ``over the window``."""
        return "a step" if self.per == "step" else "over the window"

    def how(self, what: str) -> str:
        """A worth's ``how``: ``what`` per step and the mean over steps, or over the window."""
        return f"per step, {what}; mean over steps" if self.per == "step" else f"over each GPU's window, {what}"


def step_rows(report: Report) -> list[list[Breakdown]]:
    """The breakdown rows grouped by profiler step (each group: every GPU's row of one step), in step
    order, the steps in which no GPU worked left out; a report without step rows gives one group of the
    whole-window rows."""
    stepped = [b for b in report.breakdown if b.step is not None]
    rows = stepped or [b for b in report.breakdown if b.step is None]
    groups: dict[int | None, list[Breakdown]] = {}
    for row in rows:
        groups.setdefault(row.step, []).append(row)
    # A step in which no GPU worked (the profile's cut-off last step, a range after the work) is no step of it.
    worked = {k: g for k, g in groups.items() if any(b.window_ns > b.idle_ns for b in g)} or groups
    return [worked[k] for k in sorted(worked, key=lambda k: -1 if k is None else k)]


def job_step(report: Report) -> Step | None:
    """The job's step: the pipeline's measured one, else the mean longest GPU window per profiler step; None
    when neither is known."""
    if report.pipeline is not None and report.pipeline.step_time_ns > 0:
        return Step(report.pipeline.step_time_ns, max(len(report.pipeline.steps), 1))
    return gpu_step(step_rows(report))


def gpu_step(groups: list[list[Breakdown]]) -> Step | None:
    """The step of breakdown rows grouped by step (``step_rows``): the mean of each step's longest GPU
    window; None without rows."""
    if not groups:
        return None
    per = "window" if all(b.step is None for rows in groups for b in rows) else "step"
    return Step(mean([max(b.window_ns for b in rows) for rows in groups]), len(groups), per)


def gpus(report: Report) -> int:
    """The GPUs a shorter step frees: the pipeline's stages (one replica), else every GPU with a breakdown
    or collective participant, and at least one (a CPU-only trace still runs on one device)."""
    if report.pipeline is not None:
        return report.pipeline.stages
    lanes = {b.lane for b in report.breakdown}
    participants = len(report.collectives.ranks) if report.collectives is not None else 0
    return max(len(lanes), participants, 1)


def mean(values: list[int]) -> int:
    """The mean of integer ns, rounded to the nearest ns (0 for none)."""
    return round(sum(values) / len(values)) if values else 0


def ms(ns: float) -> str:
    """ns as a title writes it: milliseconds, one decimal."""
    return f"{ns / 1e6:.1f} ms"


def finding(
    kind: str, title: str, where: Where, cause: str, evidence: dict, worth_ns: int, frees: int, step_ns: int | Step,
    action: str, how: str,
) -> Finding:
    """A finding worth ``worth_ns`` of a ``step_ns`` step on ``frees`` GPUs: ``worth_gpu_ns`` = worth x GPUs,
    ``worth_share`` = worth / step; ``step_ns`` joins the evidence (the cost per hour is priced from it), and,
    given a ``Step`` measured over windows rather than steps, ``per: "window"``."""
    if isinstance(step_ns, Step):
        evidence = {**evidence, "per": "window"} if step_ns.per == "window" else evidence
        step_ns = step_ns.ns
    return Finding(
        kind=kind, title=title, where=where, cause=cause, evidence={**evidence, "step_ns": step_ns},
        worth_ns=worth_ns, worth_gpu_ns=worth_ns * frees, action=action, how=how,
        worth_share=worth_ns / step_ns if step_ns else None,
    )
