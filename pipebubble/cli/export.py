"""`pipebubble export`: the traces, annotated with the analysis, for ui.perfetto.dev (or any Chrome JSON viewer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.errors import PipebubbleError
from pipebubble.options import Options, Scale
from pipebubble.render import formats


@flags.analysing
def export(
    paths: flags.Paths,
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="out.pftrace (Perfetto protobuf), out.json or out.json.gz (Chrome JSON).")],
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
    quiet: flags.Quiet = False,
) -> None:
    """Write one trace with the original spans (a track per GPU stream and CPU thread under each rank, with
    the events' own arguments and flow arrows), each pass, every bubble and wait with its cause, and a
    utilization counter; open it in ui.perfetto.dev.

    Examples:

      pipebubble export sample_traces/pipeline_1f1b -o 1f1b.pftrace

      pipebubble export runs/rank*.json.gz -o annotated.json.gz
    """
    from pipebubble.cli.output import executor_notes, progress, warn, write_text
    from pipebubble.ingest import find_traces
    from pipebubble.ingest.json import extras
    from pipebubble.render.perfetto.flows import attach
    from pipebubble.run import with_spans

    try:
        fmt = formats.pick("export", None, output)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None
    with progress(paths, quiet) as advance:
        report, table = with_spans(paths, options, scale, on_file=advance)
    found = extras.read(extras.sources(table, find_traces(paths)), scale)  # args and flows: the export's alone
    # a deep value: both reads say it
    warn(list(dict.fromkeys([*report.ingest.warnings, *found.warnings])) + executor_notes())
    table = attach(table, found.args, found.flows)
    write_text(fmt.render(report, formats.Options(spans=table)), output, quiet)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(export)
