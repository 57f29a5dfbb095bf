"""The report's sections as plain strings (facts and tables) and drawings, laid out by each document renderer
(``terminal``, ``markdown``, ``html``) in its own way. Here: the one section list they all walk (``SECTIONS``,
``walk``, ``table``), the headline's cards, what was read and the lanes; beside it a module for each group of
sections (``pipeline``: header, stages, waits, what-if, critical path; ``serving``: interference facts, steps
and episodes; ``findings``, ``gputime``, ``memcpy``, ``collectives``, ``requests``, ``memory``; ``launches``: GPU
annotations, launch queues, launch delays) and the two timelines, as characters and as SVG (``timeline``: a row
per stage or lane; ``gpu_timeline``: a row per GPU).

Only formatting happens here: every number is read from the Report as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from pipebubble.render.cells import Table, num, pct, share, time  # renderers: Table
from pipebubble.render.choices import TOP
from pipebubble.render.sections import collectives, flops, gputime, launches, memcpy, pipeline, requests, serving
from pipebubble.report import Report
from pipebubble.report.words import reason_words

# The report's sections, top to bottom, written once: every document renderer (terminal, Markdown, HTML) walks
# this order. "findings" (a summary line and one item per finding, ``findings``), "gpu_timeline" (one
# step per GPU, ``gpu_timeline``, the top findings marked), "facts" (what was
# read, the job's notes, then the pipeline's header lines), the facts of "timeline", "collectives",
# "interference" and "host", "gpu_bars" (the GPU time as a bar per GPU: HTML draws it, text and Markdown have
# the table), "stage_bars" (the same per stage, HTML only), "memory" (facts and tables, ``memory``,
# and in HTML a timeline per stage) and "legend" (what each utilization figure shown means) are drawn by each
# renderer in its own way; the rest are tables (see ``table``).
SECTIONS = ("findings", "facts", "timeline", "gpu_timeline", "critical_path", "stages", "stage_bars", "replicas",
            "workers", "waits",
            "recommendations", "memory", "requests", "request_latency", "collectives", "collective_ranks",
            "collective_calls", "interference", "steps", "episodes", "gpu_time", "gpu_bars", "gpu_idle",
            "gpu_steps", "flops_gpus", "flops_ops", "flops_unmodelled", "memcpy", "kernels", "host", "host_api",
            "host_ranges",
            "gpu_annotations", "launch_queue", "launch_delays", "lanes", "legend")
DRAWN = frozenset({"findings", "facts", "timeline", "gpu_timeline", "stage_bars", "memory", "requests",
                   "collectives", "interference", "gpu_bars", "host", "legend"})

# What each utilization figure is (ARCHITECTURE.md definitions), keyed by the section that shows it.
LEGEND = {"pipeline": "utilization = 1 − bubble (stages computing / p over the step windows W)",
          "stages": "stage utilization = its compute (comm excluded) / |W|",
          "gpu_time": "GPU time: compute + exposed comm + exposed memory + idle = window, as unions",
          "lanes": "lane idle = 1 − union of its work / its own first-to-last busy window"}


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
        cards += [(f"${num(p.idle_cost_per_hour)}/h", "idle cost" + ("" if report.billed == "GPU" else
                   f" ({report.billed}-hours at --gpu-cost)"), False)] if p.idle_cost_per_hour is not None else []
    cards += serving.cards(report)
    c = report.collectives
    if c is not None:
        cards += [(f"{time(c.waited_ns, unit)} {unit}", "collective wait, all ranks", False)]
        cards += [(collectives.who(c.straggler, c.straggler_pid), "straggler", False)] \
            if c.straggler is not None or c.straggler_pid is not None else []
    if report.flops is not None and report.flops.mfu is not None:
        cards += [(pct(report.flops.mfu), "MFU (matrix work at peak)", False)]
    rows = gputime.whole(report)
    idlest = max(rows, key=lambda b: b.idle_ns / b.window_ns if b.window_ns else 0.0, default=None)
    cards += [(share(idlest.idle_ns, idlest.window_ns), f"idle, most idle GPU ({idlest.lane})", False)] \
        if idlest is not None else []
    return cards or [(f"{len(report.lanes):,}", "lanes", False), (f"{report.ingest.spans:,}", "spans", False)]


def job_notes(report: Report) -> list[str]:
    """What the job is (a pipeline or not, and why; one rank of many; a straggler), as the analysis wrote it."""
    useful = flops.summary(report)
    return [f"note: {n}" for n in report.notes] + ([useful] if useful else [])


def legend(report: Report) -> str | None:
    """One line defining each utilization figure the report shows; None when it shows none."""
    shown = {"pipeline": report.pipeline is not None, "stages": bool(report.stages),
             "gpu_time": bool(report.breakdown), "lanes": bool(report.lanes)}
    parts = [text for key, text in LEGEND.items() if shown[key]]
    return "legend: " + "; ".join(parts) if parts else None


def footnotes(section: Table) -> list[str]:
    return [f"[{i}] {note}" for i, note in enumerate(section.notes, 1)]


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
        line += "; not spans: " + ", ".join(f"{reason_words(k)} {v:,}" for k, v in ing.skipped.items())
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
    builders = {"stages": lambda: pipeline.stage_table(report, lo.bar_width, unit),
                "replicas": lambda: pipeline.replica_table(report, unit),
                "workers": lambda: pipeline.worker_table(report, unit),
                "waits": lambda: pipeline.wait_table(report, origin_ns, unit),
                "recommendations": lambda: pipeline.recommendation_table(report, unit),
                "collective_ranks": lambda: collectives.rank_table(report, lo.rank_limit, unit),
                "collective_calls": lambda: collectives.call_table(report, origin_ns, unit),
                "steps": lambda: serving.step_table(report),
                "episodes": lambda: serving.episode_table(report, origin_ns),
                "gpu_time": lambda: gputime.breakdown_table(report, lo.gpu_limit, unit),
                "gpu_idle": lambda: gputime.idle_table(report, lo.gpu_limit, unit),
                "gpu_steps": lambda: gputime.step_table(report, lo.step_limit, unit),
                "memcpy": lambda: memcpy.memcpy_table(report, lo.gpu_limit, unit),
                "flops_gpus": lambda: flops.gpu_table(report, lo.gpu_limit, unit),
                "flops_ops": lambda: flops.op_table(report, lo.top, unit),
                "flops_unmodelled": lambda: flops.unmodelled_table(report, lo.top, unit),
                "kernels": lambda: gputime.kernel_table(report, lo.top, unit),
                "host_api": lambda: gputime.api_table(report, lo.top, unit),
                "host_ranges": lambda: gputime.range_table(report, lo.top, unit),
                "gpu_annotations": lambda: launches.annotation_table(report, lo.top, unit),
                "launch_queue": lambda: launches.queue_table(report, lo.gpu_limit, unit),
                "launch_delays": lambda: launches.delay_table(report, lo.top, unit),
                "lanes": lambda: lane_table(report, lo.lane_limit, unit),
                "critical_path": lambda: pipeline.critical_table(report, unit),
                "request_latency": lambda: requests.table(report, unit)}
    return builders[kind]()


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
