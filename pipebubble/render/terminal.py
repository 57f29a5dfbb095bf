"""Rich terminal output: header, timeline, stage / wait / what-if tables, collectives, serving facts, lanes.

``renderable`` builds rich renderables; ``render`` prints them into a recording console and returns the text,
so what the terminal shows and what the golden tests pin are the same characters. Lines of prose are folded
here (``wrap``), not by rich, so that a number never parts from its unit.
"""

from __future__ import annotations

import io
import re

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipebubble.render import collectives, sections, timeline
from pipebubble.render.sections import Table as Section
from pipebubble.report import Report

NARROW = 100  # below this width the utilization bars get shorter
TERMINAL_LANES = 200  # lane rows in the terminal; every lane is in the documents and the JSON
TERMINAL_RANKS = 64  # rank rows of the collectives table (the latest first); every rank is in the documents
INDENT = "  "  # a folded line's continuation
CUT = frozenset({"before", "after", "change", "call"})  # columns of long names, cut with an ellipsis
MIN_CUT = 12
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
    cut_width = _cut_width(section, width)
    for i, col in enumerate(section.columns):
        # names of kernels and passes can be long: cut them to one line; a lane name must stay whole, so it folds
        cut = col in CUT
        out.add_column(col, justify="right" if i in section.numeric else "left", no_wrap=col != "lane",
                       overflow="ellipsis" if cut else "fold", max_width=cut_width if cut else None)
    for row in section.rows:
        out.add_row(*row)
    title = prose([section.title], width, "italic")
    return Group(title, out, *([prose(sections.footnotes(section), width, "dim")] if section.notes else []))


def _cut_width(section: Section, width: int) -> int:
    """The widest a cut column may be: an equal share of what the other columns (at their widest cell) and
    the gaps between columns leave of ``width``, at most a quarter of it and at least MIN_CUT."""
    cut = sum(col in CUT for col in section.columns)
    if not cut:
        return width
    fixed = sum(max(len(c) for c in [col, *(row[i] for row in section.rows)])
                for i, col in enumerate(section.columns) if col not in CUT)
    left = width - fixed - GAP * (len(section.columns) - 1)
    return max(min(left // cut, width // 4), MIN_CUT)


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


def header_block(report: Report, width: int) -> RenderableType:
    lines = sections.header(report)
    return Group(*(prose([line], width, "bold" if i == 0 else "") for i, line in enumerate(lines)))


def facts_block(report: Report, width: int) -> list[RenderableType]:
    """What was read (its warnings go to stderr, not here), the job's notes, then the pipeline's header when
    there is one."""
    parts: list[RenderableType] = [prose(sections.ingest_lines(report, warnings=False), width)]
    parts += [prose(sections.job_notes(report), width, "bold")] if report.notes else []
    return parts + ([header_block(report, width)] if report.pipeline is not None else [])


def collectives_block(report: Report, width: int) -> list[RenderableType]:
    """The collectives' facts (their tables are sections of their own)."""
    if report.collectives is None:
        return []
    return [Group(Text("Collectives", style="bold"), prose(collectives.facts(report), width))]


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
               lanes: bool = False) -> RenderableType:
    """The sections in ``sections.SECTIONS`` order, a blank line between each two."""
    drawn = {"facts": lambda: facts_block(report, width),
             "timeline": lambda: [timeline_block(report, width, step=step, window=window, lanes=lanes)]
             if report.timeline else [],
             "collectives": lambda: collectives_block(report, width),
             "interference": lambda: interference_block(report, width), "legend": lambda: legend_block(report, width)}
    bar_width = 10 if width >= NARROW else 5
    parts: list[RenderableType] = []
    for kind, section in sections.walk(report, timeline.origin(report), bar_width=bar_width,
                                       lane_limit=TERMINAL_LANES, rank_limit=TERMINAL_RANKS):
        parts += [table(section, width)] if section is not None else drawn[kind]()
    return Group(*_spaced(parts))


def _spaced(parts: list[RenderableType]) -> list[RenderableType]:
    out: list[RenderableType] = []
    for part in parts:
        out += [part, Text("")]
    return out[:-1]


def render(report: Report, width: int = 100, *, color: bool = False, step: int | None = None,
           window: tuple[int, int] | None = None, lanes: bool = False) -> str:
    """The terminal text: ANSI colour when ``color``, otherwise plain characters; no line wider than ``width``."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, no_color=not color, highlight=False,
                      color_system="256" if color else None, emoji=False, soft_wrap=False, _environ={})
    console.print(renderable(report, width, step=step, window=window, lanes=lanes))
    if color:
        return buffer.getvalue()
    # rich pads table cells to the column width; trailing blanks only make diffs and pipes noisy
    return "".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines())
