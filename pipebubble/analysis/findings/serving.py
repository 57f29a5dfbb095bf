"""Serving: prefill/decode interference, the time decodes lose to the prompt work that shares their steps.

Worth, per step that carries prompt work (its step is that step, so the share is 1 − 1/slowdown):
- an engine that mixes prefill into decode steps: median mixed step − median pure-decode step, what every
  decode in a mixed step waits beyond a decode step for its token;
- an engine that never mixes (decodes stall behind whole-prompt steps): the median time-between-tokens
  interval that held prompt work − the median pure-decode interval, i.e. pure × (decode_slowdown_when_prefill
  − 1), the pure interval read from an episode (its duration / its slowdown, both against that median).
A fix that separates prefill from decode (chunking to a token budget, disaggregated serving) gives back at
most that per step.
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import finding, gpus, ms
from pipebubble.report import Interference, Report, StepClass
from pipebubble.report.findings import Finding, Where

ACTION = "cap the prompt tokens per step (chunked prefill to a token budget) or serve prefill apart (disaggregation)"


def findings(report: Report) -> list[Finding]:
    """The interference finding (none without an interference section or without prompt work among decodes)."""
    section = report.interference
    if section is None:
        return []
    classes = {c.name: c for c in section.classes}
    found = _mixed(section, classes, gpus(report)) or _stalled(section, classes, gpus(report))
    return [found] if found else []


def _p50(cls: StepClass | None) -> float | None:
    return None if cls is None or cls.steps == 0 or cls.durations_ns is None else cls.durations_ns.get("p50")


def _mixed(section: Interference, classes: dict[str, StepClass], frees: int) -> Finding | None:
    """Mixed steps against pure-decode steps (class medians)."""
    mixed, decode = _p50(classes.get("mixed")), _p50(classes.get("decode"))
    if mixed is None or decode is None or mixed <= decode:
        return None
    worth, step = round(mixed - decode), round(mixed)
    return finding(
        "interference", f"decodes in mixed steps wait {ms(worth)} more a step "
        f"({section.decode_slowdown_when_mixed:.1f}x a decode step)",
        Where(), "prompt work shares the decodes' steps",
        {"decode_slowdown_when_mixed": section.decode_slowdown_when_mixed, "mixed_steps": classes["mixed"].steps,
         "steps": section.steps, "mixed_p50_ns": mixed, "decode_p50_ns": decode},
        worth, frees, step, ACTION, "median mixed step − median pure-decode step, per mixed step",
    )


def _stalled(section: Interference, classes: dict[str, StepClass], frees: int) -> Finding | None:
    """Intervals between tokens that held whole-prompt steps against pure-decode intervals (the TBT episodes)."""
    slowdown, episodes = section.decode_slowdown_when_prefill, section.worst_episodes
    first = episodes[0] if episodes else None
    if not slowdown or slowdown <= 1 or first is None or not first.slowdown or first.dur_ns is None:
        return None
    pure = first.dur_ns / first.slowdown
    worth, step = round(pure * (slowdown - 1)), round(pure * slowdown)
    return finding(
        "interference", f"decodes stall {ms(worth)} behind prompt steps per token ({slowdown:.1f}x a decode interval)",
        Where(), "whole-prompt steps hold up the running decodes",
        {"decode_slowdown_when_prefill": slowdown, "pure_decode_interval_ns": round(pure),
         "generation_stalls": section.generation_stalls, "tbt_intervals": section.tbt_intervals,
         "prefill_steps": classes["prefill"].steps if "prefill" in classes else 0},
        worth, frees, step, ACTION,
        "median interval between tokens that held prompt work − median pure-decode interval, per such interval",
    )
