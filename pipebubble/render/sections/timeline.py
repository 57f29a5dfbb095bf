"""The timeline as a grid of characters, shared by the terminal, Markdown and HTML renderers.

Each row is one stage (or one lane), each column a time bucket. A bucket shows the phase that filled most of
it, or idle when nothing did; a pass starts with its capital letter and the rest repeats it in lower case, so
plain text reads without colour. When every pass has room, its first cells carry its micro-batch number too
(``F3ffB3bbb``); when some would not, the numbers move to a line under the row, on every k-th pass, k the
fewest that keeps them apart, and the legend says k and the ``--window`` that would show them all. This is a
projection of the report's segments onto a grid, not analysis: every number comes from the Report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipebubble.render.cells import ms, shorten
from pipebubble.report import Report, Segment, StepResult

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
LABEL_MAX = 16  # a lane name longer than this is cut in the middle: its rank first, its tail (stream, tid) last
EVERY_MAX = 12  # the most passes between two numbered ones on a number line
SKIP_SHARE = 0.1  # the share of its numbers a number line may leave out where two would touch
ZOOM_TRIES = 6  # windows tried, widest first, for the --window that numbers every pass


@dataclass(frozen=True)
class Row:
    label: str
    cells: str  # one character per column
    phases: tuple[str | None, ...]  # the phase of each column (None = idle), for colour
    numbers: str = ""  # the micro-batch numbers under the passes they start (blank: in the cells, or none)


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
    every: int = 0  # 0: numbers in the cells; k: on a line under each row, every k-th pass
    gaps: bool = False  # whether a number line left out a number that would have touched the one before
    zoom: tuple[int, int] | None = None  # a --window (ns from the origin) narrow enough to number every pass
    sampled: tuple[int, int] | None = None  # (step shown, steps): the steps lie apart, so one is shown

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
        return _within(report, window)
    first = sampled_step(report)
    if first is not None:
        return first.window_start_ns, first.window_end_ns
    start = min((s.start_ns for s in report.timeline), default=0)
    return start, max((s.end_ns for s in report.timeline), default=start + 1)


def _within(report: Report, window: tuple[int, int]) -> tuple[int, int]:
    """``window`` (ns from the origin) as absolute times; a window that ends where or before it starts, or
    that shows none of the timeline's segments, raises ValueError saying where the timeline lies."""
    shown = f"--window {window[0] / 1e6:g}:{window[1] / 1e6:g}"
    if window[1] <= window[0]:
        raise ValueError(f"{shown} ends before it starts (or where it starts)")
    base = origin(report)
    start, end = base + window[0], base + window[1]
    if report.timeline:
        first, last = min(s.start_ns for s in report.timeline), max(s.end_ns for s in report.timeline)
        if end <= first or start >= last:
            raise ValueError(f"{shown} lies outside the timeline, which runs from {ms(first - base)} to "
                             f"{ms(last - base)} ms")
    return start, end


SAMPLED = 3  # steps whose span is this many times their windows' sum lie apart (a sample of a job's steps)


def sampled_step(report: Report) -> StepResult | None:
    """The first step, where the pipeline's steps lie apart (a profiler sampling some of a job's steps): the
    whole span would draw each as a column or two, so the timeline shows one step."""
    steps = report.pipeline.steps if report.pipeline else []
    if len(steps) < 2:
        return None
    span = max(s.window_end_ns for s in steps) - min(s.window_start_ns for s in steps)
    windows = sum(s.window_end_ns - s.window_start_ns for s in steps)
    return steps[0] if windows and span > SAMPLED * windows else None


def row_keys(report: Report, lanes: bool) -> list[tuple[str, object]]:
    """(label, key) per row: a segment belongs to a row by its lane (lanes=True) or its stage."""
    if lanes and any(s.lane for s in report.timeline):
        names = sorted({s.lane for s in report.timeline if s.lane}, key=_natural)
        return list(zip(lane_labels(names), names, strict=True))
    stages = {st.stage for st in report.stages} | {s.stage for s in report.timeline}
    return [(f"s{i}", i) for i in sorted(stages)]


