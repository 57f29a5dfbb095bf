"""Rich terminal output: header, timeline, stage / wait / what-if tables, collectives, serving facts, GPU time,
kernels, host, lanes.

``renderable`` builds rich renderables; ``render`` prints them into a recording console and returns the text,
so what the terminal shows and what the golden tests pin are the same characters. Lines of prose are folded
here (``wrap``), not by rich, so that a number never parts from its unit.
"""

from __future__ import annotations

import io
import re
from dataclasses import replace

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipebubble.render import collectives, gputime, sections, timeline
from pipebubble.render.sections import Table as Section
from pipebubble.report import Report

NARROW = 100  # below this width the utilization bars get shorter
TERMINAL_LANES = 200  # lane rows in the terminal; every lane is in the documents and the JSON
TERMINAL_RANKS = 64  # rank rows of the collectives table (the latest first); every rank is in the documents
TERMINAL_GPUS = 64  # GPU rows of the GPU time and idle tables; every GPU is in the documents and the CSV
TERMINAL_STEPS = 32  # rows of the per-step GPU time table (the first GPUs' steps)
INDENT = "  "  # a folded line's continuation
CUT = frozenset({"before", "after", "change", "call", "kernel", "range"})  # long names, cut with an ellipsis
FOLD = frozenset({"lane", "gpu"})  # lane names must stay whole: they fold onto more lines instead
FOLD_MIN = 16  # the fewest columns a folding column keeps
MIN_CUT = 12
CUT_WANT = 20  # a cut column with less room than this gets the headers stacked to widen it
GAP = 3  # columns between two table columns: padding, the (blank) rule, padding
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
    out = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False)
    section, dropped = fit(section, width)
    cut_width = _cut_width(section, width)
    for i, col in enumerate(section.columns):
        # names of kernels and passes can be long: cut them to one line; a lane name must stay whole, so it folds
        cut = col in CUT
        out.add_column(col, justify="right" if i in section.numeric else "left", no_wrap=col not in FOLD,
                       overflow="ellipsis" if cut else "fold", max_width=cut_width if cut else None,
                       min_width=_least(section, i) if col in FOLD else None)
    for row in section.rows:
        out.add_row(*row)
    title = prose([section.title], width, "italic")
    left_out = [f"not shown at {width} columns: {', '.join(dropped)} (a wider --width, markdown or html shows"
                " them)"] if dropped else []
    notes = [*sections.footnotes(section), *left_out]
    return Group(title, out, *([prose(notes, width, "dim")] if notes else []))


def fit(section: Section, width: int) -> tuple[Section, list[str]]:
    """``section`` as it fits ``width`` columns without cutting a number: when too wide, or when it would leave
    a cut column (a kernel's name) fewer than CUT_WANT columns, headers of several words stacked on two lines
    ("total" over "ms"); then, while still too wide, the rightmost columns left out (named in the list)."""
    if _fits(section, len(section.columns), width) and _cut_room(section, width) >= CUT_WANT:
        return section, []
    section = replace(section, columns=[_stacked(col) for col in section.columns])
    kept = len(section.columns)
    while kept > 1 and not _fits(section, kept, width):
        kept -= 1
    dropped = [col.replace("\n", " ") for col in section.columns[kept:]]
    return replace(section, columns=section.columns[:kept], rows=[row[:kept] for row in section.rows],
                   numeric=frozenset(i for i in section.numeric if i < kept)), dropped


def _stacked(col: str) -> str:
    head, sep, tail = col.rpartition(" ")
    return f"{head}\n{tail}" if sep else col


def _widest(section: Section, i: int) -> int:
    """Column ``i``'s widest cell or header line."""
    return max(len(part) for text in [section.columns[i], *(row[i] for row in section.rows)]
               for part in text.split("\n"))


def _least(section: Section, i: int) -> int:
    """The fewest columns column ``i`` needs: its widest cell, except that a cut column can shrink to MIN_CUT
    and a folding one to FOLD_MIN."""
    col = section.columns[i]
    return min(_widest(section, i), MIN_CUT if col in CUT else FOLD_MIN if col in FOLD else 1 << 30)


