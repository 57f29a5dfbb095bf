"""The timeline as a grid of characters, shared by the terminal, Markdown and HTML renderers.

Each row is one stage (or one lane), each column a time bucket. A bucket shows the phase that filled most of
it, or idle when nothing did; the first cells of a pass carry its letter and micro-batch number and the rest
repeat the letter in lower case, so plain text reads without colour (``F3ffB3bbb``). This is a projection of
the report's segments onto a grid, not analysis: every number comes from the Report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipebubble.report import Report, Segment

IDLE = "·"
PHASES = {  # phase: (letter, legend text, rich style)
    "forward": ("F", "forward", "black on green3"),
    "backward": ("B", "backward", "black on dodger_blue1"),
    "weight": ("W", "weight-grad", "black on medium_purple1"),
    "prefill": ("P", "prefill", "black on dark_orange"),
    "decode": ("D", "decode", "black on cyan3"),
    "mixed": ("M", "mixed", "black on magenta"),
    "comm": ("~", "comm", "black on yellow3"),
    "other": ("o", "other", "black on grey62"),
}
IDLE_STYLE = "grey42"
LABEL_MAX = 16  # a lane name longer than this is cut from the left: its tail (stream, gpu) tells lanes apart


@dataclass(frozen=True)
class Row:
    label: str
    cells: str  # one character per column
    phases: tuple[str | None, ...]  # the phase of each column (None = idle), for colour


@dataclass(frozen=True)
class Grid:
    start_ns: int  # absolute, on the trace clock
    end_ns: int
    origin_ns: int  # where the axis reads 0
    rows: list[Row]
    axis: str  # the tick labels, aligned with the cells
    phases: list[str]  # the phases present, in legend order
    label_width: int
    numbered: bool = False  # whether any pass shown carries a micro-batch number
    chunked: bool = False  # whether numbers carry a chunk (.c)

    @property
    def column_ns(self) -> int:
        return (self.end_ns - self.start_ns) // max(len(self.axis), 1)


def origin(report: Report) -> int:
    """Time zero of the axis: the start of the pipeline window, else of the first segment, else (a job with no
    timeline, e.g. ranks matched only at their collectives) the first busy instant of any lane."""
    if report.pipeline is not None and report.pipeline.window_start_ns:
        return report.pipeline.window_start_ns
    starts = [s.start_ns for s in report.timeline] or [ln.window_start_ns for ln in report.lanes]
    return min(starts, default=0)


def select_window(report: Report, step: int | None, window: tuple[int, int] | None) -> tuple[int, int]:
    """The absolute [start, end) shown: one step's window, an offset range from the origin, or everything."""
    if step is not None:
        steps = report.pipeline.steps if report.pipeline else []
        for s in steps:
            if s.step == step:
                return s.window_start_ns, s.window_end_ns
        known = ", ".join(str(s.step) for s in steps) or "none"
        raise ValueError(f"step {step} is not in the report (steps: {known})")
    if window is not None:
        base = origin(report)
        return base + window[0], base + max(window[1], window[0] + 1)
    start = min((s.start_ns for s in report.timeline), default=0)
    return start, max((s.end_ns for s in report.timeline), default=start + 1)


def row_keys(report: Report, lanes: bool) -> list[tuple[str, object]]:
    """(label, key) per row: a segment belongs to a row by its lane (lanes=True) or its stage."""
    if lanes and any(s.lane for s in report.timeline):
        names = sorted({s.lane for s in report.timeline if s.lane}, key=_natural)
        return [(_cut(n), n) for n in names]
    stages = {st.stage for st in report.stages} | {s.stage for s in report.timeline}
    return [(f"s{i}", i) for i in sorted(stages)]


