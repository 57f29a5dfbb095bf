"""The report's sections as plain strings (facts and tables), laid out by each renderer in its own way.

Only formatting happens here: every number is read from the Report as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipebubble.report import Report, ms4

TOP_WAITS = 10

# The report's sections, top to bottom, written once: every document renderer (terminal, Markdown, HTML) walks
# this order. "facts" (what was read, then the pipeline's header lines), "timeline" and "interference" (the
# serving facts) are drawn by each renderer in its own way; the rest are tables (see ``table``).
SECTIONS = ("facts", "timeline", "stages", "waits", "recommendations", "interference", "steps", "episodes",
            "lanes")
DRAWN = frozenset({"facts", "timeline", "interference"})


@dataclass(frozen=True)
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    numeric: frozenset[int] = frozenset()  # right-aligned column indexes
    notes: tuple[str, ...] = ()  # footnotes, referred to as [1], [2] in the rows


def ms(ns: int | float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:,.2f}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"  # no space: a line never wraps between number and sign


def num(x: Any, digits: int = 2) -> str:
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:,.{digits}f}"


def bar(fraction: float, width: int = 10) -> str:
    full = round(max(0.0, min(fraction, 1.0)) * width)
    return "█" * full + "░" * (width - full)


def header(report: Report) -> list[str]:
    """One line per fact about the pipeline: shape, bubble vs theory, utilization, bounds, cost."""
    p = report.pipeline
    if p is None:
        return []
    m = "?" if p.microbatches is None else f"{p.microbatches}" + (" (inferred)" if p.microbatches_inferred else "")
    sched = (p.schedule or "unknown schedule") + (f", v={p.chunks} chunks" if p.chunks > 1 else "")
    theory = f" vs {pct(p.theoretical_bubble_fraction)} in theory" if p.theoretical_bubble_fraction is not None else ""
    lines = [f"pipeline: p={p.stages} stages, m={m} micro-batches, {sched}",
             f"bubble: {pct(p.bubble_fraction)} measured{theory}" + _excess(p.excess_bubble_fraction,
                                                                             p.excess_causes),
             f"utilization {pct(1 - p.bubble_fraction)}, stage time CV {num(p.stage_time_cv)},"
             f" imbalance {num(p.imbalance)}, throughput bound {num(p.throughput_bound)} steps/s"
             + (f", step {ms(p.step_time_ns)} ms" if p.step_time_ns else "")]
    if p.pipeline_efficiency is not None:
        lines[-1] += f", efficiency {pct(p.pipeline_efficiency)}"
    if p.idle_gpu_ns_per_step and p.step_time_ns:
        lines.append(f"idle: {ms(p.idle_gpu_ns_per_step)} GPU-ms per step, of {ms(p.stages * p.step_time_ns)} "
                     "GPU-ms billed")
    if p.idle_cost_per_hour is not None:
        lines.append(f"idle cost: ${num(p.idle_cost_per_hour)}/hour, ${num(p.idle_cost_per_step, 4)}/step"
                     + (f", ${num(p.effective_price_per_useful_gpu_hour)} per useful GPU-hour"
                        if p.effective_price_per_useful_gpu_hour is not None else ""))
    return lines + [f"note: {n}" for n in p.notes]


def _excess(excess: float | None, causes: dict[str, float]) -> str:
    if excess is None:
        return ""
    shown = [(k, v) for k, v in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])) if round(v, 3)]
    parts = ", ".join(f"{k} {pct(v)}" for k, v in shown)  # causes that round to 0.0 % say nothing
    return f" (excess {pct(excess)}" + (f": {parts})" if parts else ")")


def stage_table(report: Report, bar_width: int = 10) -> Table:
    rows = [[_stage_name(st.stage, st.name), ms(st.busy_ns), ms(st.comm_ns), ms(st.fill_ns), ms(st.drain_ns),
             ms(st.steady_idle_ns), f"{pct(st.utilization)} {bar(st.utilization, bar_width)}"]
            for st in report.stages]
    return Table("Stages (ms over the step window)", ["stage", "busy", "comm", "fill", "drain", "steady idle",
                                                      "utilization"], rows, frozenset(range(1, 6)))


def _stage_name(stage: int, name: str) -> str:
    """``s1`` as on the timeline, plus the stage's own name when it says more."""
    short = f"s{stage}"
    return short if not name or name == short else f"{short} {name}"


def wait_table(report: Report, origin_ns: int) -> Table:
    """The biggest waits (the report lists them biggest first); `at` is ms from the timeline's origin."""
    rows = [[f"s{w.stage}", ms(w.start_ns - origin_ns), ms(w.dur_ns), w.cause, w.before or "-",
             w.after or "-"] for w in report.waits[:TOP_WAITS]]
    title = f"Biggest waits (top {min(TOP_WAITS, len(report.waits))} of {len(report.waits)})"
    return Table(title, ["where", "at ms", "ms", "cause", "before", "after"], rows, frozenset({1, 2}))


