"""One self-contained HTML page (no script, no CDN): facts, the timeline as inline SVG, the tables, and each
GPU's time as a stacked bar (inline CSS).

Each pass and each wait is its own SVG rect with a <title>, so hovering shows what ran or what was waited for;
each part of a GPU's bar says its time and share in its title.
"""

from __future__ import annotations

from html import escape

from pipebubble.render import collectives, gputime, sections, timeline
from pipebubble.render.cells import share, time
from pipebubble.render.sections import Table
from pipebubble.report import Breakdown, Report, Segment, Wait

COLOURS = {"forward": "#4caf50", "backward": "#2196f3", "weight": "#9575cd", "prefill": "#ff9800",
           "decode": "#26c6da", "mixed": "#e040fb", "comm": "#cddc39", "other": "#9e9e9e"}
WAIT_COLOURS = {"fill": "#ef9a9a", "drain": "#ef9a9a", "upstream": "#e57373", "downstream": "#e57373",
                "comm": "#ffb74d", "collective": "#f06292", "host": "#a1887f", "sync": "#90a4ae", "unknown": "#bdbdbd"}
PART_COLOURS = {"compute": "#4caf50", "exposed comm": "#cddc39", "exposed memory": "#26c6da", "idle": "#ef9a9a"}
SVG_WIDTH, LABEL_PX, ROW_PX, BAR_PX, WAIT_PX = 1200, 130, 30, 20, 5
CSS = """body{font:14px system-ui,sans-serif;margin:24px;color:#222}h1{font-size:20px}h2{font-size:16px;margin-top:28px}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}ul{padding-left:20px}svg text{font:11px monospace}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle}.note{color:#666;margin:2px 0}.gb{display:flex;align-items:center;margin:2px 0}
.gb span{width:160px;font:11px monospace;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.gb b{display:flex;width:800px;height:14px;background:#f4f4f4}.gb i{display:block;height:100%}"""


def _x(t: int, start: int, end: int) -> float:
    return LABEL_PX + (SVG_WIDTH - LABEL_PX - 10) * (t - start) / max(end - start, 1)


def _rect(x0: float, x1: float, y: float, h: float, fill: str, title: str, label: str = "") -> str:
    rect = (f'<g><title>{escape(title)}</title><rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.5):.1f}"'
            f' height="{h}" fill="{fill}"/>')
    if label and x1 - x0 > 8 * len(label):
        rect += f'<text x="{(x0 + x1) / 2:.1f}" y="{y + h / 2 + 4:.1f}" text-anchor="middle">{escape(label)}</text>'
    return rect + "</g>"


def _segment(seg: Segment, origin: int) -> tuple[str, str]:
    mb = f" micro-batch {seg.microbatch}" if seg.microbatch is not None else ""
    chunk = f" chunk {seg.chunk}" if seg.chunk is not None else ""
    step = f" step {seg.step}" if seg.step is not None else ""
    where = seg.lane or f"stage {seg.stage}"
    title = (f"{where}: {seg.phase}{mb}{chunk}{step}, {sections.ms(seg.start_ns - origin)} ms,"
             f" {sections.ms(seg.end_ns - seg.start_ns)} ms long")
    letter = timeline.PHASES.get(seg.phase, timeline.PHASES["other"])[0]
    return title, (letter + str(seg.microbatch)) if seg.microbatch is not None else ""


def _wait(w: Wait, origin: int) -> str:
    waited_for = f", waited for rank {w.waited_for}" if w.waited_for is not None else ""
    return (f"wait {sections.ms(w.dur_ns)} ms at {sections.ms(w.start_ns - origin)} ms: {w.cause}{waited_for}"
            f" (before: {w.before or '-'}, after: {w.after or '-'})")


def svg(report: Report, step: int | None, window: tuple[int, int] | None, lanes: bool) -> str:
    start, end = timeline.select_window(report, step, window)
    origin = timeline.origin(report)
    keys = timeline.row_keys(report, lanes)
    index = {key: i for i, (_, key) in enumerate(keys)}
    height = ROW_PX * len(keys) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{SVG_WIDTH}" height="{height}"'
           f' viewBox="0 0 {SVG_WIDTH} {height}">']
    out += [f'<text x="4" y="{i * ROW_PX + 18}">{escape(label)}</text>' for i, (label, _) in enumerate(keys)]
    for seg in report.timeline:
        row = index.get(seg.lane if lanes and seg.lane else seg.stage)
        if row is not None and seg.end_ns > start and seg.start_ns < end:
            title, label = _segment(seg, origin)
            out.append(_rect(_x(max(seg.start_ns, start), start, end), _x(min(seg.end_ns, end), start, end),
                             row * ROW_PX + 4, BAR_PX, COLOURS.get(seg.phase, COLOURS["other"]), title, label))
    for w in report.waits:
        row = index.get(w.lane if lanes and w.lane else w.stage)
        if row is not None and w.start_ns + w.dur_ns > start and w.start_ns < end:
            out.append(_rect(_x(max(w.start_ns, start), start, end), _x(min(w.start_ns + w.dur_ns, end), start, end),
                             row * ROW_PX + 4 + BAR_PX, WAIT_PX, WAIT_COLOURS.get(w.cause, "#bdbdbd"),
                             _wait(w, origin)))
    out += _axis(start, end, origin, ROW_PX * len(keys) + 20)
    return "\n".join([*out, "</svg>"])


