"""`pipebubble export`: the traces, annotated with the analysis, for ui.perfetto.dev (or any Chrome JSON viewer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags
from pipebubble.errors import PipebubbleError
from pipebubble.render import formats


def export(
    paths: flags.Paths,
    output: Annotated[Path, typer.Option("--output", "-o", help="out.pftrace (Perfetto protobuf) or out.json.")],
    config: flags.Config = None,
    stage_by: flags.StageByOpt = None,
    stage: flags.StageRules = None,
    pp_size: flags.PpSize = None,
    rank_order: flags.RankOrder = None,
    microbatch_regex: flags.MicrobatchRegex = None,
    wait_threshold: flags.WaitThreshold = None,
    step_regex: flags.StepRegex = None,
    tbt_slo: flags.TbtSlo = None,
    workers: flags.Workers = None,
    no_cache: flags.NoCache = False,
    quiet: flags.Quiet = False,
) -> None:
    """Write one trace with the original spans (a track per stage or lane), each pass, every bubble and wait
    with its cause, and a utilization counter; open it in ui.perfetto.dev.

    Examples:

      pipebubble export sample_traces/pipeline_1f1b -o 1f1b.pftrace

      pipebubble export runs/rank*.json.gz -o annotated.json
    """
    from pipebubble.cli.output import progress, warn, write_text
    from pipebubble.run import run, spans

    try:
        fmt = formats.pick("export", None, output)
    except ValueError as exc:
        raise PipebubbleError(str(exc)) from None
    options = flags.options(config, stage_by=stage_by, stage=stage, pp_size=pp_size, rank_order=rank_order,
                            microbatch_regex=microbatch_regex, wait_threshold=wait_threshold,
                            step_regex=step_regex, tbt_slo=tbt_slo)
    scale = flags.scale(workers=workers, no_cache=no_cache)
    with progress(paths, quiet) as advance:
        table = spans(paths, scale, on_file=advance)
    report = run(paths, options, scale)
    warn(report.ingest.warnings)
    write_text(fmt.render(report, formats.Options(spans=table)), output)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(export)
