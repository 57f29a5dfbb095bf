"""The report's sections as plain strings (facts and tables) and drawings, laid out by each document renderer
(``terminal``, ``markdown``, ``html``) in its own way. Here: the one section list they all walk (``SECTIONS``,
``walk``) and the pipeline's own sections (header and headline, stages, waits, what-if, critical path, serving
interference, lanes); beside it a module for each larger section (``findings``, ``gputime``, ``collectives``,
``requests``, ``memory``) and the two timelines, as characters and as SVG (``timeline``: a row per stage or
lane; ``gpu_timeline``: a row per GPU).

Only formatting happens here: every number is read from the Report as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipebubble.render.cells import Table, bar, ms, num, pct, share, signed_pct, size, time  # renderers: Table, ms
from pipebubble.render.choices import TOP
from pipebubble.render.sections import collectives, gputime, requests
from pipebubble.report import Report, Wait, ms4

TOP_WAITS = 10

# The report's sections, top to bottom, written once: every document renderer (terminal, Markdown, HTML) walks
# this order. "findings" (a summary line and one item per finding, ``findings``), "gpu_timeline" (one
# step per GPU, ``gpu_timeline``, the top findings marked), "facts" (what was
# read, the job's notes, then the pipeline's header lines), the facts of "timeline", "collectives",
# "interference" and "host", "gpu_bars" (the GPU time as a bar per GPU: HTML draws it, text and Markdown have
# the table), "stage_bars" (the same per stage, HTML only), "memory" (facts and tables, ``memory``,
# and in HTML a timeline per stage) and "legend" (what each utilization figure shown means) are drawn by each
# renderer in its own way; the rest are tables (see ``table``).
SECTIONS = ("findings", "facts", "timeline", "gpu_timeline", "critical_path", "stages", "stage_bars", "waits",
            "recommendations", "memory", "requests", "request_latency", "collectives", "collective_ranks",
            "collective_calls", "interference", "steps", "episodes", "gpu_time", "gpu_bars", "gpu_idle",
            "gpu_steps", "kernels", "host", "host_api", "host_ranges", "lanes", "legend")
DRAWN = frozenset({"findings", "facts", "timeline", "gpu_timeline", "stage_bars", "memory", "requests",
                   "collectives", "interference", "gpu_bars", "host", "legend"})

# What each utilization figure is (ARCHITECTURE.md definitions), keyed by the section that shows it.
LEGEND = {"pipeline": "utilization = 1 − bubble (stages computing / p over the step windows W)",
          "stages": "stage utilization = its compute (comm excluded) / |W|",
          "gpu_time": "GPU time: compute + exposed comm + exposed memory + idle = window, as unions",
          "lanes": "lane idle = 1 − union of its work / its own first-to-last busy window"}


def header(report: Report, unit: str = "ms") -> list[str]:
    """One line per fact about the pipeline: shape, evidence, bubble vs theory, utilization, bounds, cost."""
    p = report.pipeline
    if p is None:
        return []
    m = "?" if p.microbatches is None else f"{p.microbatches}" + (" (inferred)" if p.microbatches_inferred else "")
    sched = (p.schedule or "unknown schedule") + (f", v={p.chunks} chunks" if p.chunks > 1 else "")
    theory = f" vs {pct(p.theoretical_bubble_fraction)} in theory" if p.theoretical_bubble_fraction is not None else ""
    step = f", step {time(p.step_time_ns, unit)} {unit}" if p.step_time_ns else ""
    lines = [f"pipeline: p={p.stages} stages, m={m} micro-batches, {sched}{step}"]
    lines += ["pipeline evidence: " + "; ".join(p.evidence)] if p.evidence else []  # an item may hold commas
    efficiency = f"; efficiency {pct(p.pipeline_efficiency)} of theory's" if p.pipeline_efficiency is not None else ""
    lines += [f"bubble: {pct(p.bubble_fraction)} measured{theory}" + _excess(p.excess_bubble_fraction,
                                                                             p.excess_causes),
              f"utilization {pct(1 - p.bubble_fraction)} (1 − bubble{efficiency}), stage time CV"
              f" {num(p.stage_time_cv)}, imbalance {num(p.imbalance)}",
              f"throughput: compute-only bound {num(p.throughput_bound)} steps/s"
              + (f"; with exposed comm {num(p.throughput_bound_with_comm)} steps/s"
                 if p.throughput_bound_with_comm else "")]
    billed = report.billed
    if p.idle_gpu_ns_per_step and p.step_time_ns:
        lines.append(f"idle: {time(p.idle_gpu_ns_per_step, unit)} {billed}-{unit} per step, of"
                     f" {time(p.stages * p.step_time_ns, unit)} {billed}-{unit} billed")
    if p.idle_cost_per_hour is not None:
        lines.append(f"idle cost: ${num(p.idle_cost_per_hour)}/hour, ${num(p.idle_cost_per_step, 4)}/step"
                     + (f", ${num(p.effective_price_per_useful_gpu_hour)} per useful {billed}-hour"
                        if p.effective_price_per_useful_gpu_hour is not None else ""))
    return lines + [f"note: {n}" for n in p.notes]


def headline(report: Report, unit: str = "ms") -> list[tuple[str, str, bool]]:
    """The numbers a reader wants first, as (value, what it is, whether it misses a target): the pipeline's
    bubble, utilization, step and best what-if; serving's time between tokens against the SLO; the collectives'
    wait and straggler; the most idle GPU. Each read from the report as every other format shows it."""
    cards: list[tuple[str, str, bool]] = []
    p = report.pipeline
    if p is not None:
        cards += [(pct(p.bubble_fraction), "bubble, measured", False)]
        cards += [(pct(p.theoretical_bubble_fraction), "bubble in theory", False)] \
            if p.theoretical_bubble_fraction is not None else []
        cards += [(pct(1 - p.bubble_fraction), "utilization (1 − bubble)", False)]
        cards += [(f"{time(p.step_time_ns, unit)} {unit}", "step", False)] if p.step_time_ns else []
        best = max((r for r in p.recommendations if r.fits is not False), key=lambda r: r.speedup, default=None)
        cards += [(f"{best.speedup:.2f}x", f"best what-if: {best.label.split(' → ')[0]}", False)] if best else []
        cards += [(f"${num(p.idle_cost_per_hour)}/h", "idle cost", False)] if p.idle_cost_per_hour is not None else []
    cards += _serving_cards(report)
    c = report.collectives
    if c is not None:
        cards += [(f"{time(c.waited_ns, unit)} {unit}", "collective wait, all ranks", False)]
        cards += [(collectives.who(c.straggler, c.straggler_pid), "straggler", False)] \
            if c.straggler is not None or c.straggler_pid is not None else []
    rows = gputime.whole(report)
    idlest = max(rows, key=lambda b: b.idle_ns / b.window_ns if b.window_ns else 0.0, default=None)
    cards += [(share(idlest.idle_ns, idlest.window_ns), f"idle, most idle GPU ({idlest.lane})", False)] \
        if idlest is not None else []
    return cards or [(f"{len(report.lanes):,}", "lanes", False), (f"{report.ingest.spans:,}", "spans", False)]


def _serving_cards(report: Report) -> list[tuple[str, str, bool]]:
    it = report.interference
    if it is None:
        return []
    missed = slo_missed(report)
    slo = f" (SLO {num(it.tbt_slo_ms)} ms)" if it.tbt_slo_ms is not None else ""
    cards = [(f"{num(ms4(v))} ms", f"time between tokens, {k}{slo}" + (": missed" if k in missed else ""),
              k in missed) for k, v in (it.tbt_ns or {}).items() if v is not None]
    return cards + ([(f"{it.decode_slowdown_when_mixed:.2f}x", "decode slowdown when mixed", False)]
                    if it.decode_slowdown_when_mixed is not None else [])


def job_notes(report: Report) -> list[str]:
    """What the job is (a pipeline or not, and why; one rank of many; a straggler), as the analysis wrote it."""
    return [f"note: {n}" for n in report.notes]


def legend(report: Report) -> str | None:
    """One line defining each utilization figure the report shows; None when it shows none."""
    shown = {"pipeline": report.pipeline is not None, "stages": bool(report.stages),
             "gpu_time": bool(report.breakdown), "lanes": bool(report.lanes)}
    parts = [text for key, text in LEGEND.items() if shown[key]]
    return "legend: " + "; ".join(parts) if parts else None


def _excess(excess: float | None, causes: dict[str, float]) -> str:
    if excess is None:
        return ""
    shown = [(k, v) for k, v in sorted(causes.items(), key=lambda kv: (-kv[1], kv[0])) if round(v, 3)]
    parts = ", ".join(f"{k} {pct(v)}" for k, v in shown)  # causes that round to 0.0 % say nothing
    return f" (excess {pct(excess)}" + (f": {parts})" if parts else ")")


#: The stage table's columns after its name: (header, Stage field); busy and the three idle parts add up to the
#: stage's window (``Stage``: idle = |W| − busy = fill + drain + steady), and comm is a part of that idle.
STAGE_PARTS = (("busy", "busy_ns"), ("+ fill", "fill_ns"), ("+ drain", "drain_ns"), ("+ steady idle", "steady_idle_ns"))


def stage_table(report: Report, bar_width: int = 10, unit: str = "ms") -> Table:
    """Busy + fill + drain + steady idle = the stage's window (every column read from the Stage; the window is
    its busy and idle, ``Stage.idle_ns``); comm is the part of that idle spent communicating, so it is shown
    beside the window, not added to it; so are its receives' wait for the peer's send and transfer, where the
    job's sends were paired with them. ``bar_width`` 0: no text bar after the utilization."""
    p2p = report.pipeline is not None and report.pipeline.p2p is not None
    extra = [("p2p wait", "p2p_wait_ns"), ("p2p transfer", "p2p_transfer_ns")] if p2p else []
    rows = [[_stage_name(st.stage, st.name), *(time(getattr(st, key), unit) for _, key in STAGE_PARTS),
             time(st.busy_ns + st.idle_ns, unit), time(st.comm_ns, unit),
             *(time(getattr(st, key), unit) for _, key in extra),
             pct(st.utilization) + (f" {bar(st.utilization, bar_width)}" if bar_width else "")]
            for st in report.stages]
    columns = ["stage", *(head for head, _ in STAGE_PARTS), "= window", "comm in idle", *(h for h, _ in extra),
               "utilization"]
    return Table(f"Stages ({unit} over the step windows W: busy + fill + drain + steady idle = window; comm in idle:"
                 " the part of that idle spent communicating, not added again;"
                 + (" p2p wait/transfer: its receives spinning for the peer's send / transferring;" if p2p else "")
                 + " utilization = busy / |W|)",
                 columns, rows, frozenset(range(1, len(columns))),
                 drop=(*(h for h, _ in extra), "= window", "comm in idle"))


