"""`pipebubble diff`: compare a run with a baseline and fail on a regression beyond the tolerance."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.cli.output import read_warnings, warn, write_text
from pipebubble.options import Options, Scale
from pipebubble.render import formats

Format = formats.choices("diff")


@flags.analysing
def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: a saved JSON report, a trace file or a folder.")],
    new: Annotated[Path, typer.Argument(help="The run to judge: a saved JSON report, a trace file or a folder.")],
    tolerance: Annotated[str | None, typer.Option(help="Relative worsening allowed, e.g. 5% or 0.05 "
                                                  "(default: the diff table of pipebubble.toml, else 5%).")] = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="text, markdown (e.g. a PR comment) or "
                                           "json.")] = Format.text,
    output: flags.Output = None,
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
) -> None:
    """Per stage (matched by index) busy/fill/drain/idle, bubble, step time, stage-time CV, imbalance, lanes
    (matched by id) and new or grown waits. Exit 1 naming each metric that worsened by more than the
    tolerance, 0 otherwise, 2 for bad input.

    Examples:

      pipebubble analyze runs/main/ --format json -o baseline.json

      pipebubble diff baseline.json runs/pr123/

      pipebubble diff baseline.json runs/pr123/ --tolerance 10% --format markdown -o diff.md
    """
    from pipebubble import config as configuration
    from pipebubble.gates import diff as compare
    from pipebubble.render.gates import render_diff
    from pipebubble.run import run

    cfg = configuration.load(config)
    try:
        allowed = configuration.parse_fraction(tolerance) if tolerance is not None else cfg.tolerance
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tolerance") from None
    before, after = run([base], options, scale), run([new], options, scale)
    warn(read_warnings(before, [base]) + read_warnings(after, [new]))
    result = compare(before.to_dict(), after.to_dict(), 0.05 if allowed is None else allowed)
    write_text(render_diff(result, format.value), output)
    if result.regressions:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(diff)