def recommendation_table(report: Report) -> Table:
    """Notes are long and repeat across rows, so each distinct note is a footnote the rows point to."""
    recs = report.pipeline.recommendations if report.pipeline else []
    notes = tuple(dict.fromkeys(r.note for r in recs if r.note))
    # a label may end in "→ bubble 12 %"; the bubble column says that already
    rows = [[r.label.split(" → ")[0], r.schedule, str(r.microbatches), str(r.chunks), ms(r.step_time_ns),
             pct(r.bubble_fraction), f"{r.speedup:.2f}x", _note_ref(notes, r.note)] for r in recs]
    return Table("What if (simulated from the measured stage times)",
                 ["change", "schedule", "m", "v", "step ms", "bubble", "speedup", "note"], rows,
                 frozenset({2, 3, 4, 5, 6}), notes)


def _note_ref(notes: tuple[str, ...], note: str) -> str:
    return f"[{notes.index(note) + 1}]" if note else ""


def footnotes(section: Table) -> list[str]:
    return [f"[{i}] {note}" for i, note in enumerate(section.notes, 1)]


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
    simple = [(it.decode_slowdown_when_mixed, "decode slowdown when mixed with prefill", "x"),
              (it.generation_stalls, "generation stalls", ""),
              (ms4(it.ns_per_1k_prefill_tokens), "ms per 1k prefill tokens", ""),
              (it.chunk_for_slo_tokens, "prefill chunk that meets the TBT SLO", " tokens"),
              (it.tbt_slo_ms, "TBT SLO", " ms"), (it.step_cv, "step time CV", "")]
    facts += [f"{text}: {num(value)}{unit}" for value, text, unit in simple if value is not None]
    if it.tbt_ns is not None:
        facts.append("time between tokens: " + ", ".join(f"{k} {num(ms4(v))} ms" for k, v in it.tbt_ns.items()))
    if it.gpu_idle_between_steps_ns is not None:
        facts.append(f"GPU idle between steps: {ms(it.gpu_idle_between_steps_ns)} ms")
    return facts


def step_table(report: Report) -> Table:
    classes = report.interference.classes if report.interference else []
    step_ns = {c.name: c.durations_ns for c in classes if c.durations_ns is not None}
    qs = sorted({q for v in step_ns.values() for q in v})
    rows = [[cls] + [num(ms4(v.get(q))) for q in qs] for cls, v in step_ns.items()]
    return Table("Step time by class (ms)", ["class", *qs], rows, frozenset(range(1, len(qs) + 1)))


def episode_table(report: Report, origin_ns: int) -> Table:
    eps = report.interference.worst_episodes if report.interference else []
    rows = [[ms(e.start_ns - origin_ns) if e.start_ns is not None else "-", ms(e.dur_ns), e.cls or "-",
             num(e.prefill_tokens), num(e.decode_requests), _times(e.slowdown)] for e in eps]
    return Table("Worst interference episodes", ["at ms", "ms", "class", "prefill tokens", "decode reqs",
                                                 "slowdown"], rows, frozenset({0, 1, 3, 4, 5}))


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def lane_table(report: Report, limit: int | None = None) -> Table:
    """One row per lane, in report order; ``limit``: at most that many rows, with a note of how many more
    (a job of thousands of threads would otherwise print thousands of rows)."""
    shown = report.lanes if limit is None else report.lanes[:limit]
    rows = [[ln.lane, ln.kind, ms(ln.busy_ns), ms(ln.idle_ns), ms(ln.window_ns), pct(ln.idle_fraction)]
            for ln in shown]
    hidden = len(report.lanes) - len(shown)
    notes = (f"{hidden:,} more lanes not shown: --format json, markdown or html lists every lane",) if hidden else ()
    return Table("Lanes (busy = union of work; window = first to last busy instant)",
                 ["lane", "kind", "busy ms", "idle ms", "window ms", "idle"], rows, frozenset({2, 3, 4, 5}), notes)


def ingest_lines(report: Report, warnings: bool = True) -> list[str]:
    """What was read; with the ingest warnings unless the caller shows them elsewhere (the terminal report
    leaves them to stderr)."""
    ing = report.ingest
    line = f"{len(ing.files)} file(s), {ing.events_read:,} events, {ing.spans:,} spans"
    if ing.skipped:
        line += "; not spans: " + ", ".join(f"{k} {v:,}" for k, v in ing.skipped.items())
    return [line] + ([f"warning: {w}" for w in ing.warnings] if warnings else [])


def table(report: Report, kind: str, origin_ns: int, *, bar_width: int = 10, lane_limit: int | None = None) -> Table:
    """The table of section ``kind`` (any of SECTIONS but DRAWN); ``origin_ns``: where `at ms` counts from."""
    builders = {"stages": lambda: stage_table(report, bar_width), "waits": lambda: wait_table(report, origin_ns),
                "recommendations": lambda: recommendation_table(report), "steps": lambda: step_table(report),
                "episodes": lambda: episode_table(report, origin_ns),
                "lanes": lambda: lane_table(report, lane_limit)}
    return builders[kind]()


def walk(report: Report, origin_ns: int, *, bar_width: int = 10,
         lane_limit: int | None = None) -> Iterator[tuple[str, Table | None]]:
    """Each section in SECTIONS order as (kind, table): table is None for a drawn section (the renderer decides
    whether it has anything to show); a table without rows is left out."""
    for kind in SECTIONS:
        if kind in DRAWN:
            yield kind, None
            continue
        section = table(report, kind, origin_ns, bar_width=bar_width, lane_limit=lane_limit)
        if section.rows:
            yield kind, section
