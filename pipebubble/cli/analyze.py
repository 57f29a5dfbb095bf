"""`pipebubble analyze`: read traces, print the report."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli.output import console, ingest_with_progress, write_text


class Format(str, Enum):
    text = "text"
    json = "json"


def analyze(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders of per-rank traces.")],
    format: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.text,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Decode again; ignore the span cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Busy and idle time of every GPU, stream and CPU thread in the traces.

    Examples:

      pipebubble analyze sample_traces/toy_train

      pipebubble analyze runs/rank*.json.gz --format json | jq '.lanes[] | {lane, idle_ns}'
    """
    from pipebubble.analyze import analyze as build
    from pipebubble.render import json as json_render
    from pipebubble.render import terminal

    report = build(ingest_with_progress(paths, use_cache=not no_cache, quiet=quiet))
    if format is Format.json:
        write_text(json_render.render(report), output)
    else:
        console(output).print(terminal.render(report))


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(analyze)
