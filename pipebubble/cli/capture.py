"""`pipebubble capture`: profile a command (or a bundled workload) with torch.profiler."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from pipebubble.cli import flags

EXAMPLES = """Examples:

  pipebubble capture -- python train.py --epochs 1

  pipebubble capture -o traces/ddp -- torchrun --nproc-per-node 2 train.py

  pipebubble capture --mode run -- python -m mypkg.serve

  pipebubble capture --workload pipeline --schedule 1f1b --stages 4 --microbatches 8 -o traces/1f1b

  pipebubble capture --workload serve --chunked-prefill 256 -o traces/serve --analyze

  pipebubble capture --workload serve --async --device cuda -o traces/serve_async
"""

HELP = """Profile an unmodified `python script.py`, `python -m pkg` or `torchrun ...` job (one trace per rank,
DIR/rank{R}.pt.trace.json.gz, plus DIR/capture.json), or a bundled workload. By default a few optimizer steps
after a warm-up are profiled; --mode run profiles the whole run. The command's exit code is kept. Its output
reaches the terminal as it would without capture, but for the profiler's own messages: they go to
DIR/capture.log."""


#: What a capture writes (``capture.metadata.METADATA_NAME``, ``capture.runner.TRACE_PATTERN``), named here too
#: so that an earlier capture is refused before the capture package (which needs torch) is loaded.
EARLIER_CAPTURE = ("capture.json", "rank*.pt.trace.json.gz")


def register(app: typer.Typer) -> None:
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("capture", help=HELP, epilog=EXAMPLES, context_settings=settings,
                options_metavar="[OPTIONS] [-- COMMAND...]")(capture)


Opt = typer.Option


def capture(
    ctx: typer.Context,
    output: flags.OutputDir = Path("pipebubble_trace"),
    mode: Annotated[str, Opt(help="steps: optimizer steps after warm-up; run: the whole run.")] = "steps",
    wait: Annotated[int, Opt(help="Optimizer steps to skip first (as torch.profiler.schedule).")] = 1,
    warmup: Annotated[int, Opt(help="Steps profiled but thrown away.")] = 1,
    active: Annotated[int, Opt(help="Steps recorded.")] = 2,
    record_shapes: Annotated[bool, Opt("--record-shapes/--no-record-shapes", help="Record operator input "
                                       "shapes and FLOPs (record_shapes, with_flops): what FLOPs, MFU and the "
                                       "roofline are computed from.")] = True,
    no_memory: Annotated[bool, Opt("--no-memory", help="Do not record allocator memory (\\[memory] events of "
                                   "every allocation and free, on by default).")] = False,
    analyze: Annotated[bool, Opt("--analyze", help="Run `pipebubble analyze` on the traces.")] = False,
    force: Annotated[bool, Opt("--force", help="Replace an earlier capture in the output folder (its traces, "
                               "capture.json and capture.log are deleted first).")] = False,
    width: flags.Width = None,
    quiet: flags.Quiet = False,
    workload: Annotated[str | None, Opt(help="Bundled workload instead of a command: pipeline | serve "
                                             "(serve is profiled whole, as --mode run).")] = None,
    schedule: Annotated[str, Opt(help="pipeline: gpipe | 1f1b | interleaved_1f1b | zero_bubble.")] = "1f1b",
    stages: Annotated[int, Opt(help="pipeline: ranks (stages per rank: 2 when interleaved).")] = 4,
    microbatches: Annotated[int, Opt(help="pipeline: micro-batches per step.")] = 8,
    batch: Annotated[int | None, Opt(help="pipeline: the global batch in rows, split evenly into the micro-batches "
                                     "\\[default: 32 rows per micro-batch].")] = None,
    imbalance: Annotated[float, Opt(help="pipeline: the last stage does this many times the work.")] = 1.0,
    hidden: Annotated[int, Opt(help="pipeline: model width.")] = 1024,
    layers: Annotated[int, Opt(help="pipeline: MLP blocks in the whole model.")] = 8,
    device: Annotated[str, Opt(help="Workload device: cpu | cuda.")] = "cpu",
    chunked_prefill: Annotated[int, Opt(help="serve: token budget per step (0: chunked prefill off).")] = 0,
    requests: Annotated[int, Opt(help="serve: requests to serve.")] = 32,
    arrival_rate: Annotated[float, Opt(help="serve: new requests per engine step (0.25: one every 4 steps); "
                                       "counted in steps, not seconds, so every run schedules alike.")] = 0.25,
    async_steps: Annotated[bool, Opt("--async", help="serve: launch each step without waiting for it and read "
                                     "its tokens back after the next is launched (vLLM V1 async scheduling); "
                                     "on a GPU the step ranges close before their kernels run.")] = False,
) -> None:
    _refuse_earlier(output, force)  # before the capture package loads: it needs torch, a refusal does not
    from pipebubble.capture import CaptureOptions
    from pipebubble.capture import capture as run_capture
    from pipebubble.capture.progress import Lines, describe
    from pipebubble.capture.workloads import WorkloadSettings, workload_command
    from pipebubble.errors import CaptureError

    command, about = list(ctx.args), None
    if command and command[0].startswith("-"):
        raise CaptureError(f"unknown option {command[0]!r}; put the command to profile after `--`")
    options = CaptureOptions(output, mode, wait, warmup, active, record_shapes, profile_memory=not no_memory)
    if workload is not None:
        if command:
            raise CaptureError("give either --workload or a command after `--`, not both")
        settings = WorkloadSettings(schedule, stages, microbatches, imbalance, hidden, layers, device,
                                    chunked_prefill, requests, arrival_rate, async_steps, batch)
        command, about, options = workload_command(workload, settings, options)
    lines = Lines(options)
    progress = None if quiet else lambda states: [f"pipebubble: {line}" for line in lines.update(states)]
    result = run_capture(command, options, about, on_progress=progress,
                         on_start=lambda: _say(quiet, describe(command, options, about, _shown(output))))
    _say(quiet, *lines.due(everything=True))
    for warning in result.warnings:
        typer.echo(f"pipebubble: warning: {warning}", err=True)
    _say(quiet, _wrote(result, output))
    code = _analyze(ctx, result.traces, width, quiet) if analyze and result.traces else 0
    raise typer.Exit(result.exit_code or code)


def _refuse_earlier(output: Path, force: bool) -> None:
    """A folder that holds an earlier capture is written over only with --force; else one line naming it."""
    from pipebubble.errors import CaptureError

    if force or not output.is_dir():
        return
    metadata, pattern = EARLIER_CAPTURE
    found = [metadata] if (output / metadata).exists() else []
    traces = len(list(output.glob(pattern)))
    if traces:
        found.append(f"{traces} trace{'s' if traces != 1 else ''}")
    if found:
        raise CaptureError(f"{_shown(output)} holds an earlier capture ({', '.join(found)}): --force replaces it, "
                           "or choose another --output")


def _say(quiet: bool, *lines: str) -> None:
    if not quiet:
        for line in lines:
            print(f"pipebubble: {line}", file=sys.stderr, flush=True)


def _shown(path: Path) -> str:
    """A folder as the user would type it: relative when under the working directory."""
    try:
        shown = path.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = path
    return f"{shown}/" if str(shown) != "." else "./"


def _wrote(result, output: Path) -> str:
    """`wrote 4 traces (1.9 MB) and capture.json to out/; the profiler's messages are in out/capture.log`."""
    from pipebubble.cli.output import human_bytes

    n = len(result.traces)
    size = human_bytes(sum(t.stat().st_size for t in result.traces))
    traces = f"{n} trace{'s' if n != 1 else ''} ({size})" if n else "no trace"
    text = f"wrote {traces} and {result.metadata.name} to {_shown(output)}"
    if result.log is not None:
        loud = f", {result.log_warnings} of them warnings" if result.log_warnings else ""
        text += f"; the profiler's messages{loud} are in {_shown(output)}{result.log.name}"
    return text


def _analyze(ctx: typer.Context, traces, width: int | None, quiet: bool) -> int:
    # Through the app itself, so this stays whatever `pipebubble analyze FILES...` does.
    root = ctx.find_root().command
    args = ["analyze", *map(str, traces), *(["--width", str(width)] if width else []), *(["--quiet"] if quiet else [])]
    code = root.main(args, prog_name="pipebubble", standalone_mode=False)
    return code if isinstance(code, int) else 0
