"""The job's timeline per GPU (``breakdown.strips.Strips``): one step, a row per GPU, each part of it compute,
exposed communication, exposed memory traffic or idle by cause; as plain text lines and as inline SVG, with the
top findings marked on their GPUs' rows.

Rows share one time axis (from the earliest row's start; text in ms, the SVG's axis in the unit its ticks need),
so a GPU that started its step late shows it. A mark says its finding's number and kind in words; text keeps
the whole marks that fit, the SVG wraps them between words in its right margin, never cutting a word.
Text: each column shows the class that filled most of it (ties: the first in ``CLASSES`` order), in plain
characters that survive NO_COLOR and pipes: ``█`` compute, ``▓`` comm, ``░`` memory, and idle by its cause:
``h`` host launch (the host launched late), ``s`` sync (the host was in a synchronize), ``p`` peer (it was in a
collective or send/receive), ``·`` other (a dependency, or before or after the GPU's work); a blank is outside
the GPU's step. SVG: each bin a stack of its classes' shares, neighbouring bins of the same stack drawn as one,
in the colours the HTML page uses for the GPU bars and the waits. Only a projection of the bins onto the
columns: every number is the strips' own.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from pipebubble.render import axis
from pipebubble.render.cells import ms, share, shorten
from pipebubble.render.sections import timeline
from pipebubble.report.strips import CLASSES, Strip, Strips, bin_edges

#: class: (character, legend text, colour). Colours: ``html.PART_COLOURS`` for compute, exposed comm and
#: memory, ``html.WAIT_COLOURS`` host, sync and collective for the causes, its idle grey for other.
LOOK = {
    "compute": ("█", "compute", "#0072b2"),
    "comm": ("▓", "comm", "#f0e442"),
    "memory": ("░", "memory", "#56b4e9"),
    "sync_stall": ("s", "idle: sync stall", "#999933"),
    "blocking_copy": ("c", "idle: blocking copy", "#117733"),
    "allocator": ("a", "idle: allocator", "#44aa99"),
    "startup": ("u", "idle: start-up", "#661100"),
    "cpu_ops": ("o", "idle: CPU-bound (operators)", "#882255"),
    "python": ("y", "idle: CPU-bound (Python / untraced)", "#cc6677"),
    "launch": ("l", "idle: launch overhead", "#ddcc77"),
    "peer": ("p", "idle: waiting for a peer", "#aa4499"),
    "data_loader": ("D", "idle: data loader", "#332288"),
    "dependency": ("d", "idle: dependency", "#88ccee"),
    "unknown": ("·", "idle: unknown", "#bbbbbb"),
}
assert tuple(LOOK) == CLASSES  # a look for every class of the strips
OUTSIDE = " "  # a column outside the GPU's step
TEXT_ROWS = 64  # GPU rows in text; the SVG draws SVG_ROWS
SVG_ROWS = 256
MIN_BAR = 20  # the fewest columns of a bar: a mark's label is cut before the bar gets narrower
MARK = "◀ "
MARK_COLOUR = "#d55e00"
EVERY = "markdown, html or json list every GPU"
VIEW_W, LABEL_W, MARK_W, ROW_H, BAR_H, TOP_H = 1000, 120, 160, 20, 14, 20  # SVG units
AXIS_H = axis.TICK + 11 + axis.LINE_H + 8  # under the rows: the x-axis' ticks, labels and title
MARK_CHARS = 32  # the most characters of a line of a mark's words in the right margin
LABEL_CHARS = 16  # a lane name's characters in the SVG's label column; its full name is its title
STEPS = 2  # a class's share of a bin is drawn to 1/STEPS of an SVG unit: stacks alike at that are merged

Marks = Sequence[tuple[str | int, str]]


def text(strips: Strips, width: int, marks: Marks = (), rows: int = TEXT_ROWS) -> list[str]:
    """The timeline as plain lines at most ``width`` wide: a title, a row per GPU (``rows`` at most, every
    marked one among them), the axis, the legend, and how many GPUs are not shown."""
    if not strips.rows:
        return []
    shown, more = _shown(strips, marks, rows)
    start, end = _view(strips)
    labels = timeline.lane_labels([s.lane for s in shown])
    pad = max(map(len, labels))
    notes = [_marked(s, marks) for s in shown]
    room = width - pad - 3
    mark_w = min(max((len(MARK) + 1 + len(n) for n in notes if n), default=0), max(room - MIN_BAR, 0))
    columns = max(room - mark_w, 4)
    lines = [_title(strips, start, end, columns)]
    for label, strip, note in zip(labels, shown, notes, strict=True):
        tail = " " + MARK + _clip(note, mark_w - len(MARK) - 1) if note and mark_w > len(MARK) + 1 else ""
        lines.append(f"{label:>{pad}} │{_cells(strip, start, end, columns)}│{tail}".rstrip())
    lines.append((" " * (pad + 2) + timeline.axis(0, end - start, columns)).rstrip())
    lines += _legend_lines(width, _shown_classes(strips))
    if more:
        lines.append(f"… {more:,} more GPU{'s' * (more != 1)} not shown ({EVERY})")
    if strips.missing:
        lines.append(f"{len(strips.missing):,} GPU{'s' * (len(strips.missing) != 1)} without this step not shown")
    return lines


def _clip(note: str, chars: int) -> str:
    """``note`` in at most ``chars`` characters: the whole marks that fit, else the whole words of the first,
    then ``…``; never a word cut."""
    if len(note) <= chars:
        return note
    for sep in (", ", " "):
        kept = ""
        for piece in note.split(sep):
            if len(kept) + len(sep) * bool(kept) + len(piece) > chars - 1:
                break
            kept = f"{kept}{sep}{piece}" if kept else piece
        if kept:
            return kept.rstrip(",;:") + "…"
    return ""


def _title(strips: Strips, start: int, end: int, columns: int) -> str:
    which = "the whole trace (no steps)" if strips.step is None else f"step {strips.step}"
    return f"GPU timeline, {which}: {ms(end - start)} ms, one column = {ms((end - start) / columns)} ms"


def _shown(strips: Strips, marks: Marks, rows: int) -> tuple[list[Strip], int]:
    """The first ``rows`` GPUs, every marked one among them, in the strips' order; and how many are left out."""
    marked = {i for i, s in enumerate(strips.rows) if _marked(s, marks)}
    rest = [i for i in range(len(strips.rows)) if i not in marked][:max(rows - len(marked), 0)]
    shown = [strips.rows[i] for i in sorted(marked.union(rest))]
    return shown, len(strips.rows) - len(shown)


