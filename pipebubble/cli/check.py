"""`pipebubble check`: fail a build when the bubble, utilization, waits or serving slowdown cross a threshold."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.cli.output import check_output, read_warnings, warn, write_text
from pipebubble.options import Options, Scale


@flags.analysing
def check(
    paths: Annotated[list[Path], typer.Argument(help="Trace files, folders of per-rank traces, or one saved "
                                                "JSON report.")],
    max_bubble: flags.MaxBubble = None,
    max_excess_bubble: flags.MaxExcessBubble = None,
    min_utilization: flags.MinUtilization = None,
    max_stage_cv: flags.MaxStageCv = None,
    max_imbalance: flags.MaxImbalance = None,
    max_wait_ms: flags.MaxWaitMs = None,
    max_decode_slowdown: flags.MaxDecodeSlowdown = None,
    max_finding: flags.MaxFinding = None,
    max_ttft_p99: flags.MaxTtftP99 = None,
    max_tpot_p99: flags.MaxTpotP99 = None,
    max_queue_p99: flags.MaxQueueP99 = None,
    max_preemptions: flags.MaxPreemptions = None,
    strict: flags.Strict = False,
    allow_partial: flags.AllowPartial = False,
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
    format: flags.GateFormatOpt = flags.GateFormat.text,
    output: flags.Output = None,
    timeunit: flags.TimeUnitOpt = flags.TimeUnit.ms,
    quiet: flags.Quiet = False,
) -> None:
    """Gate a run: each gate with its measured value, threshold and PASS/FAIL/SKIP (SKIP: the trace lacks the
    metric, e.g. --max-bubble on a trace that is not a pipeline; --strict makes that a failure). An incomplete
    input (a file cut off, ranks missing) fails first, unless --allow-partial. Fractions take 0.3 or 30%. Exit 0
    when all pass, 1 when any fails, 2 for bad input. Flags win over the check table of pipebubble.toml.

    Examples:

      pipebubble check runs/step42/ --max-bubble 30% --max-imbalance 1.2

      pipebubble check report.json --max-wait-ms 50 --format junit -o pipebubble.xml

      pipebubble check traces/ --format github --strict   # thresholds from pipebubble.toml
    """
    import pipebubble
    from pipebubble import config as configuration
    from pipebubble.render.gates import warnings
    from pipebubble.run import run

    given = {"max_bubble": max_bubble, "max_excess_bubble": max_excess_bubble, "min_utilization": min_utilization,
             "max_stage_cv": max_stage_cv, "max_imbalance": max_imbalance, "max_wait_ms": max_wait_ms,
             "max_decode_slowdown": max_decode_slowdown, "max_finding": max_finding, "max_ttft_p99": max_ttft_p99,
             "max_tpot_p99": max_tpot_p99, "max_queue_p99": max_queue_p99, "max_preemptions": max_preemptions}
    from pipebubble.render import formats

    check_output("check", formats.pick("check", format.value, output), output)
    thresholds = flags.thresholds(given, configuration.load(config))
    started, clock = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"), time.monotonic()
    report = run(paths, options, scale)
    warn(read_warnings(report, paths))
    result = replace(pipebubble.check(report, **thresholds, strict=strict, allow_partial=allow_partial,
                                               config=config), source=_source(paths),
                     timestamp=started, seconds=time.monotonic() - clock)
    warn(warnings(result))
    write_text(result.render(format.value, timeunit.value), output, quiet)
    if not result:
        raise typer.Exit(1)


def _source(paths: list[Path]) -> str:
    """What the annotations point at: the one path given, else the folder that holds them all."""
    try:
        return str(paths[0]) if len(paths) == 1 else os.path.commonpath([str(p) for p in paths]) or "."
    except ValueError:  # absolute and relative paths mixed
        return str(paths[0])


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(check)