def _fits(section: Section, columns: int, width: int) -> bool:
    return sum(_least(section, i) for i in range(columns)) + GAP * (columns - 1) <= width


def _cut_room(section: Section, width: int) -> int:
    """What the other columns (at their widest cell) and the gaps leave of ``width`` to each cut column."""
    cut = sum(col in CUT for col in section.columns)
    if not cut:
        return width
    fixed = sum(_widest(section, i) for i, col in enumerate(section.columns) if col not in CUT)
    return (width - fixed - GAP * (len(section.columns) - 1)) // cut


def _cut_width(section: Section, width: int) -> int:
    """The widest a cut column may be: an equal share of what the other columns (at their widest cell) and
    the gaps between columns leave of ``width``, at most a quarter of it and at least MIN_CUT."""
    return max(min(_cut_room(section, width), width // 4), MIN_CUT)


def timeline_block(report: Report, width: int, *, step: int | None, window: tuple[int, int] | None,
                   lanes: bool) -> RenderableType:
    grid = timeline.build(report, width, step=step, window=window, lanes=lanes)
    title = "Timeline" + (f" (step {step})" if step is not None else "") + (
        f" ({sections.ms(grid.start_ns - grid.origin_ns)} to {sections.ms(grid.end_ns - grid.origin_ns)} ms)"
        if window is not None else "")
    lines = [Text(title, style="bold")] + [_row_text(row, grid.label_width) for row in grid.rows]
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
    lines = sections.header(report, unit)
    return Group(*(prose([line], width, "bold" if i == 0 else "") for i, line in enumerate(lines)))


def facts_block(report: Report, width: int, unit: str = "ms") -> list[RenderableType]:
    """What was read (its warnings go to stderr, not here), the job's notes, then the pipeline's header when
    there is one."""
    parts: list[RenderableType] = [prose(sections.ingest_lines(report, warnings=False), width)]
    parts += [prose(sections.job_notes(report), width, "bold")] if report.notes else []
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
    return [Group(*facts, prose(sections.interference_facts(report), width))]


def legend_block(report: Report, width: int) -> list[RenderableType]:
    line = sections.legend(report)
    return [prose([line], width, "dim")] if line else []


def renderable(report: Report, width: int, *, step: int | None = None, window: tuple[int, int] | None = None,
               lanes: bool = False, unit: str = "ms", top: int = gputime.TOP) -> RenderableType:
    """The sections in ``sections.SECTIONS`` order, a blank line between each two; times in ``unit``, ``top``
    rows of the kernel, API and range tables."""
    drawn = {"facts": lambda: facts_block(report, width, unit),
             "timeline": lambda: [timeline_block(report, width, step=step, window=window, lanes=lanes)]
             if report.timeline else [],
             "collectives": lambda: collectives_block(report, width, unit),
             "interference": lambda: interference_block(report, width), "gpu_bars": list,
             "host": lambda: host_block(report, width, unit), "legend": lambda: legend_block(report, width)}
    layout = sections.Layout(unit, top, bar_width=10 if width >= NARROW else 5, lane_limit=TERMINAL_LANES,
                             rank_limit=TERMINAL_RANKS, gpu_limit=TERMINAL_GPUS, step_limit=TERMINAL_STEPS)
    parts: list[RenderableType] = []
    for kind, section in sections.walk(report, timeline.origin(report), layout):
        parts += [table(section, width)] if section is not None else drawn[kind]()
    return Group(*_spaced(parts))


def _spaced(parts: list[RenderableType]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for part in parts:
        out += [part, Text("")]
    return out[:-1]


def render(report: Report, width: int = 100, *, color: bool = False, step: int | None = None,
           window: tuple[int, int] | None = None, lanes: bool = False, unit: str = "ms",
           top: int = gputime.TOP) -> str:
    """The terminal text: ANSI colour when ``color``, otherwise plain characters; no line wider than ``width``."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False,
                      color_system="256" if color else None, emoji=False, soft_wrap=False, _environ={})
    console.print(renderable(report, width, step=step, window=window, lanes=lanes, unit=unit, top=top))
    if color:
        return buffer.getvalue()
    # rich pads table cells to the column width; trailing blanks only make diffs and pipes noisy
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
