"""Findings of served requests from the engine's own account (journey and step tracing): preemption under KV
pressure, and prefill-heavy steps in the TTFT tail.

Each worth is the tail latency a fix gives back, measured on the requests (never a sum of idle); its step is
the p99 it is part of, and ``worth_gpu_ns`` is 0 (a shorter tail frees no GPU time):
- ``preemption``: p99 e2e − p99 (e2e − requeue) over the requests whose preemptions are known: the e2e tail
  had no preempted request waited to run again (``analysis/requests/preemption``; its recompute is not
  counted, so this is the least a fix gives back). Its cause names the KV-cache use at the preemptions where
  step tracing gives it (``KV_FULL`` and more: the cache was full).
- ``prefill_heavy_tail``: p99 TTFT − p99 (TTFT − the excess of the prefill-heavy steps each request waited
  through over a median other step) (``analysis/requests/step_trace``); found when the TTFT tail waited
  through a larger share of prefill-heavy steps than the rest.
"""

from __future__ import annotations

from pipebubble.analysis.findings.common import finding, ms
from pipebubble.report import Report
from pipebubble.report.findings import Finding, Where
from pipebubble.report.requests import Preemptions, StepTrace

#: Kinds these findings have (listed in ``report.findings.KINDS``).
KINDS = ("preemption", "prefill_heavy_tail")
KV_FULL = 0.9


def findings(report: Report) -> list[Finding]:
    """The preemption and prefill-heavy findings of the report's requests (none without them)."""
    section = report.requests
    if section is None:
        return []
    found = (_preemption(section.preemptions), _prefill_heavy(section.step_trace, (section.ttft_ns or {}).get("p99")))
    return [f for f in found if f is not None]


def _preemption(pre: Preemptions | None) -> Finding | None:
    if pre is None or not pre.count or pre.e2e_p99_ns is None or pre.e2e_p99_without_requeue_ns is None:
        return None
    worth = round(pre.e2e_p99_ns - pre.e2e_p99_without_requeue_ns)
    if worth <= 0:
        return None
    kv = (pre.kv_usage or {}).get("p50")
    cause = (f"the KV cache was full (median use {kv:.0%} at the preemptions): running requests evicted and "
             "queued again" if kv is not None and kv >= KV_FULL else
             "running requests evicted to make room in the KV cache and queued again")
    return finding(
        "preemption", f"{pre.count:,} preemptions of {pre.requests:,} requests, {ms(worth)} of the p99 e2e "
        "waiting to run again", Where(), cause,
        {"preempted_requests": pre.requests, "preemptions": pre.count, "requests": pre.known,
         "requeue_ns": pre.requeue_ns, "lost_tokens": pre.lost_tokens, "kv_usage_at_preemption": pre.kv_usage,
         "e2e_p99_ns": pre.e2e_p99_ns, "e2e_p99_without_requeue_ns": pre.e2e_p99_without_requeue_ns},
        worth, 0, round(pre.e2e_p99_ns), "give the KV cache more memory (a higher --gpu-memory-utilization, a "
        "smaller model or KV dtype), or admit fewer requests at once (--max-num-seqs, --max-num-batched-tokens)",
        "p99 e2e − p99 (e2e − time waiting to run again after a preemption) over the requests")


def _prefill_heavy(trace: StepTrace | None, p99: float | None) -> Finding | None:
    groups = (trace.ttft_steps or {}) if trace is not None else {}
    tail, rest = groups.get("tail") or {}, groups.get("rest") or {}
    without = trace.ttft_p99_without_prefill_heavy_ns if trace is not None else None
    share, other = tail.get("prefill_heavy_share"), rest.get("prefill_heavy_share")
    if p99 is None or without is None or share is None or (other is not None and share <= other):
        return None
    worth = round(p99 - without)
    if worth <= 0:
        return None
    return finding(
        "prefill_heavy_tail", f"p99 TTFT {ms(p99)}, {ms(worth)} of it prefill-heavy steps the slowest first "
        "tokens waited through", Where(), "long prompts' steps held up the requests waiting for a first token",
        {"ttft_p99_ns": p99, "ttft_p99_without_prefill_heavy_ns": without, "tail_prefill_heavy_share": share,
         "rest_prefill_heavy_share": other, "tail_waiting": tail.get("waiting"), "tail_kv_peak": tail.get("kv_peak"),
         "steps": trace.steps, "coverage": trace.coverage},
        worth, 0, round(p99), "chunk long prompts to a per-step token budget (chunked prefill) or serve prefill "
        "apart (disaggregation)",
        "p99 TTFT − p99 TTFT with each prefill-heavy step waited through timed as a median other step")
