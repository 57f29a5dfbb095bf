"""One self-contained HTML page (no script, no CDN, no web font): a header with the inputs, the date, the
pipebubble version and the headline numbers as cards; the facts; the timeline as inline SVG that scales to the
window; the tables; each stage's and each GPU's time as a stacked bar (inline CSS).

Each pass and each wait is its own SVG rect with a <title>, so hovering shows what ran, or a wait's cause, the
peer it waited for and the passes around it; each part of a bar says its time and share in its title. The
colours are the Okabe–Ito set for the phases and Paul Tol's muted set for the wait causes, both chosen to stay
apart for colour-blind readers; a legend names every colour shown.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from html import escape

from pipebubble import __version__
from pipebubble.render import axis, sections
from pipebubble.render.cells import ms, pct, share, time
from pipebubble.render.choices import TOP
from pipebubble.render.sections import (
    Table,
    collectives,
    findings,
    gpu_timeline,
    gputime,
    memory,
    pipeline,
    requests,
    serving,
    timeline,
)
from pipebubble.report import Breakdown, Report, Segment, Stage, Wait

COLOURS = {"forward": "#009e73", "backward": "#0072b2", "weight": "#cc79a7", "prefill": "#e69f00",
           "decode": "#56b4e9", "mixed": "#d55e00", "comm": "#f0e442", "other": "#999999"}
WAIT_COLOURS = {"fill": "#88ccee", "drain": "#ddcc77", "upstream": "#332288", "downstream": "#cc6677",
                "comm": "#117733", "collective": "#aa4499", "host": "#882255", "sync": "#999933",
                "dp_sync": "#44aa99", "unknown": "#bbbbbb"}
PART_COLOURS = {"compute": "#0072b2", "exposed comm": "#f0e442", "exposed memory": "#56b4e9", "idle": "#bbbbbb"}
# A stage's bar: busy and the three idle parts (they add up to its window), the wait colours for fill and drain
STAGE_COLOURS = {"busy": "#0072b2", "fill": "#88ccee", "drain": "#ddcc77", "steady idle": "#bbbbbb"}
STAGE_PARTS = (("busy", "busy_ns"), ("fill", "fill_ns"), ("drain", "drain_ns"), ("steady idle", "steady_idle_ns"))
VIEW_W, LABEL_W, ROW_H, BAR_H, WAIT_H = 1000, 120, 30, 18, 6  # the SVG's own units: it scales to the page
SIGNED = re.compile(r"^([+=]) ")
FILES_SHOWN = 3  # input names in the header; the rest fold into a <details>
CSS = """*{box-sizing:border-box}body{font:14px system-ui,sans-serif;margin:0 auto;padding:16px;max-width:1280px;
color:#222}h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin-top:28px}.meta{color:#555;margin:0 0 12px}
.meta summary{cursor:pointer}.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:8px}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 10px}.card b{display:block;font-size:20px;
font-variant-numeric:tabular-nums}.card span{color:#555;font-size:12px}.card.miss{border:2px solid #d55e00}
.card.miss b,li.miss{color:#b34700;font-weight:600}.tw{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left;
vertical-align:top}th{vertical-align:bottom}td:first-child{min-width:10em;overflow-wrap:anywhere}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}td.n{white-space:nowrap}
h2 small{font-weight:normal;font-size:13px;color:#555}ul{padding-left:20px}
svg{display:block;width:100%;height:auto}svg text{font:12px monospace}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:middle}.note{color:#666;margin:2px 0}.gb,.sb{display:flex;align-items:center;
margin:3px 0;gap:8px}.gb span,.sb span{flex:0 0 150px;font:12px monospace;overflow:hidden;text-overflow:ellipsis;
white-space:nowrap}.gb b,.sb b{display:flex;flex:1 1 auto;min-width:0;height:14px;background:#f4f4f4}
.gb i,.sb i{display:block;height:100%}.sb s{display:block;height:4px;background:#f0e442;margin-top:1px}
.sb em{flex:0 0 56px;font-style:normal;text-align:right;font-variant-numeric:tabular-nums}
.sb div{flex:1 1 auto;min-width:0}"""


def generated() -> str:
    """When the page was made, UTC to the minute; ``SOURCE_DATE_EPOCH`` (reproducible builds) fixes it."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = datetime.fromtimestamp(int(epoch), timezone.utc) if epoch else datetime.now(timezone.utc)
    return when.strftime("%Y-%m-%d %H:%M UTC")


def _x(t: int, start: int, end: int) -> float:
    return LABEL_W + (VIEW_W - LABEL_W - 10) * (t - start) / max(end - start, 1)


def _rect(x0: float, x1: float, y: float, h: float, fill: str, title: str, label: str = "") -> str:
    rect = (f'<g><title>{escape(title)}</title><rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 0.5):.1f}"'
            f' height="{h}" fill="{fill}"/>')
    if label and x1 - x0 > 8 * len(label):
        colour = "#fff" if fill in ("#0072b2", "#d55e00", "#009e73") else "#000"
        rect += (f'<text x="{(x0 + x1) / 2:.1f}" y="{y + h / 2 + 4:.1f}" text-anchor="middle"'
                 f' fill="{colour}">{escape(label)}</text>')
    return rect + "</g>"


def _segment(seg: Segment, origin: int) -> tuple[str, str]:
    mb = f" micro-batch {seg.microbatch}" if seg.microbatch is not None else ""
    chunk = f" chunk {seg.chunk}" if seg.chunk is not None else ""
    step = f" step {seg.step}" if seg.step is not None else ""
    where = seg.lane or f"stage {seg.stage}"
    title = (f"{where}: {seg.phase}{mb}{chunk}{step}, {ms(seg.start_ns - origin)} ms,"
             f" {ms(seg.end_ns - seg.start_ns)} ms long")
    letter = timeline.PHASES.get(seg.phase, timeline.PHASES["other"])[0]
    return title, (letter + str(seg.microbatch)) if seg.microbatch is not None else ""


def _wait(w: Wait, origin: int) -> str:
    """A wait's tooltip: how long and where, its cause in words, the peer it waited for, the passes around it."""
    where = pipeline.wait_where(w)
    peer = pipeline.wait_peer(w)
    return (f"{where}: {w.cause} wait, {ms(w.dur_ns)} ms at {ms(w.start_ns - origin)} ms"
            f" — {pipeline.CAUSES.get(w.cause, w.cause)}" + (f"; waited for {peer}" if peer else "")
            + f"; passes: before {w.before or '-'}, after {w.after or '-'}")


def svg(report: Report, step: int | None, window: tuple[int, int] | None, lanes: bool) -> str:
    start, end = timeline.select_window(report, step, window)
    origin = timeline.origin(report)
    keys = timeline.row_keys(report, lanes)
    index = {key: i for i, (_, key) in enumerate(keys)}
    bottom = ROW_H * len(keys) + 2
    height = bottom + axis.TICK + 11 + axis.LINE_H + 8
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {VIEW_W} {height}" width="100%"'
           f' preserveAspectRatio="xMinYMin meet" role="img" aria-label="timeline">']
    out += [f'<text x="4" y="{i * ROW_H + 16}">{escape(label)}</text>' for i, (label, _) in enumerate(keys)]
    for seg in report.timeline:
        row = index.get(seg.lane if lanes and seg.lane else seg.stage)
        if row is not None and seg.end_ns > start and seg.start_ns < end:
            title, label = _segment(seg, origin)
            out.append(_rect(_x(max(seg.start_ns, start), start, end), _x(min(seg.end_ns, end), start, end),
                             row * ROW_H + 3, BAR_H, COLOURS.get(seg.phase, COLOURS["other"]), title, label))
    for w in report.waits:
        row = index.get(w.lane if lanes and w.lane else w.stage)
        if row is not None and w.start_ns + w.dur_ns > start and w.start_ns < end:
            out.append(_rect(_x(max(w.start_ns, start), start, end), _x(min(w.start_ns + w.dur_ns, end), start, end),
                             row * ROW_H + 3 + BAR_H, WAIT_H, WAIT_COLOURS.get(w.cause, WAIT_COLOURS["unknown"]),
                             _wait(w, origin)))
    out += _axes(start, end, origin, bottom)
    return "\n".join([*out, "</svg>"])


def _axes(start: int, end: int, origin: int, bottom: int) -> list[str]:
    """The y-axis (a row a stage or lane, named at its left) and the x-axis: the time from the origin, its ticks
    in 1-2-5 steps of the unit they need (``0 500 1000`` ms, ``0 2 4`` s), whole numbers, no separators."""
    scale = axis.time_scale(start - origin, end - origin, axis.count_for(VIEW_W - LABEL_W - 10))
    return [axis.line(LABEL_W, 0, LABEL_W, bottom),
            *axis.x_axis(scale, lambda t: _x(t + origin, start, end), bottom, LABEL_W, VIEW_W - 10,
                         "time from the timeline's start", VIEW_W)]


def legend(report: Report) -> str:
    phases = [p for p in timeline.PHASES if any(s.phase == p for s in report.timeline)]
    causes = sorted({w.cause for w in report.waits})
    items = [f'<span><i style="background:{COLOURS[p]}"></i>{timeline.PHASES[p][1]}</span>' for p in phases]
    items += [f'<span><i style="background:{WAIT_COLOURS.get(c, WAIT_COLOURS["unknown"])};height:6px"></i>wait:'
              f' {escape(c)}</span>' for c in causes]
    return f'<p class="legend">{"".join(items)} (times in ms; hover for details)</p>'


def table(section: Table) -> str:
    def cls(i: int) -> str:
        return ' class="n"' if i in section.numeric else ""

    head = "".join(f"<th{cls(i)}>{escape(_head(c))}</th>" for i, c in enumerate(section.columns))
    body = "".join("<tr>" + "".join(f"<td{cls(i)}>{escape(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                   for row in section.rows)
    notes = "".join(f"<p class=\"note\">{escape(n)}</p>" for n in sections.footnotes(section))
    return f"{_title(section.title)}\n<div class=\"tw\"><table><tr>{head}</tr>{body}</table></div>{notes}"


def _head(column: str) -> str:
    """A header may fold between its words, but ``+ fill`` keeps its sign (a no-break space)."""
    return SIGNED.sub("\\1\u00a0", column)


def _title(title: str) -> str:
    """A table's name as the heading, what its columns mean (the title's parenthesis) in smaller type."""
    name, sep, rest = title.partition(" (")
    return f"<h2>{escape(name)}" + (f' <small>({escape(rest)}</small>' if sep else "") + "</h2>"


def _keys(colours: dict[str, str], note: str) -> str:
    items = "".join(f'<span><i style="background:{colour}"></i>{label}</span>' for label, colour in colours.items())
    return f'<p class="legend">{items} ({note})</p>'


def stage_bars(report: Report, unit: str = "ms") -> list[str]:
    """One stacked bar per stage over its window: busy, fill, drain, steady idle (they add up to it), with the
    part of the idle spent communicating as a thin strip under it."""
    if not report.stages:
        return []
    keys = _keys({**STAGE_COLOURS, "comm in idle": "#f0e442"}, "share of each stage's window; hover for times")
    return [keys, "<div>" + "".join(_stage_bar(st, unit) for st in report.stages) + "</div>"]


def _stage_bar(st: Stage, unit: str) -> str:
    window = st.busy_ns + st.idle_ns  # Stage: idle = |W| − busy
    name = f"s{st.stage}" + (f" {st.name}" if st.name and st.name != f"s{st.stage}" else "")
    parts = "".join(_part(f"{name}: {label}", getattr(st, key), window, STAGE_COLOURS[label], unit)
                    for label, key in STAGE_PARTS)
    comm = f"{name}: comm in idle {time(st.comm_ns, unit)} {unit} ({share(st.comm_ns, window)})"
    strip = f'<s style="width:{_width(st.comm_ns, window):.2f}%" title="{escape(comm)}"></s>'
    return (f'<div class="sb"><span title="{escape(name)}">{escape(name)}</span><div><b>{parts}</b>{strip}</div>'
            f'<em title="utilization">{pct(st.utilization)}</em></div>')


def _width(ns: int, window: int) -> float:
    return 100 * ns / window if window else 0.0


def _part(what: str, ns: int, window: int, colour: str, unit: str) -> str:
    title = f"{what} {time(ns, unit)} {unit} ({share(ns, window)})"
    return f'<i style="width:{_width(ns, window):.2f}%;background:{colour}" title="{escape(title)}"></i>'


def gpu_bars(report: Report, unit: str = "ms") -> list[str]:
    """One stacked bar per GPU over its whole window: compute, exposed comm, exposed memory, idle (they add up
    to the window, so the parts fill the bar)."""
    rows = gputime.whole(report)
    if not rows:
        return []
    bars = "".join(_bar(b, unit) for b in rows)
    return [_keys(PART_COLOURS, "share of each GPU's window; hover for times"), f"<div>{bars}</div>"]


def _bar(b: Breakdown, unit: str) -> str:
    parts = "".join(_part(f"{b.lane}: {label}", getattr(b, key), b.window_ns, PART_COLOURS[label], unit)
                    for label, key in gputime.PARTS)
    return f'<div class="gb"><span title="{escape(b.lane)}">{escape(b.lane)}</span><b>{parts}</b></div>'


def _facts(lines: list[str]) -> str:
    def item(line: str) -> str:
        return f'<li class="miss">{escape(line)}</li>' if line.startswith(serving.SLO_MISSED) else \
            f"<li>{escape(line)}</li>"

    return "<ul>" + "".join(item(line) for line in lines) + "</ul>"


def interference(report: Report) -> list[str]:
    """The serving facts under their heading (their tables are sections of their own)."""
    if report.interference is None:
        return []
    return ["<h2>Serving: prefill / decode interference</h2>", _facts(serving.interference_facts(report))]


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


def gpu_timeline_section(report: Report) -> list[str]:
    """One step per GPU as an SVG, the top findings outlined, and its key."""
    if report.strips is None:
        return []
    return ["<h2>GPU timeline</h2>", gpu_timeline.svg(report.strips, findings.marks(report)),
            gpu_timeline.legend_html(report.strips)]


def requests_section(report: Report, unit: str = "ms") -> list[str]:
    """The served requests' facts and their latency distributions."""
    lines = requests.facts(report, unit)
    if not lines:
        return []
    return ["<h2>Served requests</h2>", _facts(lines), requests.svg(report.requests)]


def findings_section(report: Report, unit: str = "ms") -> list[str]:
    """The summary line, then each finding as an item of a list: its headline, its detail under it."""
    rows = "".join(f'<li><b>{escape(head.split(". ", 1)[1])}</b><br><span class="note">{escape(detail)}</span></li>'
                   for head, detail in findings.items(report, unit))
    return [f"<h2>{escape(findings.summary(report))}</h2>"] + ([f"<ol>{rows}</ol>"] if rows else [])


def memory_section(report: Report, unit: str = "ms") -> list[str]:
    """The memory facts, a timeline per stage (per device without stages), then its device and stage tables."""
    if not memory.shown(report):
        return []
    zero = timeline.origin(report)
    body = ["<h2>Memory</h2>", _facts(memory.memory_facts(report.memory, zero, unit))]
    if report.memory is not None:
        body += [memory.memory_svg(report.memory, VIEW_W, zero)]
        body += [table(t) for t in memory.memory_tables(report.memory, zero, unit)]
    return body


def legend_line(report: Report) -> list[str]:
    line = sections.legend(report)
    return [f'<p class="note">{escape(line)}</p>'] if line else []


def page_header(report: Report, unit: str, when: str) -> list[str]:
    """The title, what was read, when and by which version, then the headline numbers as cards."""
    files = [escape(f) for f in report.ingest.files]
    count = f"{len(files):,} input{'s' * (len(files) != 1)}"
    listed = "no inputs" if not files else f"{count}: {', '.join(files)}" if len(files) <= FILES_SHOWN else \
        f"<details><summary>{count}: {', '.join(files[:FILES_SHOWN])}, …</summary>{', '.join(files)}</details>"
    meta = f"generated {escape(when)} by pipebubble {escape(__version__)}"
    cards = "".join(f'<div class="card{" miss" if miss else ""}"><b>{escape(value)}</b><span>{escape(label)}</span>'
                    "</div>" for value, label, miss in sections.headline(report, unit))
    return ["<header>", "<h1>pipebubble report</h1>", f'<div class="meta">{listed}</div>',
            f'<p class="meta">{meta}</p>', f'<div class="cards">{cards}</div>', "</header>"]


def render(report: Report, *, step: int | None = None, window: tuple[int, int] | None = None,
           lanes: bool = False, unit: str = "ms", top: int = TOP, when: str | None = None,
           only: str | None = None) -> str:
    """The page, its sections in ``sections.SECTIONS`` order; times in ``unit`` (the timeline's in ms), ``top``
    rows of the kernel, API and range tables, every row of the others; ``when``: the date the header shows
    (None: ``generated()``); ``only``: that one section, without the page's header (a notebook's cell)."""
    facts = sections.ingest_lines(report) + sections.job_notes(report) + pipeline.header(report, unit)
    drawn = {"facts": lambda: [_facts(facts)],
             "timeline": lambda: ["<h2>Timeline</h2>", svg(report, step, window, lanes), legend(report)]
             if report.timeline else [],
             "stage_bars": lambda: stage_bars(report, unit),
             "collectives": lambda: collective_facts(report, unit), "interference": lambda: interference(report),
             "gpu_bars": lambda: gpu_bars(report, unit), "host": lambda: host(report, unit),
             "legend": lambda: legend_line(report), "memory": lambda: memory_section(report, unit),
             "findings": lambda: findings_section(report, unit), "gpu_timeline": lambda: gpu_timeline_section(report),
             "requests": lambda: requests_section(report, unit)}
    body = page_header(report, unit, when or generated()) if only is None else []
    for kind, section in sections.walk(report, timeline.origin(report), sections.Layout(unit, top, bar_width=0)):
        if only is None or kind == only:
            body += [table(section)] if section is not None else drawn[kind]()
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>pipebubble report</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
