"""Rich terminal output: header, timeline, stage / wait / what-if tables, collectives, serving facts, GPU time,
kernels, host, lanes.

``renderable`` builds rich renderables; ``render`` prints them into a recording console and returns the text,
so what the terminal shows and what the golden tests pin are the same characters. Lines of prose are folded
here (``wrap``), not by rich, so that a number never parts from its unit.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipebubble.render import cells, sections
from pipebubble.render.choices import TOP
from pipebubble.render.sections import Table as Section
from pipebubble.render.sections import (
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
from pipebubble.report import Report

NARROW = 100  # below this width the utilization bars get shorter
NO_BARS = 80  # and below this, the terminal has no room for them
TERMINAL_LANES = 200  # lane rows in the terminal; every lane is in the documents and the JSON
TERMINAL_RANKS = 64  # rank rows of the collectives table (the latest first); every rank is in the documents
TERMINAL_GPUS = 64  # GPU rows of the GPU time and idle tables; every GPU is in the documents and the CSV
TERMINAL_STEPS = 32  # rows of the per-step GPU time table (the first GPUs' steps)
INDENT = "  "  # a folded line's continuation
# long names, cut in the middle with an ellipsis (the end tells "interleaved_1f1b v=2" from "... v=4")
CUT = frozenset({"before", "after", "change", "call", "kernel", "range", "schedule"})
FOLD = frozenset({"lane", "gpu"})  # lane names: cut in the middle only as far as they stay apart, else folded
FOLD_MIN = 16  # the fewest columns a lane name is cut to
MIN_CUT = 12  # the fewest columns a name is cut to
CUT_WANT = 20  # the columns a name keeps before the table leaves out its least useful columns
# a kernel's short name (at most 80 characters) keeps this many first, before it is cut to CUT_WANT: the table
# leaves out its least useful columns for it; a wider terminal gives the name all the rest
WANT = {"kernel": 40}
GAP = 3  # columns between two table columns: padding, the (blank) rule, padding
NARROW_GAP = 2  # the same without the left padding, for a table that would not fit otherwise
# The pieces a line folds between: a number with the word after it (its unit) and the word before it (what it
# counts) stays whole ("step 360.05 ms,", "comm 0.4%,", "p=4 stages,"); anything else is a word. Each piece
# keeps the blanks after it.
ATOM = re.compile(r"(?:[^\s\d,;]+ +)?\S*\d\S*(?:(?<=\d) +[^\s\d]\S*)?\s*|\S+\s*")
CLAUSE_FILL = 2 / 3  # fold at a clause end (", " or "; ") if that leaves the line at least this full


def wrap(line: str, width: int) -> str:
    """``line`` folded to ``width`` columns, at a clause end where one leaves the line full enough, else
    between pieces (``ATOM``), so a number never parts from its unit; continuation lines are indented. A piece
    wider than a line is left for rich to fold."""
    if len(line) <= width:
        return line
    done: list[str] = []
    pieces: list[str] = []
    for atom in ATOM.findall(line):
        while pieces and len("".join([*pieces, atom]).rstrip()) > width - (len(INDENT) if done else 0):
            cut = _fold_at(pieces, width - (len(INDENT) if done else 0))
            done.append("".join(pieces[:cut]).rstrip())
            pieces = pieces[cut:]
        pieces.append(atom)
    done.append("".join(pieces).rstrip())
    return "\n".join([done[0], *(INDENT + rest for rest in done[1:])])


def _fold_at(pieces: list[str], limit: int) -> int:
    """How many of ``pieces`` stay on the line: up to the last clause end that fills CLAUSE_FILL of it, else all."""
    length, cut = 0, len(pieces)
    for i, piece in enumerate(pieces[:-1], 1):
        length += len(piece)
        if piece.rstrip().endswith((",", ";")) and length >= limit * CLAUSE_FILL:
            cut = i
    return cut


def prose(lines: list[str], width: int, style: str = "") -> Text:
    """Lines of facts as one Text, each folded by ``wrap``."""
    return Text("\n".join(wrap(line, width) for line in lines), style=style)


def table(section: Section, width: int) -> RenderableType:
    # the title is prose above the table (rich would fold it to the table's width, mid-phrase)
    fitted = fit(section, width)
    section = fitted.section
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False,
                padding=(0, 1) if fitted.gap == GAP else (0, 1, 0, 0))
    for i, col in enumerate(section.columns):
        # names arrive cut to their width (in the middle); only a lane name too long even so folds
        out.add_column(col, justify="right" if i in section.numeric else "left", no_wrap=_kind(col) != "key",
                       overflow="fold", max_width=fitted.widths[i])
    for row in section.rows:
        out.add_row(*row)
    title = prose([section.title], width, "italic")
    left_out = [f"not shown at {width} columns: {', '.join(fitted.dropped)} (a wider --width, markdown or html"
                " shows them)"] if fitted.dropped else []
    notes = [*sections.footnotes(section), *left_out]
    return Group(title, out, *([prose(notes, width, "dim")] if notes else []))


@dataclass(frozen=True)
class Fit:
    """A table as it fits: its columns (headers perhaps stacked, names cut in the middle), those left out, the
    blanks between two columns and each column's widest (None: its widest cell)."""

    section: Section
    dropped: list[str]
    gap: int = GAP
    widths: tuple[int | None, ...] = ()


