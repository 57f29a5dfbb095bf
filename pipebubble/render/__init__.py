"""Renderers: a Report in, a string out. They never compute and never print; the CLI writes what they return.

``render`` is the one entry point; ``format_from_suffix`` picks the format from an output file's name.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipebubble.report import Report

FORMATS = ("text", "json", "markdown", "html")
SUFFIXES = {".txt": "text", ".json": "json", ".md": "markdown", ".markdown": "markdown", ".html": "html",
            ".htm": "html"}


def render(report: Report, fmt: str, *, width: int | None = None, color: bool = False, step: int | None = None,
           window: tuple[int, int] | None = None, lanes: bool = False) -> str:
    """The report as ``fmt`` (text, json, markdown or html).

    ``width``: columns of the text output and of the Markdown timeline (None: the terminal's, else 100).
    ``color``: ANSI styles in text. ``step``: zoom the timeline to that step's window; ``window``: to
    (start, end) ns measured from the timeline's origin (the pipeline window's start). ``lanes``: one
    timeline row per lane instead of per stage. An unknown ``step`` raises ValueError naming the known ones.
    """
    from pipebubble.render import html, json, markdown, terminal

    width = width or shutil.get_terminal_size((100, 24)).columns
    if fmt == "json":
        return json.render(report)
    if fmt == "markdown":
        return markdown.render(report, width, step=step, window=window, lanes=lanes)
    if fmt == "html":
        return html.render(report, step=step, window=window, lanes=lanes)
    if fmt == "text":
        return terminal.render(report, width, color=color, step=step, window=window, lanes=lanes)
    raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")


def format_from_suffix(path: Path | str) -> str | None:
    """The report format an output file's suffix asks for, or None (e.g. .pftrace is the export command's)."""
    return SUFFIXES.get(Path(path).suffix.lower())
