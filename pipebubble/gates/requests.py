"""CI gates over the report's ``requests`` section (a dict, so a saved report works as well as a fresh one).

Shaped for the room's machinery: ``GATES`` (flag key -> (metric, label); each a ``max`` gate
in ``ms``, so ``500ms``, ``0.5s`` and a bare number of ms parse as the other time gates do), ``COUNT_GATES``
(likewise, each a ``max`` gate of a count: ``--max-preemptions``), ``METRICS`` (metric
-> a function of the report giving (value in ms, or None, and a note saying why)) and ``percentile_pairs``, what
``diff`` compares: each percentile of each latency in both reports (higher is worse). No pipebubble import, so
``specs``, ``check`` and ``diff`` can each import this module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: Gate key (the flag without its dashes, the [check] table's key) -> (metric, label).
GATES: dict[str, tuple[str, str]] = {
    "max_ttft_p99": ("ttft_p99", "TTFT p99"),
    "max_tpot_p99": ("tpot_p99", "TPOT p99"),
    "max_queue_p99": ("queue_p99", "queue p99"),
}
#: Gate key -> (metric, label) of the count gates.
COUNT_GATES: dict[str, tuple[str, str]] = {
    "max_preemptions": ("preemptions", "preemptions"),
}
#: Latencies compared by ``diff``: (key in the section, label).
LATENCIES = (("ttft_ns", "TTFT"), ("queue_ns", "queue"), ("tpot_ns", "TPOT"), ("e2e_ns", "e2e"))
PERCENTILES = ("p50", "p90", "p99")


def _p99(key: str, label: str) -> Callable[[dict[str, Any]], tuple[float | None, str]]:
    """The metric: the section's p99 of ``key`` in ms, or None with why."""

    def metric(report: dict[str, Any]) -> tuple[float | None, str]:
        section = report.get("requests")
        if not section:
            return None, "no served requests in the inputs (OTLP or Jaeger request spans)"
        value = (section.get(key) or {}).get("p99")
        if value is None:
            return None, f"no request states its {label}"
        return float(value) / 1e6, f"over {section.get('count')} requests"

    return metric


def _preemptions(report: dict[str, Any]) -> tuple[float | None, str]:
    """The preemptions of the served requests, or None with why (no request's source says)."""
    section = report.get("requests")
    if not section:
        return None, "no served requests in the inputs (OTLP or Jaeger request spans)"
    pre = section.get("preemptions")
    if not pre:
        return None, "no request's source says whether it was preempted (journey tracing or phase spans)"
    return float(pre.get("count") or 0), f"of {pre.get('requests')} of {pre.get('known')} requests"


METRICS = {
    "preemptions": _preemptions,
    "ttft_p99": _p99("ttft_ns", "TTFT"),
    "tpot_p99": _p99("tpot_ns", "TPOT (two or more output tokens)"),
    "queue_p99": _p99("queue_ns", "time in queue"),
}


def percentile_pairs(base: dict[str, Any], new: dict[str, Any],
                     unmatched: list[str]) -> list[tuple[str, str, float, float, float]]:
    """(label, key, base value, new value, scale) per latency percentile both reports state, in ns; the scale
    (for a base of 0) is the base's p99 of that latency. A section only one report has goes to ``unmatched``."""
    a, b = base.get("requests"), new.get("requests")
    if not a or not b:
        if bool(a) != bool(b):
            unmatched.append(f"requests only in the {'base' if a else 'new'} report")
        return []
    pairs = []
    for key, label in LATENCIES:
        qa, qb = a.get(key) or {}, b.get(key) or {}
        scale = float(qa.get("p99") or 0)
        pairs += [(f"request {label} {p}", f"requests.{key}.{p}", float(qa[p]), float(qb[p]), scale)
                  for p in PERCENTILES if qa.get(p) is not None and qb.get(p) is not None]
    return pairs
