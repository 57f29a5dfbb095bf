"""Renderers: a Report (and, for Perfetto, the span table) in, a str or bytes out. They never compute and never
print; the CLI writes what they return.

``render`` is the one entry point for a Report; ``formats`` is the registry it dispatches through (and the
CLI's ``--format`` choices and ``-o`` suffixes come from: ``formats.pick``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipebubble.render import choices, formats

if TYPE_CHECKING:  # the report's classes load with the analysis, not with the CLI's --format choices
    from pipebubble.report import Report

REPORT_COMMANDS = ("analyze", "export")  # the commands whose subject is a Report


def report_formats() -> list[formats.OutputFormat]:
    """Every format a Report renders to: the analyze command's, then the export command's."""
    return [f for command in REPORT_COMMANDS for f in formats.formats_for(command)]


def render(report: Report, fmt: str, *, spans: Any = None, width: int | None = None, color: bool = False,
           step: int | None = None, window: tuple[int, int] | None = None, lanes: bool = False,
           timeunit: str = "ms", top: int = choices.TOP, table: str = "kernels") -> str | bytes:
    """The report as ``fmt``: text, json, markdown, html, csv (str) or perfetto (bytes), perfetto-json (str),
    perfetto-json-gz (bytes).

    ``spans``: the span table, which the Perfetto formats need (ValueError without it). ``width``: columns of the
    text output and of the Markdown timeline (None: ``COLUMNS``, else the terminal's, else 80 as when piped).
    ``color``: ANSI styles in text. ``step``: zoom the timeline to that step's window; ``window``: to (start,
    end) ns measured from the timeline's origin (the pipeline window's start). ``lanes``: one timeline row per
    lane instead of per stage.
    ``timeunit``: ns, us, ms or s, for the times of text, markdown, html and csv; ``top``: rows of the kernel,
    runtime API and range tables; ``table``: which table csv writes (``choices.CSV_TABLES``).
    An unknown ``step`` raises ValueError naming the known ones; so does an unknown ``fmt``, unit or table.
    """
    known = {f.name: f for f in report_formats()}
    if fmt not in known:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(known)}")
    options = formats.Options(spans=spans, width=width, color=color, step=step, window=window, lanes=lanes,
                              timeunit=timeunit, top=top, table=table)
    return known[fmt].render(report, options)

