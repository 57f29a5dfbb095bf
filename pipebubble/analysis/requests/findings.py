"""Findings of the requests section: a latency tail driven by queueing, or by prefill/decode interference.

Each worth is the tail latency a fix gives back, measured on the requests themselves (never a sum of idle):
- ``queueing``: p99 TTFT − p99 (TTFT − queue), the p99 TTFT had no request waited in the queue; found when
  waiting is most of the tail's TTFT (mean queue >= half the mean TTFT of the requests at or above the TTFT
  p90). Its cause: queued behind long prefills when the queue's tail waited behind at least ``BEHIND`` x the
  prompt tokens the other requests did (engine steps known), else more arrivals than the engine serves; with
  the engine's traced steps (step tracing), the queue depth the tail waited behind is in the evidence.
- ``tail_interference``: p99 TPOT − p99 TPOT with every prompt step in a decode run as fast as a median decode
  step (``tail``); found when the decodes that shared steps with prompt work have the higher p99 TPOT.
A finding's step is the p99 its worth is part of (TTFT or TPOT); ``worth_gpu_ns`` is 0, since a shorter
latency tail frees no GPU time.
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import finding, ms
from pipebubble.report.findings import Finding, Where
from pipebubble.report.requests import Requests

#: Kinds these findings have (to be listed in ``report.findings.KINDS``).
KINDS = ("queueing", "tail_interference")
BEHIND = 2.0


def findings(section: Requests | None) -> list[Finding]:
    """The requests' findings (none without the section or when neither tail is driven so)."""
    if section is None:
        return []
    return [f for f in (_queueing(section), _interference(section)) if f is not None]


def _queueing(section: Requests) -> Finding | None:
    p99 = (section.ttft_ns or {}).get("p99")
    rest = section.ttft_p99_without_queue_ns
    tail = (section.ttft_split_ns or {}).get("tail") or {}
    parts = [tail.get(k) for k in ("queue", "prefill", "other")]
    if p99 is None or rest is None or None in parts or p99 <= rest or 2 * parts[0] < sum(parts):
        return None
    worth = round(p99 - rest)
    ahead = section.steps.prefill_tokens_ahead if section.steps else None
    behind = bool(ahead and ahead.get("tail") is not None and ahead["tail"] >= BEHIND * (ahead.get("rest") or 0) > 0)
    cause = ("the slowest first tokens queued behind long prefills" if behind
             else "requests arrive faster than the engine serves them")
    action = ("chunk long prompts (a per-step token budget) or serve them apart" if behind
              else "add engine replicas, raise the batch limits, or admit fewer requests")
    return finding(
        "queueing", f"p99 TTFT {ms(p99)}, {ms(worth)} of it waiting in the queue", Where(), cause,
        {"ttft_p99_ns": p99, "ttft_p99_without_queue_ns": rest, "tail_queue_ns": parts[0],
         "tail_ttft_ns": sum(parts), "prefill_tokens_ahead": ahead, "requests": section.count,
         "tail_queue_depth": ((section.step_trace.ttft_steps or {}).get("tail") or {}).get("waiting")
         if section.step_trace else None},
        worth, 0, round(p99), action, "p99 TTFT − p99 (TTFT − queue) over the requests")


def _interference(section: Requests) -> Finding | None:
    steps = section.steps
    p99 = (section.tpot_ns or {}).get("p99")
    if steps is None or p99 is None or steps.tpot_p99_without_interference_ns is None:
        return None
    shared, apart = (steps.shared.tpot_ns or {}).get("p99"), (steps.apart.tpot_ns or {}).get("p99")
    rest = steps.tpot_p99_without_interference_ns
    if shared is None or p99 <= rest or (apart is not None and shared <= apart):
        return None
    worth = round(p99 - rest)
    return finding(
        "tail_interference", f"p99 TPOT {ms(p99)}, {ms(worth)} of it prompt work in the decodes' steps", Where(),
        "prefill and mixed steps slow the running decodes",
        {"tpot_p99_ns": p99, "tpot_p99_without_interference_ns": rest, "shared_tpot_p99_ns": shared,
         "apart_tpot_p99_ns": apart, "shared_requests": steps.shared.count, "apart_requests": steps.apart.count},
        worth, 0, round(p99), "cap the prompt tokens per step (chunked prefill to a token budget) or serve prefill "
        "apart (disaggregation)", "p99 TPOT − p99 TPOT with each prompt step in a decode timed as a median decode step")