def _natural(name: str) -> list[object]:
    """Sort key that puts stream7 before stream13."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _cut(name: str) -> str:
    name = name.replace("rank", "r").replace("stream", "s")  # r0/gpu0/s13: short enough to keep the rank
    return name if len(name) <= LABEL_MAX else "…" + name[-(LABEL_MAX - 1):]


def build(report: Report, width: int, *, step: int | None = None, window: tuple[int, int] | None = None,
          lanes: bool = False) -> Grid:
    """A grid whose rows are ``label │cells│`` and fit in ``width`` characters."""
    start, end = select_window(report, step, window)
    keys = row_keys(report, lanes)
    label_width = max((len(label) for label, _ in keys), default=2)
    columns = max(width - label_width - 3, 4)  # label, space, two borders
    by_row: dict[object, list[Segment]] = {key: [] for _, key in keys}
    for seg in report.timeline:
        key = seg.lane if lanes and seg.lane else seg.stage
        if key in by_row and seg.end_ns > start and seg.start_ns < end:
            by_row[key].append(seg)
    chunked = report.pipeline is not None and report.pipeline.chunks > 1
    rows = [_row(label, by_row[key], start, end, columns, chunked) for label, key in keys]
    present = {p for row in rows for p in row.phases if p}
    base = origin(report)
    numbered = any(seg.microbatch is not None for segs in by_row.values() for seg in segs)
    return Grid(start, end, base, rows, axis(start - base, end - base, columns),
                [p for p in PHASES if p in present], label_width, numbered, chunked)


def _row(label: str, segments: list[Segment], start: int, end: int, columns: int, chunked: bool) -> Row:
    span = end - start
    edges = [start + span * i // columns for i in range(columns + 1)]
    phase_ns: list[dict[str, int]] = [{} for _ in range(columns)]
    owner: list[tuple[int, int]] = [(0, 0)] * columns  # (overlap, segment index) of the biggest segment
    for index, seg in enumerate(segments):
        first = max((seg.start_ns - start) * columns // span, 0)
        last = min((seg.end_ns - start) * columns // span, columns - 1)
        for col in range(first, last + 1):
            overlap = min(seg.end_ns, edges[col + 1]) - max(seg.start_ns, edges[col])
            if overlap > 0:
                phase_ns[col][seg.phase] = phase_ns[col].get(seg.phase, 0) + overlap
                if overlap > owner[col][0]:  # ties keep the earlier segment, so output is stable
                    owner[col] = (overlap, index)
    phases = [_winner(phase_ns[c], edges[c + 1] - edges[c]) for c in range(columns)]
    owners = [owner[c][1] if phases[c] and segments[owner[c][1]].phase == phases[c] else None
              for c in range(columns)]
    _keep_short_passes(segments, phases, owners, start, span, columns)
    return Row(label, _cells(phases, owners, segments, chunked), tuple(phases))


def _keep_short_passes(segments: list[Segment], phases: list[str | None], owners: list[int | None], start: int,
                       span: int, columns: int) -> None:
    """A compute pass shorter than its bucket still marks the bucket it starts in, unless other compute won
    there: zoomed out, passes between long communication waits would otherwise vanish."""
    for index, seg in enumerate(segments):
        col = min(max((seg.start_ns - start) * columns // span, 0), columns - 1)
        if seg.phase not in ("comm", "other") and phases[col] in (None, "comm", "other"):
            phases[col], owners[col] = seg.phase, index


def _winner(tally: dict[str, int], bucket: int) -> str | None:
    """The phase covering most of the bucket, or None when idle covers more than any phase."""
    idle = bucket - min(sum(tally.values()), bucket)
    best = max(sorted(tally), key=lambda p: tally[p], default=None)
    return best if best is not None and tally[best] >= idle else None


def _cells(phases: list[str | None], owners: list[int | None], segments: list[Segment], chunked: bool) -> str:
    """Characters: a pass's first cells read ``F12``, the rest ``f``; a lone letter when the label won't fit."""
    out: list[str] = []
    col = 0
    while col < len(phases):
        phase = phases[col]
        if phase is None:
            out.append(IDLE)
            col += 1
            continue
        run = col + 1
        while run < len(phases) and phases[run] == phase and owners[run] == owners[col]:
            run += 1
        seg = segments[owners[col]] if owners[col] is not None else None
        out.append(_run_text(phase, seg, run - col, chunked))
        col = run
    return "".join(out)


def _run_text(phase: str, seg: Segment | None, length: int, chunked: bool) -> str:
    letter = PHASES.get(phase, PHASES["other"])[0]
    label = letter + _number(seg, chunked) if seg is not None else letter
    if len(label) > length:
        label = letter
    return (label + letter.lower() * length)[:length]


def _number(seg: Segment, chunked: bool) -> str:
    """``3`` for micro-batch 3; ``3.1`` for its pass through chunk 1 when stages hold several chunks."""
    if seg.microbatch is None:
        return ""
    return f"{seg.microbatch}" + (f".{seg.chunk}" if chunked and seg.chunk is not None else "")


def axis(start: int, end: int, columns: int) -> str:
    """Tick labels in ms (relative to the origin) placed at their columns, none overlapping."""
    span = max(end - start, 1)
    tick = _nice_step(span * 12 // max(columns, 1))  # a label every ~12 columns
    line = [" "] * columns
    first = -(-start // tick) * tick
    for t in range(first, end, tick):
        col = (t - start) * columns // span
        text = "|" + _ms(t, tick)
        if col + len(text) <= columns and all(c == " " for c in line[max(col - 1, 0):col + len(text)]):
            line[col:col + len(text)] = text
    return "".join(line)


def _nice_step(raw: int) -> int:
    """The smallest 1, 2 or 5 × 10^k ns at least ``raw``."""
    scale = 1
    while True:
        for mult in (1, 2, 5):
            if mult * scale >= raw:
                return mult * scale
        scale *= 10


def _ms(ns: int, tick: int) -> str:
    decimals = max(0, 6 - len(str(tick)) + 1) if tick < 1_000_000 else 0
    return f"{ns / 1e6:.{decimals}f}"


def legend(grid: Grid) -> str:
    parts = [f"{PHASES[p][0]} {PHASES[p][1]}" for p in grid.phases]
    parts.append(f"{IDLE} idle")
    numbers = "a capital starts a pass; "
    if grid.numbered:
        numbers = "F3 = micro-batch 3 starts" + (", F3.1 on chunk 1; " if grid.chunked else "; ")
    return "   ".join(parts) + f"   ({numbers}one column = {_ms(grid.column_ns, 1000)} ms; axis in ms)"


def plain_lines(grid: Grid) -> list[str]:
    """The grid as plain text lines, for Markdown code blocks and the no-colour terminal."""
    pad = grid.label_width
    lines = [f"{row.label:>{pad}} │{row.cells}│" for row in grid.rows]
    lines.append((" " * (pad + 2) + grid.axis).rstrip())
    return lines
