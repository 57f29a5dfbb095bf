"""`pipebubble export`: the traces, annotated with the analysis, for ui.perfetto.dev (or any Chrome JSON viewer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipebubble.errors import PipebubbleError

SUFFIXES = (".pftrace", ".perfetto-trace", ".pb", ".json")


def export(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders of per-rank traces.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="out.pftrace (Perfetto protobuf) or out.json.")],
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Decode again; ignore the span cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Write one trace with the original spans (a track per stage or lane), each pass, every bubble and wait
    with its cause, and a utilization counter; open it in ui.perfetto.dev.

    Examples:

      pipebubble export sample_traces/pipeline_1f1b -o 1f1b.pftrace

      pipebubble export runs/rank*.json.gz -o annotated.json
    """
    from pipebubble.analyze import analyze as build
    from pipebubble.cli.output import progress, warn, write_text
    from pipebubble.ingest import load
    from pipebubble.render import perfetto

    if output.suffix.lower() not in SUFFIXES:
        raise PipebubbleError(f"{output}: expected an output name ending in {', '.join(SUFFIXES)}")
    with progress(paths, quiet) as advance:
        ingested = load(paths, use_cache=not no_cache, on_file=advance)
    warn(ingested.warnings)
    trace = perfetto.build(ingested.spans, build(ingested))
    data = perfetto.to_chrome_json(trace) if output.suffix.lower() == ".json" else perfetto.to_proto(trace)
    write_text(data, output)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(export)