def _stage_name(stage: int, name: str) -> str:
    """``s1`` as on the timeline, plus the stage's own name when it says more."""
    short = f"s{stage}"
    return short if not name or name == short else f"{short} {name}"


def wait_table(report: Report, origin_ns: int, unit: str = "ms") -> Table:
    """The biggest waits (the report lists them biggest first); `at` is from the timeline's origin. A
    "waited for" column names the last rank to arrive when some wait shown spun in a collective."""
    shown = report.waits[:TOP_WAITS]
    blame = any(w.waited_for is not None or w.waited_for_pid is not None for w in shown)
    rows = [[wait_where(w), time(w.start_ns - origin_ns, unit), time(w.dur_ns, unit), w.cause, w.before or "-",
             w.after or "-", *([collectives.who(w.waited_for, w.waited_for_pid)] if blame else [])] for w in shown]
    title = f"Biggest waits (top {len(shown)} of {len(report.waits)})"
    return Table(title, ["where", f"at {unit}", unit, "cause", "before", "after", *(["waited for"] if blame else [])],
                 rows, frozenset({1, 2}), drop=("before", f"at {unit}"))


#: What each wait cause means (``analysis/pipeline/waits.py``, ``analysis/comm/collectives.py``), for tooltips
#: and legends.
CAUSES = {"fill": "before the stage's first compute of the step (pipeline fill)",
          "drain": "after the stage's last compute of the step (pipeline drain)",
          "upstream": "the next forward waited for its activation from the stage before",
          "downstream": "the next backward waited for its gradient from the stage after",
          "sync": "a host synchronize overlapped the gap", "comm": "communication covered most of the gap",
          "host": "its launching thread was busy (launch-bound)",
          "collective": "spun in a collective until the last rank arrived", "unknown": "no cause found"}


