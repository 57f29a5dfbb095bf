"""`pipebubble analyze`: read traces, print the report."""

from __future__ import annotations

from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.cli.flags import OUTPUT
from pipebubble.cli.output import check_output, console_wants_color, executor_notes, progress, warn, write_text
from pipebubble.errors import PipebubbleError
from pipebubble.options import Options, Scale
from pipebubble.render import choices, formats

Format = formats.choices("analyze")


@flags.analysing
def analyze(
    paths: flags.Paths,
    format: Annotated[
        Format | None,
        typer.Option(
            "--format", "-f", help="Output format (default: from -o's suffix, else text).", rich_help_panel=OUTPUT
        ),
    ] = None,
    output: flags.Output = None,
    width: flags.Width = None,
    step: Annotated[int | None, typer.Option(help="Zoom the timeline to this step.", rich_help_panel=OUTPUT)] = None,
    window: Annotated[
        str | None, typer.Option(help="Zoom the timeline to START:END ms from its start.", rich_help_panel=OUTPUT)
    ] = None,
    lanes: Annotated[
        bool, typer.Option("--lanes", help="One timeline row per lane, not per stage.", rich_help_panel=OUTPUT)
    ] = False,
    timeunit: flags.TimeUnitOpt = flags.TimeUnit.ms,
    top: flags.Top = choices.TOP,
    table: flags.TableOpt = None,
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
    quiet: flags.Quiet = False,
) -> None:
    """Where the GPUs wait: busy/idle per GPU, stream and thread; each GPU's time as compute, exposed comm,
    exposed memory and idle (by cause), the kernels and host calls by total; per pipeline stage, fill/drain
    bubbles against theory, the biggest waits and what each waited for, and what-if recommendations.

    Examples:

      pipebubble analyze sample_traces/pipeline_1f1b

      pipebubble analyze runs/step42/ --gpu-cost 3.0 --width 160

      pipebubble analyze runs/ --format json | jq '.pipeline | {bubble_fraction, theoretical_bubble_fraction}'

      pipebubble analyze runs/ -o report.html

      pipebubble analyze sample_traces/serve_chunked_prefill --tbt-slo 20

      pipebubble analyze runs/ --timeunit us --top 30

      pipebubble analyze runs/ --format csv --table breakdown -o gpu_time.csv
    """
    from pipebubble.ingest import cache
    from pipebubble.run import run

    try:  # the output's name is checked before the traces are read, not after
        fmt = formats.pick("analyze", format, output)
        if table is not None and fmt.name != "csv":
            raise ValueError(f"--table chooses the table of --format csv, not of {fmt.name}")
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    zoom = _window(window)
    check_output("analyze", fmt, output)
    with progress(paths, quiet) as advance:
        report = run(paths, options, scale, on_file=advance)
    # The cache may have turned out unusable only while the report was stored: say so once as well.
    warn([*report.ingest.warnings, *(w for w in cache.warnings() if w not in report.ingest.warnings),
          *executor_notes()])
    try:
        text = fmt.render(report, formats.Options(width=width, color=output is None and console_wants_color(),
                                                  step=step, window=zoom, lanes=lanes,
                                                  timeunit=timeunit.value, top=top,
                                                  table=table.value if table is not None else formats.Options.table))
    except ValueError as exc:  # a --step or --window the report has no timeline for: one line, as bad input
        raise PipebubbleError(str(exc)) from None
    write_text(text, output, quiet)


def _window(text: str | None) -> tuple[int, int] | None:
    """``--window START:END`` (ms from the timeline's start) in ns, checked before any trace is read: text that
    is not two numbers, or a window that ends where or before it starts, is refused in one line."""
    if text is None:
        return None
    start, _, end = text.partition(":")
    try:
        first, last = int(float(start) * 1e6), int(float(end) * 1e6)
    except (ValueError, OverflowError):  # not numbers, or nan / inf
        raise PipebubbleError(f"--window expects START:END in ms, e.g. --window 100:250, not {text!r}") from None
    if last == first:
        raise PipebubbleError(f"--window {text} is empty: it ends where it starts (START:END in ms, END after START)")
    if last < first:
        raise PipebubbleError(f"--window {text} ends before it starts ({end.strip()} ms is before {start.strip()} "
                              f"ms); did you mean --window {end.strip()}:{start.strip()}?")
    return first, last


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(analyze)
