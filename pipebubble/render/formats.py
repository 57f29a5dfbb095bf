"""The output formats: one registry that every command's ``--format`` choices and ``-o`` suffixes come from.

A command (analyze, export, check, diff, theory) picks among its own subset of formats: ``.json`` is the JSON
report for analyze but Chrome JSON for export, so suffixes resolve within one command. Each ``OutputFormat``
says whether it is binary and how it renders; the renderers are imported only when one runs, so building the
CLI's choices stays cheap.

``pick(command, name, output)`` is the one resolution rule: an explicit name wins, else the output's suffix
(for commands whose suffix chooses), else the command's default.
"""

from __future__ import annotations

import gzip
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from functools import cache
from pathlib import Path
from typing import Any

from pipebubble.render.choices import GATE_FORMATS, TOP


@dataclass(frozen=True)
class Options:
    """What a renderer may be asked for; each format reads the fields it understands and ignores the rest.

    ``spans``: the span table (Perfetto formats need it). ``width``: columns of text and of the Markdown
    timeline (None: ``COLUMNS``, else the terminal's, else PIPED_WIDTH, as when piped). ``color``: ANSI styles
    in text. ``step`` / ``window`` / ``lanes``: zoom the timeline to a step or to (start, end) ns from its
    origin; one row per lane. ``timeunit``: the unit of the times in text, Markdown, HTML and CSV tables and
    facts (one of ``choices.TIME_UNITS``; the timeline's axis, the serving section and JSON keep theirs).
    ``top``: rows of the kernel, runtime API and range tables. ``table``: the table CSV writes (one of
    ``choices.CSV_TABLES``).
    """

    spans: Any = None
    width: int | None = None
    color: bool = False
    step: int | None = None
    window: tuple[int, int] | None = None
    lanes: bool = False
    timeunit: str = "ms"
    top: int = TOP
    table: str = "kernels"


@dataclass(frozen=True)
class OutputFormat:
    """One format: its name (as ``--format`` takes it), the output suffixes that ask for it, whether it is bytes,
    and ``render(subject, options) -> str | bytes`` (the subject is the command's: a Report, gates, a diff)."""

    name: str
    suffixes: tuple[str, ...]
    binary: bool
    render: Callable[[Any, Options], str | bytes]
    help: str = ""


@dataclass(frozen=True)
class Command:
    """A command's formats, its default (None: the output's suffix must say) and whether the suffix chooses."""

    formats: tuple[OutputFormat, ...]
    default: str | None
    by_suffix: bool


PIPED_WIDTH = 80  # text's columns when neither --width, COLUMNS nor a terminal says


def _width(options: Options) -> int:
    return options.width or shutil.get_terminal_size((PIPED_WIDTH, 24)).columns


def _text(report: Any, o: Options) -> str:
    from pipebubble.render import terminal

    return terminal.render(report, _width(o), color=o.color, step=o.step, window=o.window, lanes=o.lanes,
                           unit=o.timeunit, top=o.top)


def _json(report: Any, o: Options) -> str:
    from pipebubble.render import json

    return json.render(report)


def _markdown(report: Any, o: Options) -> str:
    from pipebubble.render import markdown

    return markdown.render(report, _width(o), step=o.step, window=o.window, lanes=o.lanes, unit=o.timeunit,
                           top=o.top)


def _html(report: Any, o: Options) -> str:
    from pipebubble.render import html

    return html.render(report, step=o.step, window=o.window, lanes=o.lanes, unit=o.timeunit, top=o.top)


def _csv(report: Any, o: Options) -> str:
    from pipebubble.render import csv_table

    return csv_table.render(report, o.table, o.timeunit)


def _trace(report: Any, o: Options) -> Any:
    """The Perfetto trace of the report and the span table (with the ``args``, ``category`` and ``flows``
    columns of ``perfetto.flows.attach`` when the export read them)."""
    from pipebubble.render import perfetto

    if o.spans is None:
        raise ValueError("the Perfetto formats need the span table (spans=...)")
    return perfetto.build(o.spans, report)


def _perfetto(report: Any, o: Options) -> bytes:
    from pipebubble.render import perfetto

    return perfetto.to_proto(_trace(report, o))


def _chrome(report: Any, o: Options) -> str:
    from pipebubble.render import perfetto

    return perfetto.to_chrome_json(_trace(report, o))


def _chrome_gz(report: Any, o: Options) -> bytes:
    return gzip.compress(_chrome(report, o).encode(), mtime=0)  # mtime 0: the same bytes on every run


def _gates(command: str, fmt: str) -> Callable[[Any, Options], str]:
    def render(subject: Any, o: Options) -> str:
        from pipebubble.render import gates

        return getattr(gates, f"render_{command}")(subject, fmt, o.timeunit)

    render.__doc__ = f"pipebubble.render.gates.{command}_{fmt}"
    return render