def _marked(strip: Strip, marks: Marks) -> str:
    """The labels of the marks on this GPU (a mark names its lane, or its rank as an int), joined."""
    return ", ".join(label for key, label in marks if key == strip.lane or (isinstance(key, int)
                                                                             and key == strip.rank))


def _view(strips: Strips) -> tuple[int, int]:
    """The time shown: from the earliest row's start to the latest row's end (at least 1 ns)."""
    start = min(s.start_ns for s in strips.rows)
    return start, max(max(s.end_ns for s in strips.rows), start + 1)


def _bins(strip: Strip) -> list[tuple[int, int, list[int]]]:
    """(start, end, ns per class) of each bin."""
    n = len(strip.bins)
    edges = [bin_edges(strip.start_ns, strip.end_ns, i, n) for i in range(n + 1)]
    return [(edges[i], edges[i + 1], ns) for i, ns in enumerate(strip.bins)]


def _cells(strip: Strip, start: int, end: int, columns: int) -> str:
    """One character per column: the class with the most time in it (each bin's time prorated to the part
    of it the column covers); blank where the column holds none of the GPU's step."""
    tally = [[0.0] * len(CLASSES) for _ in range(columns)]
    span = end - start
    for bs, be, ns in _bins(strip):
        if be <= bs:
            continue
        first = (bs - start) * columns // span
        last = min((be - 1 - start) * columns // span, columns - 1)
        for col in range(first, last + 1):
            lo, hi = start + span * col / columns, start + span * (col + 1) / columns
            part = (min(be, hi) - max(bs, lo)) / (be - bs)
            tally[col] = [t + part * x for t, x in zip(tally[col], ns, strict=True)]
    return "".join(_char(t) for t in tally)


def _char(tally: list[float]) -> str:
    if not any(tally):
        return OUTSIDE
    return LOOK[CLASSES[tally.index(max(tally))]][0]


def _shown_classes(strips: Strips) -> list[str]:
    """The classes the strips hold some time of (the work classes always), in ``CLASSES`` order: the legend
    names those."""
    held = {k for strip in strips.rows for b in strip.bins for k, ns in enumerate(b) if ns}
    return [c for k, c in enumerate(CLASSES) if k < 3 or k in held]


def _legend_lines(width: int, shown: list[str]) -> list[str]:
    """The legend's items (the classes ``shown``), as many to a line as fit in ``width``."""
    items = [f"{LOOK[c][0]} {LOOK[c][1]}" for c in shown] + ["blank: outside the step", "axis in ms"]
    lines, line = [], ""
    for item in items:
        if line and len(line) + 3 + len(item) > width:
            lines.append(line)
            line = ""
        line = f"{line}   {item}" if line else item
    return [*lines, line]


def svg(strips: Strips, marks: Marks = (), rows: int = SVG_ROWS) -> str:
    """The timeline as one inline SVG (it scales to the page): a row per GPU (``rows`` at most, every marked
    one among them) along a y-axis, each bin a stack of its classes with its times on hover, the marked rows
    outlined and their findings named in words in the right margin (wrapped between words, the row as tall as
    they need), an x-axis of the time from the view's start with its unit, and a note of the GPUs not shown.
    Empty without rows."""
    if not strips.rows:
        return ""
    shown, more = _shown(strips, marks, rows)
    start, end = _view(strips)
    notes = [_mark_lines(strip, marks) for strip in shown]
    right = VIEW_W - (_margin(notes) if any(notes) else 10)
    tops = [TOP_H]
    for lines in notes:
        tops.append(tops[-1] + ROW_H + axis.LINE_H * max(len(lines) - 1, 0))
    bottom = tops[-1]
    height = bottom + AXIS_H + (ROW_H if more or strips.missing else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {VIEW_W} {height}" width="100%"'
           f' preserveAspectRatio="xMinYMin meet" role="img" aria-label="GPU timeline">',
           f'<text x="4" y="14">{escape(_title(strips, start, end, right - LABEL_W))}</text>']
    for strip, y, lines in zip(shown, tops, notes, strict=False):
        out.append(f'<text x="4" y="{y + BAR_H - 2}"><title>{escape(strip.lane)}</title>'
                   f'{escape(shorten(strip.lane, LABEL_CHARS))}</text>')
        out += _stacks(strip, start, end, right, y)
        if lines:
            out.append(_outline(strip, _marked(strip, marks), lines, start, end, right, y))
    out += _axes(strips, start, end, right, bottom)
    if more or strips.missing:
        left_out = f"{more:,} more GPUs not shown ({EVERY})" if more else ""
        without = f"{len(strips.missing):,} GPUs without this step not shown" if strips.missing else ""
        words = "; ".join(w for w in (left_out, without) if w)
        out.append(f'<text x="4" y="{height - 6}">{escape(words)}</text>')
    return "\n".join([*out, "</svg>"])


def _mark_lines(strip: Strip, marks: Marks) -> list[str]:
    """The marks on this GPU as lines of the margin: one a mark, a long one wrapped between its words."""
    labels = [label for key, label in marks if key == strip.lane or (isinstance(key, int) and key == strip.rank)]
    return [line for label in labels for line in axis.wrap(label, MARK_CHARS)]


def _margin(notes: list[list[str]]) -> int:
    """The right margin's width: room for the longest line of a mark (at most MARK_CHARS characters, but for
    a single longer word), at least MARK_W."""
    longest = max((len(line) for lines in notes for line in lines), default=0)
    return max(MARK_W, round(axis.width("x" * longest)) + 12)


def _x(t: float, start: int, end: int, right: int) -> float:
    return LABEL_W + (right - LABEL_W) * (t - start) / max(end - start, 1)


def _stacks(strip: Strip, start: int, end: int, right: int, y: int) -> list[str]:
    """A stack per run of bins whose classes' shares draw alike, the classes top down in ``CLASSES`` order."""
    runs: list[tuple[int, int, tuple[int, ...], list[int]]] = []  # start, end, drawn heights, ns per class
    for bs, be, ns in _bins(strip):
        if be <= bs:
            continue
        drawn = tuple(round(STEPS * BAR_H * x / (be - bs)) for x in ns)
        if runs and runs[-1][1] == bs and runs[-1][2] == drawn:
            last = runs[-1]
            runs[-1] = (last[0], be, drawn, [a + b for a, b in zip(last[3], ns, strict=True)])
        else:
            runs.append((bs, be, drawn, list(ns)))
    out = []
    for rs, re_, drawn, ns in runs:
        x0, x1 = _x(rs, start, end, right), _x(re_, start, end, right)
        top = float(y)
        for cls, h, part in zip(CLASSES, drawn, ns, strict=True):
            if not h:
                continue
            title = (f"{strip.lane}: {LOOK[cls][1]} {ms(part)} ms ({share(part, re_ - rs)}) of"
                     f" {ms(rs - start)}–{ms(re_ - start)} ms")
            out.append(f'<rect x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 0.5):.1f}" height="{h / STEPS}"'
                       f' fill="{LOOK[cls][2]}"><title>{escape(title)}</title></rect>')
            top += h / STEPS
    return out


def _outline(strip: Strip, note: str, lines: list[str], start: int, end: int, right: int, y: int) -> str:
    """A marked row: an outline around its step and its marks' words in the right margin, a line each; the
    whole ``note`` in its tooltip."""
    x0, x1 = _x(strip.start_ns, start, end, right), _x(strip.end_ns, start, end, right)
    words = "".join(axis.text(right + 6, y + BAR_H - 2 + i * axis.LINE_H, line, "start", MARK_COLOUR)
                    for i, line in enumerate(lines))
    return (f'<g><title>{escape(f"{strip.lane}: {note}")}</title><rect x="{x0 - 1:.1f}" y="{y - 1}"'
            f' width="{x1 - x0 + 2:.1f}" height="{BAR_H + 2}" fill="none" stroke="{MARK_COLOUR}"'
            f' stroke-width="2"/>{words}</g>')


def _axes(strips: Strips, start: int, end: int, right: int, bottom: int) -> list[str]:
    """The y-axis (a GPU a row, named at its left) and the x-axis: the time from the view's start."""
    title = f"time from the {'window' if strips.step is None else 'step'}'s earliest start on a GPU"
    scale = axis.time_scale(0, end - start, axis.count_for(right - LABEL_W))
    return [axis.line(LABEL_W, TOP_H - 2, LABEL_W, bottom),
            *axis.x_axis(scale, lambda t: _x(start + t, start, end, right), bottom, LABEL_W, right, title, VIEW_W)]


def legend_html(strips: Strips) -> str:
    """The SVG's key (the classes the strips hold), as the HTML page's legends are written."""
    items = "".join(f'<span><i style="background:{LOOK[c][2]}"></i>{escape(LOOK[c][1])}</span>'
                    for c in _shown_classes(strips))
    return f'<p class="legend">{items} (share of each bin; hover for times)</p>'
