"""`pipebubble check`: fail a build when the bubble, utilization, waits or serving slowdown cross a threshold."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from pipebubble.cli.analyze import StageBy
from pipebubble.cli.output import report_warnings, warn, write_text

GATES = "Gates"
ANALYSIS = "Analysis (traces only)"


class Format(str, Enum):
    text = "text"
    json = "json"
    junit = "junit"
    github = "github"


def _gate(flag: str, text: str) -> Any:
    return typer.Option(flag, help=text, rich_help_panel=GATES)


ConfigOpt = Annotated[Path | None, typer.Option("--config", help="Settings file (default: pipebubble.toml or "
                                                "tool.pipebubble in pyproject.toml, searched upward).")]
OutputOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.")]
StageByOpt = Annotated[StageBy | None, typer.Option(help="What a stage is.", rich_help_panel=ANALYSIS)]
StageOpt = Annotated[list[str] | None, typer.Option(help="Stage NAME=REGEX over lane ids (repeat, in order).",
                                                    rich_help_panel=ANALYSIS)]
PpSizeOpt = Annotated[int | None, typer.Option(help="Pipeline-parallel size when ranks also do TP/DP.",
                                               rich_help_panel=ANALYSIS)]
MicrobatchOpt = Annotated[str | None, typer.Option(help="Regex with named groups phase, mb (custom labels).",
                                                   rich_help_panel=ANALYSIS)]
StepRegexOpt = Annotated[str | None, typer.Option(help="Regex for engine step labels (serving traces).",
                                                  rich_help_panel=ANALYSIS)]
NoCacheOpt = Annotated[bool, typer.Option("--no-cache", help="Decode again; ignore the span cache.",
                                          rich_help_panel=ANALYSIS)]


def settings(cfg, stage_by: StageBy | None, stage: list[str] | None, pp_size: int | None,
             microbatch_regex: str | None, step_regex: str | None) -> dict[str, Any]:
    """The config's [stages] table with the flags that were given on top."""
    flags = {"stage_by": stage_by.value if stage_by else None, "stage": stage or None, "pp_size": pp_size,
             "microbatch_regex": microbatch_regex, "step_regex": step_regex}
    return {**cfg.stages, **{key: value for key, value in flags.items() if value is not None}}


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
    config: ConfigOpt = None,
    format: Annotated[Format, typer.Option("--format", "-f", help="text, json, junit (XML for CI test "
                                           "reports) or github (workflow annotations).")] = Format.text,
    output: OutputOpt = None,
    stage_by: StageByOpt = None,
    stage: StageOpt = None,
    pp_size: PpSizeOpt = None,
    microbatch_regex: MicrobatchOpt = None,
    step_regex: StepRegexOpt = None,
    no_cache: NoCacheOpt = False,
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
    from pipebubble.baseline import load_report
    from pipebubble.gates import check as run_gates
    from pipebubble.render.gates import render_check

    cfg = configuration.load(config)
    flags = {"max_bubble": max_bubble, "max_excess_bubble": max_excess_bubble, "min_utilization": min_utilization,
             "max_stage_cv": max_stage_cv, "max_imbalance": max_imbalance, "max_wait_ms": max_wait_ms,
             "max_decode_slowdown": max_decode_slowdown}
    thresholds = {**cfg.thresholds, **{key: value for key, value in flags.items() if value is not None}}
    if not thresholds:
        raise typer.BadParameter("no gates: give a threshold such as --max-bubble 0.3, or a [check] table in "
                                 "pipebubble.toml")
    report = load_report(paths, settings(cfg, stage_by, stage, pp_size, microbatch_regex, step_regex), not no_cache)
    warn(report_warnings(report))
    gates = run_gates(report, thresholds)
    write_text(render_check(gates, format.value), output)
    if any(gate.status == "fail" for gate in gates):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(check)