def _natural(name: str) -> list[object]:
    """Sort key that puts stream7 before stream13."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def lane_labels(names: list[str]) -> list[str]:
    """Row labels for lanes: ``rank0/gpu0/stream7`` reads ``r0/gpu0/s7``; one longer than LABEL_MAX keeps its
    rank and its last part (``r0/…/tid12565``), or is cut in the middle; a label two lanes would share grows
    until they differ."""
    short = [name.replace("rank", "r").replace("stream", "s") for name in names]
    for limit in range(LABEL_MAX, max(map(len, short), default=0) + 1):
        labels = [_cut(name, limit) for name in short]
        if len(set(labels)) == len(set(short)):
            return labels
    return short


def _cut(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    parts = name.split("/")
    ends = f"{parts[0]}/…/{parts[-1]}"
    return ends if len(parts) > 2 and len(ends) <= limit else shorten(name, limit)


def build(report: Report, width: int, *, step: int | None = None, window: tuple[int, int] | None = None,
          lanes: bool = False) -> Grid:
    """A grid whose rows are ``label │cells│`` (each perhaps with its number line) and fit in ``width``."""
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
    rows, every, gaps = _layout(keys, by_row, start, end, columns, chunked)
    present = {p for row in rows for p in row.phases if p}
    base = origin(report)
    numbered = any(seg.microbatch is not None for segs in by_row.values() for seg in segs)
    zoom = _zoom(keys, by_row, start, end, columns, chunked, every, gaps) if numbered and every else None
    first = sampled_step(report) if step is None and window is None else None
    return Grid(start, end, base, rows, axis(start - base, end - base, columns),
                [p for p in PHASES if p in present], label_width, numbered, chunked, every if numbered else 0,
                gaps and numbered, None if zoom is None else (zoom[0] - base, zoom[1] - base),
                None if first is None else (first.step, len(report.pipeline.steps)))


def _layout(keys: list[tuple[str, object]], by_row: dict[object, list[Segment]], start: int, end: int,
            columns: int, chunked: bool) -> tuple[list[Row], int, bool]:
    """The rows; k: 0 when every pass has room for its number, else every how many passes a number line
    numbers one; and whether a number line left some out."""
    runs = [_runs(by_row[key], start, end, columns) for _, key in keys]
    segments = [by_row[key] for _, key in keys]
    inline = all(_all_fit(r, segs, chunked) for r, segs in zip(runs, segments, strict=True))
    starts = [_starts(r, segs, chunked) for r, segs in zip(runs, segments, strict=True)]
    every, gaps = (0, False) if inline else _every(starts, columns)
    rows = [_row(label, r, segs, chunked, inline, every, columns)
            for r, segs, (label, _) in zip(runs, segments, keys, strict=True)]
    return rows, every, gaps


def _zoom(keys: list[tuple[str, object]], by_row: dict[object, list[Segment]], start: int, end: int, columns: int,
          chunked: bool, every: int, gaps: bool) -> tuple[int, int] | None:
    """The widest window from ``start``, 1, 2 or 5 × 10^k ns long, at most 1/``every`` of the view (half when
    only a few numbers were left out), in which every pass shown gets its number (None: numbers are on every
    pass already, or none of ZOOM_TRIES windows does it)."""
    if every == 1 and not gaps:
        return None
    length = max((end - start) // max(every, 2), 1)
    nice = sorted({m * 10**k for k in range(len(str(length))) for m in (1, 2, 5) if m * 10**k <= length})
    for size in nice[::-1][:ZOOM_TRIES]:
        inside = {key: [s for s in segs if s.end_ns > start and s.start_ns < start + size]
                  for key, segs in by_row.items()}
        _, k, left_out = _layout(keys, inside, start, start + size, columns, chunked)
        if k == 0 or (k == 1 and not left_out):
            return start, start + size
    return None


#: A run of columns one segment (or none) owns: (first column, length, phase, index into the row's segments).
Run = tuple[int, int, str | None, int | None]


def _runs(segments: list[Segment], start: int, end: int, columns: int) -> list[Run]:
    phases, owners = _buckets(segments, start, end, columns)
    runs: list[Run] = []
    col = 0
    while col < columns:
        stop = col + 1
        while stop < columns and phases[stop] == phases[col] and owners[stop] == owners[col]:
            stop += 1
        runs.append((col, stop - col, phases[col], owners[col] if phases[col] else None))
        col = stop
    return runs


def _passes(runs: list[Run], segments: list[Segment]) -> dict[int, Run]:
    """Each numbered pass shown, by segment index: its first run."""
    found: dict[int, Run] = {}
    for run in runs:
        if run[3] is not None and segments[run[3]].microbatch is not None:
            found.setdefault(run[3], run)
    return found


def _all_fit(runs: list[Run], segments: list[Segment], chunked: bool) -> bool:
    """Whether every numbered pass shown has room for its letter and number in its first run."""
    return all(1 + len(_number(segments[i], chunked)) <= run[1] for i, run in _passes(runs, segments).items())


def _starts(runs: list[Run], segments: list[Segment], chunked: bool) -> list[tuple[int, str]]:
    """(column, number) of each numbered pass shown, left to right."""
    return sorted((run[0], _number(segments[i], chunked)) for i, run in _passes(runs, segments).items())


def _every(rows: list[list[tuple[int, str]]], columns: int) -> tuple[int, bool]:
    """The fewest passes k between two numbered ones that leaves out (a number touching the one before it) at
    most SKIP_SHARE of the numbers it would write, and whether it leaves out any (EVERY_MAX when no k does)."""
    for k in range(1, EVERY_MAX + 1):
        tried = sum(len(starts[::k]) for starts in rows)
        written = sum(len(_placed(starts[::k], columns)) for starts in rows)
        if tried - written <= SKIP_SHARE * tried or k == EVERY_MAX:
            return k, written < tried
    return EVERY_MAX, True  # not reached: the loop returns at EVERY_MAX


def _placed(starts: list[tuple[int, str]], columns: int) -> list[tuple[int, str]]:
    """The numbers that fit, left to right, each a blank after the one before."""
    placed, free = [], 0
    for col, text in starts:
        if col >= free and col + len(text) <= columns:
            placed.append((col, text))
            free = col + len(text) + 1
    return placed


def _number_line(starts: list[tuple[int, str]], every: int, columns: int) -> str:
    line = [" "] * columns
    for col, text in _placed(starts[::every], columns):
        line[col:col + len(text)] = text
    return "".join(line).rstrip()


def _row(label: str, runs: list[Run], segments: list[Segment], chunked: bool, inline: bool, every: int,
         columns: int) -> Row:
    cells, seen, previous = [], set(), None
    for _, length, phase, owner in runs:
        # a pass starts where its segment first shows, or where a phase no one segment owns begins; a run that
        # carries on a pass or a phase (cut by a narrower segment) is lower case
        starts = owner not in seen if owner is not None else phase != previous
        seg = segments[owner] if owner is not None and inline else None
        cells.append(IDLE * length if not phase else _run_text(phase, seg, length, chunked, starts))
        seen.add(owner)
        previous = phase
    phases = tuple(phase for _, length, phase, _ in runs for _ in range(length))
    numbers = _number_line(_starts(runs, segments, chunked), every, columns) if every else ""
    return Row(label, "".join(cells), phases, numbers)


def _buckets(segments: list[Segment], start: int, end: int, columns: int) -> tuple[list[str | None],
                                                                                   list[int | None]]:
    """The phase of each column and the index of the segment that owns it (None: idle, or no one segment)."""
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
    return phases, owners


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


def _run_text(phase: str, seg: Segment | None, length: int, chunked: bool, starts: bool = True) -> str:
    letter = PHASES.get(phase, PHASES["other"])[0]
    if not starts:
        return letter.lower() * length
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


def tick_label(ns: int, tick: int) -> str:
    """An axis label in ms with the digits a ``tick`` spacing needs (``250``, ``0.5``), no separators."""
    return _ms(ns, tick)


def _ms(ns: int, tick: int) -> str:
    decimals = max(0, 6 - len(str(tick)) + 1) if tick < 1_000_000 else 0
    return f"{ns / 1e6:.{decimals}f}"


def legend(grid: Grid) -> str:
    parts = [f"{PHASES[p][0]} {PHASES[p][1]}" for p in grid.phases]
    parts.append(f"{IDLE} idle")
    numbers = "a capital starts a pass; "
    if grid.numbered and not grid.every:
        numbers = "F3 = micro-batch 3 starts" + (", F3.1 on chunk 1; " if grid.chunked else "; ")
    elif grid.numbered:
        which = ("every pass" if grid.every == 1 else f"every {_ordinal(grid.every)} pass") + \
            (" with room" if grid.gaps else "")
        numbers = ("a capital starts a pass; the number under it is its micro-batch"
                   + (" (.1: chunk 1)" if grid.chunked else "") + f", on {which}; ")
    text = "   ".join(parts) + f"   ({numbers}one column = {_ms(grid.column_ns, 1000)} ms; axis in ms)"
    if grid.sampled is not None:
        text += f"; step {grid.sampled[0]} of {grid.sampled[1]} steps that lie apart (--step N for another)"
    if grid.zoom is not None:
        text += f"; --window {grid.zoom[0] / 1e6:g}:{grid.zoom[1] / 1e6:g} numbers every pass in its first" \
                f" {(grid.zoom[1] - grid.zoom[0]) / 1e6:g} ms"
    return text


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def plain_lines(grid: Grid) -> list[str]:
    """The grid as plain text lines, for Markdown code blocks and the no-colour terminal."""
    pad = grid.label_width
    lines = [line for row in grid.rows for line in [f"{row.label:>{pad}} │{row.cells}│",
                                                     *([" " * (pad + 2) + row.numbers] if row.numbers else [])]]
    lines.append((" " * (pad + 2) + grid.axis).rstrip())
    return lines
