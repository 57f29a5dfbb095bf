"""`pipebubble diff`: compare a run with a baseline and fail on a regression beyond the tolerance."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.cli.output import check_output, read_warnings, warn, write_text
from pipebubble.errors import PipebubbleError
from pipebubble.options import Options, Scale


@flags.analysing
def diff(
    base: Annotated[Path, typer.Argument(help="Baseline: a saved JSON report, a trace file or a folder.")],
    new: Annotated[Path, typer.Argument(help="The run to judge: a saved JSON report, a trace file or a folder.")],
    tolerance: flags.Tolerance = None,
    strict: flags.Strict = False,
    allow_partial: flags.AllowPartial = False,
    by: flags.DiffBy = None,
    max_op_regression: flags.MaxOpRegression = None,
    format: flags.GateFormatOpt = flags.GateFormat.text,
    output: flags.Output = None,
    timeunit: flags.TimeUnitOpt = flags.TimeUnit.ms,
    quiet: flags.Quiet = False,
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
) -> None:
    """The pipeline (bubble, step time, CV, imbalance), each stage (by number), lane, GPU, collective wait and
    top kernel (by rank, device, stream and thread order, never PID; streams whose ids differ by order of first
    use), and each wait (by step, stage, cause, neighbours and order). Exit 1 naming each metric that worsened
    by more than the tolerance of its baseline value, 0 otherwise (improvements are listed too), 2 for bad
    input. An incomplete input (a file cut off, fewer ranks or steps than the baseline) fails unless
    --allow-partial, and its changes are never improvements. README "CI gates" defines "worse".

    --by op lists the operators instead: CPU operators and GPU kernels added, removed or changed (count, or
    time beyond --tolerance), per step where both inputs mark steps; exit 0 unless --max-op-regression is
    given and an operator's time grew beyond it (--by kernel: GPU kernels alone).

    Examples:

      pipebubble analyze runs/main/ --format json -o baseline.json

      pipebubble diff baseline.json runs/pr123/

      pipebubble diff baseline.json runs/pr123/ --tolerance 10% --format markdown -o diff.md

      pipebubble diff baseline.json runs/pr123/ --by op --max-op-regression 20%
    """
    import pipebubble
    from pipebubble import config as configuration
    from pipebubble.render.gates import warnings
    from pipebubble.run import run

    flags.tolerance(tolerance, configuration.load(config))  # a bad tolerance fails here, before any analysis
    if max_op_regression is not None:
        flags.tolerance(max_op_regression, configuration.load(config), "--max-op-regression")
        if by is None:
            raise PipebubbleError("--max-op-regression: compares operators, give --by op or --by kernel")
    started, clock = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"), time.monotonic()
    from pipebubble.render import formats

    check_output("diff", formats.pick("diff", format.value, output), output)
    before, after = run([base], options, scale), run([new], options, scale)
    warn(read_warnings(before, [base]) + read_warnings(after, [new]))
    for path, report in ((base, before), (new, after)):
        if not report.lanes:
            raise PipebubbleError(f"{path}: nothing to compare: the report has no lanes")
    # the flag as given (checked above, in the flag's words), the API parsing it as every caller's
    result = replace(pipebubble.diff(before, after, tolerance=tolerance, strict=strict,
                                     allow_partial=allow_partial, by=by and by.value,
                                     max_op_regression=max_op_regression, config=config),
                     base=str(base), new=str(new),
                     timestamp=started, seconds=time.monotonic() - clock)
    warn(warnings(result) if by is None else [f"input incomplete: {n}" for n in result.incomplete])
    write_text(result.render(format.value, timeunit.value), output, quiet)
    if not result:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(diff)