def _gate_command(command: str) -> Command:
    return Command(tuple(OutputFormat(name, suffixes, False, _gates(command, name), text)
                         for name, suffixes, text in GATE_FORMATS), "text", by_suffix=False)


def _theory(name: str) -> Callable[[Any, Options], str]:
    def render(subject: Any, o: Options) -> str:
        from pipebubble.render import theory

        return getattr(theory, name)(subject)

    render.__doc__ = f"pipebubble.render.theory.{name}"
    return render


TEXT = OutputFormat("text", (".txt",), False, _text, "the terminal report")
JSON = OutputFormat("json", (".json",), False, _json, "the report as JSON (stable keys, for jq and diff)")
MARKDOWN = OutputFormat("markdown", (".md", ".markdown"), False, _markdown, "GitHub Markdown (PR comments)")
HTML = OutputFormat("html", (".html", ".htm"), False, _html, "one self-contained page")
CSV = OutputFormat("csv", (".csv",), False, _csv, "one table (--table) as CSV, for pandas and spreadsheets")
PERFETTO = OutputFormat("perfetto", (".pftrace", ".perfetto-trace", ".pb"), True, _perfetto,
                        "Perfetto TrackEvent protobuf")
PERFETTO_JSON = OutputFormat("perfetto-json", (".json",), False, _chrome, "Chrome JSON trace")
PERFETTO_JSON_GZ = OutputFormat("perfetto-json-gz", (".json.gz",), True, _chrome_gz, "gzipped Chrome JSON trace")

COMMANDS: dict[str, Command] = {
    "analyze": Command((TEXT, JSON, MARKDOWN, HTML, CSV), "text", by_suffix=True),
    "export": Command((PERFETTO, PERFETTO_JSON, PERFETTO_JSON_GZ), None, by_suffix=True),
    # check, diff and theory choose by --format only (their -o never did more than name the file)
    "check": _gate_command("check"),
    "diff": _gate_command("diff"),
    "theory": Command((OutputFormat("text", (".txt",), False, _theory("text")),
                       OutputFormat("json", (".json",), False, _theory("to_json"))), "text", by_suffix=False),
}


def _command(command: str) -> Command:
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}: expected one of {', '.join(COMMANDS)}")
    return COMMANDS[command]


def formats_for(command: str) -> tuple[OutputFormat, ...]:
    """The formats ``command`` offers, in registry order; an unknown command raises ValueError."""
    return _command(command).formats


def names(command: str) -> list[str]:
    """The format names ``command`` accepts, e.g. for ``--format`` choices."""
    return [f.name for f in formats_for(command)]


def default(command: str) -> str | None:
    """The format ``command`` uses when neither ``--format`` nor the output's suffix says."""
    return _command(command).default


@cache
def choices(command: str) -> type[Enum]:
    """A ``str`` Enum of ``command``'s format names, for a typer option (``Format(name).value``); one class per
    command, however often it is asked for."""
    return Enum(f"{command.title()}Format", {name: name for name in names(command)}, type=str)


def get(command: str, name: str) -> OutputFormat:
    """The format ``name`` of ``command``; an unknown name raises ValueError listing the known ones."""
    for fmt in formats_for(command):
        if fmt.name == name:
            return fmt
    raise ValueError(f"unknown format {name!r}: expected one of {', '.join(names(command))}")


def suffixes(command: str) -> list[str]:
    """Every output suffix ``command`` recognises, in registry order."""
    return [s for f in formats_for(command) for s in f.suffixes]


def from_suffix(path: Path | str, among: str | tuple[OutputFormat, ...]) -> OutputFormat | None:
    """The format whose suffix ends ``path`` (longest suffix first, so ``.json.gz`` beats ``.json``), among a
    command's formats (or the given ones); None when no suffix matches."""
    fmts = formats_for(among) if isinstance(among, str) else among
    name = Path(path).name.lower()
    found = [(len(s), f) for f in fmts for s in f.suffixes if name.endswith(s) and len(name) > len(s)]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def pick(command: str, name: str | Enum | None = None, output: Path | str | None = None) -> OutputFormat:
    """The format ``command`` writes: ``name`` when given, else the one ``output``'s suffix asks for (if the
    command chooses by suffix), else its default. Raises ValueError, one line naming the accepted suffixes, when
    the suffix is unknown (``-o out.pdf``) or nothing decides."""
    if isinstance(name, Enum):
        name = name.value
    if name is not None:
        return get(command, name)
    cmd = _command(command)
    if output is not None and cmd.by_suffix:
        found = from_suffix(output, cmd.formats)
        if found is not None:
            return found
        if Path(output).suffix or cmd.default is None:
            raise ValueError(f"{output}: expected an output name ending in {', '.join(suffixes(command))}")
    if cmd.default is None:
        raise ValueError(f"{command}: expected an output name ending in {', '.join(suffixes(command))}")
    return get(command, cmd.default)
