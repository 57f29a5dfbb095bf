"""`pipebubble capture`: profile a command (or a bundled workload) with torch.profiler."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

EXAMPLES = """Examples:

  pipebubble capture -- python train.py --epochs 1

  pipebubble capture --out traces/ddp -- torchrun --nproc-per-node 2 train.py

  pipebubble capture --mode run -- python -m mypkg.serve

  pipebubble capture --workload pipeline --schedule 1f1b --stages 4 --microbatches 8 --out traces/1f1b

  pipebubble capture --workload serve --chunked-prefill 256 --out traces/serve --analyze

  pipebubble capture --workload serve --async --device cuda --out traces/serve_async
"""

HELP = """Profile an unmodified `python script.py`, `python -m pkg` or `torchrun ...` job (one trace per rank,
DIR/rank{R}.pt.trace.json.gz, plus DIR/capture.json), or a bundled workload. By default a few optimizer steps
after a warm-up are profiled; --mode run profiles the whole run. The command's exit code is kept."""


def register(app: typer.Typer) -> None:
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}
    app.command("capture", help=HELP, epilog=EXAMPLES, context_settings=settings,
                options_metavar="[OPTIONS] [-- COMMAND...]")(capture)


Opt = typer.Option


def capture(
    ctx: typer.Context,
    out: Annotated[Path, Opt("--out", "-o", help="Folder for the traces.")] = Path("pipebubble_trace"),
    mode: Annotated[str, Opt(help="steps: optimizer steps after warm-up; run: the whole run.")] = "steps",
    wait: Annotated[int, Opt(help="Optimizer steps to skip first (as torch.profiler.schedule).")] = 1,
    warmup: Annotated[int, Opt(help="Steps profiled but thrown away.")] = 1,
    active: Annotated[int, Opt(help="Steps recorded.")] = 2,
    record_shapes: Annotated[bool, Opt("--record-shapes", help="Record operator input shapes.")] = False,
    analyze: Annotated[bool, Opt("--analyze", help="Run `pipebubble analyze` on the traces.")] = False,
    workload: Annotated[str | None, Opt(help="Bundled workload instead of a command: pipeline | serve "
                                             "(serve is profiled whole, as --mode run).")] = None,
    schedule: Annotated[str, Opt(help="pipeline: gpipe | 1f1b | interleaved_1f1b | zero_bubble.")] = "1f1b",
    stages: Annotated[int, Opt(help="pipeline: ranks (stages per rank: 2 when interleaved).")] = 4,
    microbatches: Annotated[int, Opt(help="pipeline: micro-batches per step.")] = 8,
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
    from pipebubble.capture import CaptureOptions
    from pipebubble.capture import capture as run_capture
    from pipebubble.capture.workloads import WorkloadSettings, workload_command
    from pipebubble.errors import CaptureError

    command, about = list(ctx.args), None
    if command and command[0].startswith("-"):
        raise CaptureError(f"unknown option {command[0]!r}; put the command to profile after `--`")
    options = CaptureOptions(out, mode, wait, warmup, active, record_shapes)
    if workload is not None:
        if command:
            raise CaptureError("give either --workload or a command after `--`, not both")
        settings = WorkloadSettings(schedule, stages, microbatches, imbalance, hidden, layers, device,
                                    chunked_prefill, requests, arrival_rate, async_steps)
        command, about, options = workload_command(workload, settings, options)
    result = run_capture(command, options, about)
    for warning in result.warnings:
        typer.echo(f"pipebubble: warning: {warning}", err=True)
    typer.echo(f"wrote {len(result.traces)} trace(s) and {result.metadata.name} to {result.metadata.parent}", err=True)
    code = _analyze(ctx, result.traces) if analyze and result.traces else 0
    raise typer.Exit(result.exit_code or code)


def _analyze(ctx: typer.Context, traces) -> int:
    # Through the app itself, so this stays whatever `pipebubble analyze FILES...` does.
    root = ctx.find_root().command
    code = root.main([str(path) for path in ("analyze", *traces)], prog_name="pipebubble", standalone_mode=False)
    return code if isinstance(code, int) else 0
