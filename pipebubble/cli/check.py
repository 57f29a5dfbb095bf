"""`pipebubble check`: fail a build when the bubble, utilization, waits or serving slowdown cross a threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from pipebubble.cli import flags
from pipebubble.cli.output import read_warnings, warn, write_text
from pipebubble.options import Options, Scale
from pipebubble.render import formats

GATES = "Gates"


Format = formats.choices("check")


def _gate(flag: str, text: str) -> Any:
    return typer.Option(flag, help=text, rich_help_panel=GATES)


@flags.analysing
def check(
    paths: Annotated[list[Path], typer.Argument(help="Trace files, folders of per-rank traces, or one saved "
                                                "JSON report.")],
    max_bubble: Annotated[float | None, _gate("--max-bubble", "Most pipeline bubble fraction.")] = None,
    max_excess_bubble: Annotated[float | None, _gate("--max-excess-bubble", "Most bubble beyond the "
                                                     "schedule's theory.")] = None,
    min_utilization: Annotated[float | None, _gate("--min-utilization", "Least mean stage utilization (GPU "
                                                   "busy fraction when not a pipeline).")] = None,
    max_stage_cv: Annotated[float | None, _gate("--max-stage-cv", "Most spread of stage times.")] = None,
    max_imbalance: Annotated[float | None, _gate("--max-imbalance", "Most slowest/mean stage time.")] = None,
    max_wait_ms: Annotated[float | None, _gate("--max-wait-ms", "Longest idle gap on a stage, ms.")] = None,
    max_decode_slowdown: Annotated[float | None, _gate("--max-decode-slowdown", "Most decode step slowdown "
                                                       "when mixed with prefill.")] = None,
    config: flags.Config = None,
    options: Options = Options(),  # built from the flags by flags.analysing
    scale: Scale = Scale(),
    format: Annotated[Format, typer.Option("--format", "-f", help="text, json, junit (XML for CI test "
                                           "reports) or github (workflow annotations).")] = Format.text,
    output: flags.Output = None,
) -> None:
    """Gate a run: each gate with its measured value, threshold and PASS/FAIL/SKIP (SKIP: the trace lacks the
    metric, e.g. --max-bubble on a trace that is not a pipeline). Exit 0 when all pass, 1 when any fails,
    2 for bad input. Flags win over the check table of pipebubble.toml.

    Examples:

      pipebubble check runs/step42/ --max-bubble 0.3 --max-imbalance 1.2

      pipebubble check report.json --max-wait-ms 50 --format junit -o pipebubble.xml

      pipebubble check traces/ --format github   # thresholds from pipebubble.toml
    """
    from pipebubble import config as configuration
    from pipebubble.gates import check as run_gates
    from pipebubble.render.gates import render_check
    from pipebubble.run import run

    cfg = configuration.load(config)
    given = {"max_bubble": max_bubble, "max_excess_bubble": max_excess_bubble, "min_utilization": min_utilization,
             "max_stage_cv": max_stage_cv, "max_imbalance": max_imbalance, "max_wait_ms": max_wait_ms,
             "max_decode_slowdown": max_decode_slowdown}
    thresholds = {**cfg.thresholds, **{key: value for key, value in given.items() if value is not None}}
    if not thresholds:
        raise typer.BadParameter("no gates: give a threshold such as --max-bubble 0.3, or a [check] table in "
                                 "pipebubble.toml")
    report = run(paths, options, scale)
    warn(read_warnings(report, paths))
    gates = run_gates(report.to_dict(), thresholds)
    write_text(render_check(gates, format.value), output)
    if any(gate.status == "fail" for gate in gates):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(check)