def wait_peer(w: Wait) -> str:
    """Whom a wait waited for, as its cause says: the stage before (upstream) or after (downstream), or the
    rank that arrived last at the collective; "" when the cause names no one."""
    if w.waited_for is not None or w.waited_for_pid is not None:
        return collectives.who(w.waited_for, w.waited_for_pid)
    if w.stage is not None and w.cause in ("upstream", "downstream"):
        return f"s{w.stage - 1 if w.cause == 'upstream' else w.stage + 1}"
    return ""


def wait_where(w: Wait) -> str:
    """The stage (``s2``); in a job that is not a pipeline, the rank, else the lane."""
    if w.stage is not None:
        return f"s{w.stage}"
    if w.rank is None and w.pid is None:
        return w.lane or "-"
    return collectives.who(w.rank, w.pid)


def recommendation_table(report: Report, unit: str = "ms") -> Table:
    """Notes are long and repeat across rows, so each distinct note is a footnote the rows point to."""
    recs = report.pipeline.recommendations if report.pipeline else []
    replay = _replay(report, unit)  # a footnote on the current setup's row
    notes = tuple(dict.fromkeys([*(r.note for r in recs if r.note), *([replay] if replay else [])]))
    # a label may end in "→ bubble 12 %"; the bubble column says that already
    measured = any(r.peak_memory_bytes is not None for r in recs)
    rows = [[r.label.split(" → ")[0], r.schedule, str(r.microbatches), str(r.chunks), time(r.step_time_ns, unit),
             pct(r.bubble_fraction), f"{r.speedup:.2f}x", *([size(r.peak_memory_bytes), _FITS[r.fits]] if measured
                                                           else []),
             _refs(notes, r.note, replay if _current(r.label) else "")]
            for r in recs]
    memory = ["peak memory", "fits"] if measured else []
    return Table("What if (simulated from the measured stage times; same global batch"
                 + ("" if measured else "; memory not measured") + ")",
                 ["change", "schedule", "m", "v", f"step {unit}", "bubble", "speedup", *memory, "note"],
                 rows, frozenset({2, 3, 4, 5, 6, 7} if measured else {2, 3, 4, 5, 6}), notes, drop=("schedule",))


