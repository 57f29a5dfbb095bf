"""Rich terminal output: header, timeline, stage / wait / what-if tables, serving facts, lanes.

``renderable`` builds rich renderables; ``render`` prints them into a recording console and returns the text,
so what the terminal shows and what the golden tests pin are the same characters.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from pipebubble.render import sections, timeline
from pipebubble.render.sections import Table as Section
from pipebubble.report import Report

NARROW = 100  # below this width the utilization bars get shorter
TERMINAL_LANES = 200  # lane rows in the terminal; every lane is in the documents and the JSON


def table(section: Section, width: int) -> RenderableType:
    out = Table(title=section.title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                show_edge=False, expand=False)
    for i, col in enumerate(section.columns):
        # names of kernels and passes can be long: cut them; a lane name must stay whole, so it folds
        cut = col in ("before", "after", "change")
        out.add_column(col, justify="right" if i in section.numeric else "left", no_wrap=not cut and col != "lane",
                       overflow="ellipsis" if cut else "fold", max_width=max(width // 4, 12) if cut else None)
    for row in section.rows:
        out.add_row(*row)
    if not section.notes:
        return out
    return Group(out, *(Text(note, style="dim") for note in sections.footnotes(section)))


def timeline_block(report: Report, width: int, *, step: int | None, window: tuple[int, int] | None,
                   lanes: bool) -> RenderableType:
    grid = timeline.build(report, width, step=step, window=window, lanes=lanes)
    title = "Timeline" + (f" (step {step})" if step is not None else "") + (
        f" ({sections.ms(grid.start_ns - grid.origin_ns)} to {sections.ms(grid.end_ns - grid.origin_ns)} ms)"
        if window is not None else "")
    lines = [Text(title, style="bold")] + [_row_text(row, grid.label_width) for row in grid.rows]
    lines.append(Text(" " * (grid.label_width + 2) + grid.axis, no_wrap=True, overflow="crop"))
    lines.append(Text(timeline.legend(grid), style="dim"))
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


def header_block(report: Report) -> RenderableType:
    lines = sections.header(report)
    return Group(*(Text(line, style="bold" if i == 0 else "") for i, line in enumerate(lines)))


def facts_block(report: Report) -> list[RenderableType]:
    """What was read (its warnings go to stderr, not here), then the pipeline's header when there is one."""
    parts: list[RenderableType] = [Text("\n".join(sections.ingest_lines(report, warnings=False)))]
    return parts + ([header_block(report)] if report.pipeline is not None else [])


def interference_block(report: Report) -> list[RenderableType]:
    """The serving facts (their tables are sections of their own)."""
    if report.interference is None:
        return []
    facts = [Text("Serving: prefill / decode interference", style="bold")]
    return [Group(*facts, *(Text(line) for line in sections.interference_facts(report)))]


def renderable(report: Report, width: int, *, step: int | None = None, window: tuple[int, int] | None = None,
               lanes: bool = False) -> RenderableType:
    """The sections in ``sections.SECTIONS`` order, a blank line between each two."""
    drawn = {"facts": lambda: facts_block(report),
             "timeline": lambda: [timeline_block(report, width, step=step, window=window, lanes=lanes)]
             if report.timeline else [],
             "interference": lambda: interference_block(report)}
    bar_width = 10 if width >= NARROW else 5
    parts: list[RenderableType] = []
    for kind, section in sections.walk(report, timeline.origin(report), bar_width=bar_width,
                                       lane_limit=TERMINAL_LANES):
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
