"""`pipebubble analyze`: read traces, print the report."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli.output import console_wants_color, progress, warn, write_text

PIPELINE = "Pipeline"
OUTPUT = "Output"
SERVING = "LLM serving"
SCALE = "Scale"


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"
    html = "html"


class StageBy(str, Enum):
    rank = "rank"
    device = "device"
    process = "process"
    stream = "stream"


def analyze(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders of per-rank traces.")],
    format: Annotated[
        Format | None,
        typer.Option(
            "--format", "-f", help="Output format (default: from -o's suffix, else text).", rich_help_panel=OUTPUT
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here instead of stdout.", rich_help_panel=OUTPUT)
    ] = None,
    width: Annotated[
        int | None, typer.Option(help="Columns of text output (default: the terminal's).", rich_help_panel=OUTPUT)
    ] = None,
    step: Annotated[int | None, typer.Option(help="Zoom the timeline to this step.", rich_help_panel=OUTPUT)] = None,
    window: Annotated[
        str | None, typer.Option(help="Zoom the timeline to START:END ms from its start.", rich_help_panel=OUTPUT)
    ] = None,
    lanes: Annotated[
        bool, typer.Option("--lanes", help="One timeline row per lane, not per stage.", rich_help_panel=OUTPUT)
    ] = False,
    stage_by: Annotated[
        StageBy | None,
        typer.Option(
            help="What a stage is (default: rank for a folder of ranks, device for one file of several GPUs).",
            rich_help_panel=PIPELINE,
        ),
    ] = None,
    stage: Annotated[
        list[str] | None,
        typer.Option(help="Stage NAME=REGEX over lane ids (repeat, in order).", rich_help_panel=PIPELINE),
    ] = None,
    pp_size: Annotated[
        int | None, typer.Option(help="Pipeline-parallel size when ranks also do TP/DP.", rich_help_panel=PIPELINE)
    ] = None,
    rank_order: Annotated[
        str,
        typer.Option(
            help="Rank layout for --pp-size: tp-cp-ep-dp-pp (Megatron) or pp-dp-tp.", rich_help_panel=PIPELINE
        ),
    ] = "tp-cp-ep-dp-pp",
    microbatch_regex: Annotated[
        str | None,
        typer.Option(
            help="Regex with named groups phase (F/B/W), mb and optionally chunk, for custom labels.",
            rich_help_panel=PIPELINE,
        ),
    ] = None,
    wait_threshold: Annotated[
        float, typer.Option(help="Report idle gaps longer than this fraction of the step.", rich_help_panel=PIPELINE)
    ] = 0.01,
    gpu_cost: Annotated[
        float | None,
        typer.Option(
            help="USD per GPU-hour: idle dollars and the price of a useful GPU-hour.", rich_help_panel=PIPELINE
        ),
    ] = None,
    step_regex: Annotated[
        str | None,
        typer.Option(
            help="Regex for engine step labels, named groups mode, prefill_tokens, decode_reqs (serving traces).",
            rich_help_panel=SERVING,
        ),
    ] = None,
    tbt_slo: Annotated[
        float | None,
        typer.Option(
            help="Time-between-tokens target in ms: the prefill chunk that keeps steps under it.",
            rich_help_panel=SERVING,
        ),
    ] = None,
    executor: Annotated[
        str, typer.Option(help="Where files are mapped: local (a process pool) or ray.", rich_help_panel=SCALE)
    ] = "local",
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="Ray cluster to use with --executor ray (default: start a local one).", rich_help_panel=SCALE
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Processes (or Ray CPUs) to use (default: all cores).", rich_help_panel=SCALE)
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Decode again; ignore the span cache.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Where the GPUs wait: busy/idle per GPU, stream and thread; per pipeline stage, fill/drain bubbles
    against theory, the biggest waits and what each waited for, and what-if recommendations.

    Examples:

      pipebubble analyze sample_traces/pipeline_1f1b

      pipebubble analyze runs/step42/ --gpu-cost 3.0 --width 160

      pipebubble analyze runs/ --format json | jq '.pipeline | {bubble_fraction, theoretical_bubble_fraction}'

      pipebubble analyze runs/ -o report.html

      pipebubble analyze sample_traces/serve_chunked_prefill --tbt-slo 20
    """
    from pipebubble import render
    from pipebubble.ingest import cache, find_traces
    from pipebubble.report import Report

    settings = {
        "stage_by": stage_by.value if stage_by else None,
        "stage": stage or [],
        "pp_size": pp_size,
        "rank_order": rank_order,
        "microbatch_regex": microbatch_regex,
        "wait_threshold": wait_threshold,
        "gpu_cost": gpu_cost,
        "step_regex": step_regex,
        "tbt_slo": tbt_slo,
    }
    key = None if no_cache else cache.report_key(find_traces(paths), settings)
    cached = cache.get_report(key)
    if cached is not None:
        report = Report.from_dict(cached)
    else:
        if executor not in ("local", "ray"):
            raise typer.BadParameter(f"--executor must be local or ray, not {executor!r}")
        scale = {"executor": executor, "ray_address": ray_address, "workers": workers}
        report = _build(paths, settings, scale, use_cache=not no_cache, quiet=quiet)
        cache.put_report(key, report.to_dict())
    # The cache may have turned out unusable only while the report was stored: say so once as well.
    warn([*report.ingest.warnings, *(w for w in cache.warnings() if w not in report.ingest.warnings)])
    fmt = format.value if format else (render.format_from_suffix(output) if output else None) or "text"
    try:
        text = render.render(
            report,
            fmt,
            width=width,
            color=output is None and console_wants_color(),
            step=step,
            window=_window(window),
            lanes=lanes,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    write_text(text, output)


def _build(paths: list[Path], settings: dict, scale: dict, use_cache: bool, quiet: bool):
    from pipebubble.mapreduce import Options, run

    with progress(paths, quiet) as advance:
        return run(paths, Options.from_settings(settings), use_cache=use_cache, on_file=advance, **scale)


def _window(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        return int(float(start) * 1e6), int(float(end) * 1e6)
    except ValueError:
        raise typer.BadParameter(f"--window expects START:END in ms, got {text!r}") from None


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=True)(analyze)