def _axis(start: int, end: int, origin: int, y: int) -> list[str]:
    """Tick labels in ms from the origin, reusing the text timeline's tick spacing (about 10 ticks)."""
    tick = timeline._nice_step((end - start) // 10)
    first = -(-(start - origin) // tick) * tick + origin
    return [f'<text x="{_x(t, start, end):.1f}" y="{y}" text-anchor="middle">{sections.ms(t - origin)}</text>'
            for t in range(first, end, tick)]


def legend(report: Report) -> str:
    phases = [p for p in timeline.PHASES if any(s.phase == p for s in report.timeline)]
    causes = sorted({w.cause for w in report.waits})
    items = [f'<span><i style="background:{COLOURS[p]}"></i>{timeline.PHASES[p][1]}</span>' for p in phases]
    items += [f'<span><i style="background:{WAIT_COLOURS.get(c, "#bdbdbd")};height:5px"></i>wait: {escape(c)}'
              f'</span>' for c in causes]
    return f'<p class="legend">{"".join(items)} (times in ms; hover for details)</p>'


def table(section: Table) -> str:
    def cls(i: int) -> str:
        return ' class="n"' if i in section.numeric else ""

    head = "".join(f"<th{cls(i)}>{escape(c)}</th>" for i, c in enumerate(section.columns))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{escape(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in section.rows)
    notes = "".join(f"<p class=\"note\">{escape(n)}</p>" for n in sections.footnotes(section))
    return f"<h2>{escape(section.title)}</h2>\n<table><tr>{head}</tr>{body}</table>{notes}"


def gpu_bars(report: Report, unit: str = "ms") -> list[str]:
    """One stacked bar per GPU over its whole window: compute, exposed comm, exposed memory, idle (they add up
    to the window, so the parts fill the bar)."""
    rows = gputime.whole(report)
    if not rows:
        return []
    keys = "".join(f'<span><i style="background:{PART_COLOURS[label]}"></i>{label}</span>'
                   for label, _ in gputime.PARTS)
    bars = "".join(_bar(b, unit) for b in rows)
    return [f'<p class="legend">{keys} (share of each GPU\'s window; hover for times)</p>', f"<div>{bars}</div>"]


def _bar(b: Breakdown, unit: str) -> str:
    parts = []
    for label, key in gputime.PARTS:
        ns = getattr(b, key)
        width = 100 * ns / b.window_ns if b.window_ns else 0.0
        title = f"{b.lane}: {label} {time(ns, unit)} {unit} ({share(ns, b.window_ns)})"
        parts.append(f'<i style="width:{width:.2f}%;background:{PART_COLOURS[label]}" title="{escape(title)}"></i>')
    return f'<div class="gb"><span title="{escape(b.lane)}">{escape(b.lane)}</span><b>{"".join(parts)}</b></div>'


def _facts(lines: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def interference(report: Report) -> list[str]:
    """The serving facts under their heading (their tables are sections of their own)."""
    if report.interference is None:
        return []
    return ["<h2>Serving: prefill / decode interference</h2>", _facts(sections.interference_facts(report))]


def collective_facts(report: Report, unit: str = "ms") -> list[str]:
    """The collectives' facts under their heading (their tables are sections of their own)."""
    if report.collectives is None:
        return []
    return ["<h2>Collectives</h2>", _facts(collectives.facts(report, unit))]


def host(report: Report, unit: str = "ms") -> list[str]:
    """The host's launch facts under their heading (its tables are sections of their own)."""
    if report.host is None:
        return []
    return ["<h2>Host</h2>", _facts(gputime.host_facts(report, unit))]


def legend_line(report: Report) -> list[str]:
    line = sections.legend(report)
    return [f'<p class="note">{escape(line)}</p>'] if line else []


def render(report: Report, *, step: int | None = None, window: tuple[int, int] | None = None,
           lanes: bool = False, unit: str = "ms", top: int = gputime.TOP) -> str:
    """The page, its sections in ``sections.SECTIONS`` order; times in ``unit`` (the timeline's in ms), ``top``
    rows of the kernel, API and range tables, every row of the others."""
    facts = sections.ingest_lines(report) + sections.job_notes(report) + sections.header(report, unit)
    drawn = {"facts": lambda: [_facts(facts)],
             "timeline": lambda: ["<h2>Timeline</h2>", svg(report, step, window, lanes), legend(report)]
             if report.timeline else [],
             "collectives": lambda: collective_facts(report, unit), "interference": lambda: interference(report),
             "gpu_bars": lambda: gpu_bars(report, unit), "host": lambda: host(report, unit),
             "legend": lambda: legend_line(report)}
    body = ["<h1>pipebubble report</h1>"]
    for kind, section in sections.walk(report, timeline.origin(report), sections.Layout(unit, top)):
        body += [table(section)] if section is not None else drawn[kind]()
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>pipebubble report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