def fit(section: Section, width: int) -> Fit:
    """``section`` as it fits ``width`` columns without cutting a number or wrapping a row: as it is when it
    fits; else with names cut in the middle, down to CUT_WANT; then also with headers of several words stacked
    ("total" over "ms"), the gap between columns narrowed and the table's least useful columns left out
    (``Table.drop``, named in the list); then names cut to MIN_CUT and lane names to the fewest columns that
    keep them apart; only then the rightmost columns. A lane name that fits none of that folds. Before all of
    that, a kernel's name keeps its WANT as the others keep CUT_WANT."""
    if _fits(section, width, GAP, tight=False, natural=True):
        return Fit(section, [], GAP, (None,) * len(section.columns))
    stacked = replace(section, columns=[_stacked(col) for col in section.columns])
    for roomy in (True, False):
        if _fits(section, width, GAP, tight=False, roomy=roomy):
            return _shortened(section, [], width, GAP, False, roomy)
        for gap, tight, cut in _tries(stacked, roomy):
            kept = _without(stacked, cut)
            if _fits(kept, width, gap, tight, roomy=roomy):
                return _shortened(kept, cut, width, gap, tight, roomy)
    return _shortened(_without(stacked, stacked.columns[1:]), stacked.columns[1:], width, NARROW_GAP, True)


def _tries(section: Section, roomy: bool = False) -> Iterator[tuple[int, bool, list[str]]]:
    """(gap, tight, columns left out), in the order of preference; ``roomy``: none tight, nor past ``drop``."""
    heads = {col.replace("\n", " "): col for col in section.columns}
    drop = [heads[name] for name in section.drop if name in heads]
    yield GAP, False, []
    for tight in (False,) if roomy else (False, True):
        for count in range(len(drop) + 1):
            yield NARROW_GAP, tight, drop[:count]
    if roomy:
        return
    rest = [col for col in section.columns[1:] if col not in drop]
    for count in range(1, len(rest) + 1):
        yield NARROW_GAP, True, drop + rest[len(rest) - count:]


def _without(section: Section, cut: list[str]) -> Section:
    keep = [i for i, col in enumerate(section.columns) if col not in cut]
    return replace(section, columns=[section.columns[i] for i in keep],
                   rows=[[row[i] for i in keep] for row in section.rows],
                   numeric=frozenset(n for n, i in enumerate(keep) if i in section.numeric))