_FITS = {True: "yes", False: "no", None: "?"}  # ? : no --memory-limit and no GPU capacity in the trace


def _replay(report: Report, unit: str = "ms") -> str:
    """The what-if replay of the current schedule against the measured step, when the analysis compared them."""
    p = report.pipeline
    if p is None or p.replay_error is None or p.replayed_step_ns is None:
        return ""
    return (f"current: replay {time(p.replayed_step_ns, unit)} {unit} vs measured {time(p.step_time_ns, unit)} {unit}"
            f" ({signed_pct(p.replay_error)}); speedups are against the measured step")


def _current(label: str) -> bool:
    return label.startswith("current")


def _refs(notes: tuple[str, ...], *texts: str) -> str:
    return " ".join(f"[{notes.index(text) + 1}]" for text in texts if text)


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


def lane_table(report: Report, limit: int | None = None, unit: str = "ms") -> Table:
    """One row per lane, in report order; ``limit``: at most that many rows, with a note of how many more
    (a job of thousands of threads would otherwise print thousands of rows)."""
    shown = report.lanes if limit is None else report.lanes[:limit]
    rows = [[ln.lane, ln.kind, time(ln.busy_ns, unit), time(ln.idle_ns, unit), time(ln.window_ns, unit),
             pct(ln.idle_fraction)] for ln in shown]
    hidden = len(report.lanes) - len(shown)
    every = "--format csv --table lanes, json, markdown or html list every lane"
    notes = (f"{hidden:,} more lanes not shown: {every}",) if hidden else ()
    return Table("Lanes (busy = union of work; window = first to last busy instant; idle = 1 − busy / window)",
                 ["lane", "kind", f"busy {unit}", f"idle {unit}", f"window {unit}", "idle"], rows,
                 frozenset({2, 3, 4, 5}), notes, drop=("kind", f"window {unit}", f"idle {unit}"))


