"""`pipebubble diff`: compare a run with a baseline and fail on a regression beyond the tolerance."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli.check import (
    ConfigOpt,
    MicrobatchOpt,
    NoCacheOpt,
    OutputOpt,
    PpSizeOpt,
    StageByOpt,
    StageOpt,
    StepRegexOpt,
    settings,
)
from pipebubble.cli.output import report_warnings, warn, write_text


class Format(str, Enum):
    text = "text"
    markdown = "markdown"
    json = "json"


def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: a saved JSON report, a trace file or a folder.")],
    new: Annotated[Path, typer.Argument(help="The run to judge: a saved JSON report, a trace file or a folder.")],
    tolerance: Annotated[str | None, typer.Option(help="Relative worsening allowed, e.g. 5% or 0.05 "
                                                  "(default: the diff table of pipebubble.toml, else 5%).")] = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="text, markdown (e.g. a PR comment) or "
                                           "json.")] = Format.text,
    output: OutputOpt = None,
    config: ConfigOpt = None,
    stage_by: StageByOpt = None,
    stage: StageOpt = None,
    pp_size: PpSizeOpt = None,
    microbatch_regex: MicrobatchOpt = None,
    step_regex: StepRegexOpt = None,
    no_cache: NoCacheOpt = False,
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
    from pipebubble.baseline import load_report
    from pipebubble.gates import diff as compare
    from pipebubble.render.gates import render_diff

    cfg = configuration.load(config)
    try:
        allowed = configuration.parse_fraction(tolerance) if tolerance is not None else cfg.tolerance
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tolerance") from None
    options = settings(cfg, stage_by, stage, pp_size, microbatch_regex, step_regex)
    before, after = load_report([base], options, not no_cache), load_report([new], options, not no_cache)
    warn(report_warnings(before) + report_warnings(after))
    result = compare(before, after, 0.05 if allowed is None else allowed)
    write_text(render_diff(result, format.value), output)
    if result.regressions:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(diff)