def _shortened(section: Section, cut: list[str], width: int, gap: int, tight: bool, roomy: bool = False) -> Fit:
    """The fitted table: each name column gets an equal share of what the others leave (at least its least
    width), its cells cut in the middle to it; lane names are cut only when tight."""
    least = [_least(section, i, tight, roomy) for i in range(len(section.columns))]
    names = [i for i, col in enumerate(section.columns) if _kind(col) == "name" and least[i] < _widest(section, i)]
    room = width - sum(least) - gap * (len(least) - 1)
    widths: list[int | None] = [None] * len(least)
    for n, i in enumerate(sorted(names, key=lambda i: _widest(section, i))):  # the narrowest take their fill
        widths[i] = min(_widest(section, i), least[i] + room // (len(names) - n))
        room -= widths[i] - least[i]
    for i, col in enumerate(section.columns):
        if _kind(col) == "key" and least[i] < _widest(section, i):
            widths[i] = least[i]
    rows = [[cells.shorten(cell, widths[i]) if widths[i] else cell for i, cell in enumerate(row)]
            for row in section.rows]
    return Fit(replace(section, rows=rows), [col.replace("\n", " ") for col in cut], gap, tuple(widths))


def _kind(col: str) -> str:
    """``name`` for a column of names cut in the middle, ``key`` for lane names (cut only to keep the table
    within the width, never so far that two look alike), else ``value`` (never cut)."""
    head = col.replace("\n", " ")
    return "name" if head in CUT else "key" if head in FOLD else "value"


def _stacked(col: str) -> str:
    """The last word under the rest; a lone sign stays with its word (``+ fill``)."""
    head, sep, tail = col.rpartition(" ")
    return f"{head}\n{tail}" if sep and len(head) > 1 else col


def _widest(section: Section, i: int) -> int:
    """Column ``i``'s widest cell or header line."""
    return max(len(part) for text in [section.columns[i], *(row[i] for row in section.rows)]
               for part in text.split("\n"))


def _least(section: Section, i: int, tight: bool, roomy: bool = False) -> int:
    """The fewest columns column ``i`` takes: a name CUT_WANT (``roomy``: its WANT; MIN_CUT when tight), a lane
    name its widest cell (when tight, the fewest that keep every lane's name apart, at least FOLD_MIN),
    anything else its widest."""
    widest, kind = _widest(section, i), _kind(section.columns[i])
    if kind == "name":
        want = WANT.get(section.columns[i].replace("\n", " "), CUT_WANT) if roomy else CUT_WANT
        return min(widest, MIN_CUT if tight else want)
    if kind == "key" and tight:
        values = [row[i] for row in section.rows]
        return next((w for w in range(FOLD_MIN, widest) if _apart(values, w)), widest)
    return widest


def _apart(values: list[str], width: int) -> bool:
    return len({cells.shorten(v, width) for v in values}) == len(set(values))


def _fits(section: Section, width: int, gap: int, tight: bool, natural: bool = False, roomy: bool = False) -> bool:
    columns = range(len(section.columns))
    need = sum(_widest(section, i) if natural else _least(section, i, tight, roomy) for i in columns)
    return need + gap * (len(section.columns) - 1) <= width


def timeline_block(report: Report, width: int, *, step: int | None, window: tuple[int, int] | None,
                   lanes: bool) -> RenderableType:
    grid = timeline.build(report, width, step=step, window=window, lanes=lanes)
    title = "Timeline" + (f" (step {step})" if step is not None else "") + (
        f" ({cells.ms(grid.start_ns - grid.origin_ns)} to {cells.ms(grid.end_ns - grid.origin_ns)} ms)"
        if window is not None else "")
    lines = [Text(title, style="bold")]
    for row in grid.rows:
        lines.append(_row_text(row, grid.label_width))
        if row.numbers:
            lines.append(Text(" " * (grid.label_width + 2) + row.numbers, style="dim", no_wrap=True, overflow="crop"))
    lines.append(Text(" " * (grid.label_width + 2) + grid.axis, no_wrap=True, overflow="crop"))
    lines.append(prose([timeline.legend(grid)], width, "dim"))
    return Group(*lines)


def _row_text(row: timeline.Row, label_width: int) -> Text:
    """Cells grouped in runs of one phase, each run one styled span (colour only shows with color=True)."""
    text = Text(f"{row.label:>{label_width}} │", no_wrap=True, overflow="crop")
    start = 0
    for i in range(1, len(row.cells) + 1):
        if i == len(row.cells) or row.phases[i] != row.phases[start]:
            phase = row.phases[start]
            style = timeline.PHASES.get(phase, timeline.PHASES["other"])[2] if phase else timeline.IDLE_STYLE
            text.append(row.cells[start:i], style=style)
            start = i
    text.append("│")
    return text


def header_block(report: Report, width: int, unit: str = "ms") -> RenderableType:
    lines = pipeline.header(report, unit)
    return Group(*(prose([line], width, "bold" if i == 0 else "") for i, line in enumerate(lines)))


def facts_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """What was read (its warnings go to stderr, not here), the job's notes, then the pipeline's header when
    there is one."""
    parts: list[RenderableType] = [prose(sections.ingest_lines(report, warnings=False), width)]
    notes = sections.job_notes(report)
    parts += [prose(notes, width, "bold")] if notes else []
    return parts + ([header_block(report, width, unit)] if report.pipeline is not None else [])


def collectives_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """The collectives' facts (their tables are sections of their own)."""
    if report.collectives is None:
        return []
    return [Group(Text("Collectives", style="bold"), prose(collectives.facts(report, unit), width))]


def host_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """The host's launch facts (its API and range tables are sections of their own)."""
    if report.host is None:
        return []
    return [Group(Text("Host", style="bold"), prose(gputime.host_facts(report, unit), width))]


def interference_block(report: Report, width: int) -> list[RenderableType]:
    """The serving facts (their tables are sections of their own)."""
    if report.interference is None:
        return []
    facts = [Text("Serving: prefill / decode interference", style="bold")]
    return [Group(*facts, prose(serving.interference_facts(report), width))]


def gpu_timeline_block(report: Report, width: int) -> list[RenderableType]:
    """One step per GPU (plain characters, one line each), the top findings marked."""
    if report.strips is None:
        return []
    return [Text("\n".join(gpu_timeline.text(report.strips, width, findings.marks(report))), no_wrap=True)]


def requests_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """The served requests' facts (their percentile table is a section of its own)."""
    lines = requests.facts(report, unit)
    return [Group(Text("Served requests", style="bold"), prose(lines, width))] if lines else []


def findings_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """The summary line, then each finding: its headline, and its detail indented and dim."""
    parts: list[RenderableType] = [Text(findings.summary(report), style="bold")]
    for head, detail in findings.items(report, unit):
        parts += [prose([head], width), prose(["   " + detail], width, "dim")]
    return [Group(*parts)]


def memory_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """The memory facts, then its device and stage tables."""
    if not memory.shown(report):
        return []
    zero = timeline.origin(report)
    facts = Group(Text("Memory", style="bold"), prose(memory.memory_facts(report.memory, zero, unit), width))
    tables = memory.memory_tables(report.memory, zero, unit, TERMINAL_GPUS) if report.memory else []
    return [facts, *(table(t, width) for t in tables)]


def legend_block(report: Report, width: int) -> list[RenderableType]:
    line = sections.legend(report)
    return [prose([line], width, "dim")] if line else []


def renderable(report: Report, width: int, *, step: int | None = None, window: tuple[int, int] | None = None,
               lanes: bool = False, unit: str = "ms", top: int = TOP) -> RenderableType:
    """The sections in ``sections.SECTIONS`` order, a blank line between each two; times in ``unit``, ``top``
    rows of the kernel, API and range tables."""
    drawn = {"facts": lambda: facts_block(report, width, unit),
             "timeline": lambda: [timeline_block(report, width, step=step, window=window, lanes=lanes)]
             if report.timeline else [],
             "collectives": lambda: collectives_block(report, width, unit),
             "interference": lambda: interference_block(report, width), "gpu_bars": list, "stage_bars": list,
             "host": lambda: host_block(report, width, unit), "legend": lambda: legend_block(report, width),
             "memory": lambda: memory_block(report, width, unit),
             "findings": lambda: findings_block(report, width, unit),
             "gpu_timeline": lambda: gpu_timeline_block(report, width),
             "requests": lambda: requests_block(report, width, unit)}
    bars = 10 if width >= NARROW else 5 if width >= NO_BARS else 0
    layout = sections.Layout(unit, top, bar_width=bars, lane_limit=TERMINAL_LANES, rank_limit=TERMINAL_RANKS,
                             gpu_limit=TERMINAL_GPUS, step_limit=TERMINAL_STEPS)
    parts: list[RenderableType] = []
    for kind, section in sections.walk(report, timeline.origin(report), layout):
        parts += [table(section, width)] if section is not None else drawn[kind]()
    return Group(*_spaced(parts))


def _spaced(parts: list[RenderableType]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for part in parts:
        out += [part, Text("")]
    return out[:-1]


def render(report: Report, width: int = 80, *, color: bool = False, step: int | None = None,
           window: tuple[int, int] | None = None, lanes: bool = False, unit: str = "ms",
           top: int = TOP) -> str:
    """The terminal text: ANSI colour when ``color``, otherwise plain characters; no line wider than ``width``."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False,
                      color_system="256" if color else None, emoji=False, soft_wrap=False, _environ={})
    console.print(renderable(report, width, step=step, window=window, lanes=lanes, unit=unit, top=top))
    if color:
        return buffer.getvalue()
    # rich pads table cells to the column width; trailing blanks only make diffs and pipes noisy
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
