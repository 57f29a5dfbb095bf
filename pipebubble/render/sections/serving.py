"""Serving's sections: the facts of prefill/decode interference (steps by class, slowdowns, time between
tokens against the SLO), the headline's cards, step time by class and the worst episodes. Times are the ms
the JSON report writes (``ms4``), so every format shows the same digits."""

from __future__ import annotations

from pipebubble.render.cells import Table, ms, num
from pipebubble.report import Report, ms4


def cards(report: Report) -> list[tuple[str, str, bool]]:
    it = report.interference
    if it is None:
        return []
    missed = slo_missed(report)
    slo = f" (SLO {num(it.tbt_slo_ms)} ms)" if it.tbt_slo_ms is not None else ""
    cards = [(f"{num(ms4(v))} ms", f"time between tokens, {k}{slo}" + (": missed" if k in missed else ""),
              k in missed) for k, v in (it.tbt_ns or {}).items() if v is not None]
    return cards + ([(f"{it.decode_slowdown_when_mixed:.2f}x", "decode slowdown when mixed", False)]
                    if it.decode_slowdown_when_mixed is not None else [])


def interference_facts(report: Report) -> list[str]:
    """Serving: one line per fact the interference section holds; facts it lacks are left out. Times are the
    ms the JSON report writes (``ms4``), so every format shows the same digits."""
    it = report.interference
    if it is None:
        return []
    facts = []
    if it.classes:
        counts = ", ".join(f"{c.name} {c.steps}" for c in it.classes)
        facts.append(f"steps: {'-' if it.steps is None else it.steps} ({counts})"
                     + (f", from {it.source}" if it.source is not None else ""))
    if it.clock_note is not None:
        facts.append(f"step time: {it.clock_note}")
    if it.overlapped_steps:
        facts.append(f"steps launched while the previous step still ran: {it.overlapped_steps} "
                     "(time between tokens is completion to completion)")
    simple = [(it.decode_slowdown_when_mixed, "decode slowdown when mixed with prefill", "x"),
              (it.decode_slowdown_when_prefill, "decode slowdown behind prefill (time between tokens)", "x"),
              (it.generation_stalls, "generation stalls", ""),
              (ms4(it.ns_per_1k_prefill_tokens), "ms per 1k prefill tokens", ""),
              (it.chunk_for_slo_tokens, "prefill chunk that meets the TBT SLO", " tokens"),
              (it.tbt_slo_ms, "TBT SLO", " ms"), (it.step_cv, "step time CV", "")]
    facts += [f"{text}: {num(value)}{unit}" for value, text, unit in simple if value is not None]
    if it.tbt_ns is not None:
        facts.append("time between tokens: " + ", ".join(f"{k} {num(ms4(v))} ms" for k, v in it.tbt_ns.items()))
    missed = slo_missed(report)
    if missed:
        facts.append(f"{SLO_MISSED}: {', '.join(f'{k} {num(ms4(v))} ms' for k, v in missed.items())} over"
                     f" {num(it.tbt_slo_ms)} ms")
    if it.gpu_idle_between_steps_ns is not None:
        facts.append(f"GPU idle between steps: {ms(it.gpu_idle_between_steps_ns)} ms")
    return facts


SLO_MISSED = "TBT SLO missed"  # how the serving fact of a missed target starts (HTML highlights it)


def slo_missed(report: Report) -> dict[str, float]:
    """The time-between-tokens quantiles over the ``--tbt-slo`` target, as the report holds them (none when no
    target was given or every quantile meets it)."""
    it = report.interference
    if it is None or it.tbt_slo_ms is None or not it.tbt_ns:
        return {}
    return {k: v for k, v in it.tbt_ns.items() if v is not None and v > it.tbt_slo_ms * 1_000_000}


#: A step's two clocks and the lag between them, shown when some step launched GPU work.
_STEP_PARTS = (("cpu p50", "cpu_ns"), ("gpu p50", "gpu_ns"), ("lag p50", "lag_ns"))


def step_table(report: Report) -> Table:
    """Step time (max of its CPU range and its GPU work) by class, with the p50 of each part."""
    classes = report.interference.classes if report.interference else []
    ran = [c for c in classes if c.durations_ns is not None]
    qs = sorted({q for c in ran for q in c.durations_ns})
    parts = [(head, attr) for head, attr in _STEP_PARTS if any(c.gpu_ns for c in ran)]
    rows = [[c.name] + [num(ms4(c.durations_ns.get(q))) for q in qs]
            + [num(ms4((getattr(c, attr) or {}).get("p50"))) for _, attr in parts] for c in ran]
    heads = ["class", *qs, *(head for head, _ in parts)]
    return Table("Step time by class (ms; max of the CPU range and its GPU work)", heads, rows,
                 frozenset(range(1, len(heads))), drop=("lag p50", "cpu p50"))


def episode_table(report: Report, origin_ns: int) -> Table:
    eps = report.interference.worst_episodes if report.interference else []
    rows = [[ms(e.start_ns - origin_ns) if e.start_ns is not None else "-", ms(e.dur_ns), e.cls or "-",
             num(e.prefill_tokens), num(e.decode_requests), _times(e.slowdown)] for e in eps]
    return Table("Worst interference episodes", ["at ms", "ms", "class", "prefill tokens", "decode reqs",
                                                 "slowdown"], rows, frozenset({0, 1, 3, 4, 5}),
                 drop=("decode reqs", "prefill tokens"))


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"