def ingest_lines(report: Report, warnings: bool = True) -> list[str]:
    """What was read; with the ingest warnings unless the caller shows them elsewhere (the terminal report
    leaves them to stderr)."""
    ing = report.ingest
    line = f"{len(ing.files)} file(s), {ing.events_read:,} events, {ing.spans:,} spans"
    if ing.skipped:
        line += "; not spans: " + ", ".join(f"{k} {v:,}" for k, v in ing.skipped.items())
    return [line] + ([f"warning: {w}" for w in ing.warnings] if warnings else [])


@dataclass(frozen=True)
class Layout:
    """How a renderer wants the tables: times in ``unit`` (``cells.UNITS``), ``top`` rows of the kernel, API
    and range tables, utilization bars ``bar_width`` wide, and at most ``*_limit`` rows of lanes, collective
    ranks, GPUs and GPU steps (None: every row; the terminal sets them, each table says how many more)."""

    unit: str = "ms"
    top: int = TOP
    bar_width: int = 10
    lane_limit: int | None = None
    rank_limit: int | None = None
    gpu_limit: int | None = None
    step_limit: int | None = None


def table(report: Report, kind: str, origin_ns: int, layout: Layout | None = None) -> Table:
    """The table of section ``kind`` (any of SECTIONS but DRAWN); ``origin_ns``: where `at` times count from."""
    lo = layout or Layout()
    unit = lo.unit
    builders = {"stages": lambda: stage_table(report, lo.bar_width, unit),
                "waits": lambda: wait_table(report, origin_ns, unit),
                "recommendations": lambda: recommendation_table(report, unit),
                "collective_ranks": lambda: collectives.rank_table(report, lo.rank_limit, unit),
                "collective_calls": lambda: collectives.call_table(report, origin_ns, unit),
                "steps": lambda: step_table(report), "episodes": lambda: episode_table(report, origin_ns),
                "gpu_time": lambda: gputime.breakdown_table(report, lo.gpu_limit, unit),
                "gpu_idle": lambda: gputime.idle_table(report, lo.gpu_limit, unit),
                "gpu_steps": lambda: gputime.step_table(report, lo.step_limit, unit),
                "kernels": lambda: gputime.kernel_table(report, lo.top, unit),
                "host_api": lambda: gputime.api_table(report, lo.top, unit),
                "host_ranges": lambda: gputime.range_table(report, lo.top, unit),
                "lanes": lambda: lane_table(report, lo.lane_limit, unit),
                "critical_path": lambda: critical_table(report, unit),
                "request_latency": lambda: requests.table(report, unit)}
    return builders[kind]()


def critical_table(report: Report, unit: str = "ms") -> Table:
    """The median step's critical path by participant: its time there by kind and its share of the step."""
    paths = [p for p in report.critical_path if p.segments]
    if not paths:
        return Table("Critical path", [], [])
    path = paths[0]
    rows = [[collectives.who(s.rank, s.pid), time(s.compute_ns, unit), time(s.memory_ns, unit), time(s.comm_ns, unit),
             time(s.host_ns, unit), time(s.waiting_ns, unit),
             share(s.compute_ns + s.memory_ns + s.comm_ns + s.host_ns + s.waiting_ns, path.length_ns)]
            for s in path.by_rank]
    step = "" if path.step is None else f" of step {path.step}"
    return Table(f"Critical path{step} (the median step, {time(path.length_ns, unit)} {unit}: the longest chain of"
                 " stream order, launches, collectives' last arrivals and send → recv; its length is the step's)",
                 ["on", f"compute {unit}", f"memory {unit}", f"exposed comm {unit}", f"host {unit}",
                  f"waiting {unit}", "of step"], rows, frozenset(range(1, 7)))


def walk(report: Report, origin_ns: int, layout: Layout | None = None) -> Iterator[tuple[str, Table | None]]:
    """Each section in SECTIONS order as (kind, table): table is None for a drawn section (the renderer decides
    whether it has anything to show); a table without rows is left out."""
    for kind in SECTIONS:
        if kind in DRAWN:
            yield kind, None
            continue
        section = table(report, kind, origin_ns, layout)
        if section.rows:
            yield kind, section
