"""Bundled workloads: a real torch.distributed.pipelining training step and a small continuous-batching server.

Each runs as `python -m pipebubble.capture.workloads.<name>`; this module only builds that command line,
so choosing a workload never imports torch in the calling process. What a workload needs is checked here,
before it starts, so a missing GPU or package is one error up front, not one per rank.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, replace

from pipebubble.capture.options import CaptureOptions
from pipebubble.errors import CaptureError

WORKLOADS = ("pipeline", "serve")
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zero_bubble")
# pipeline: rows per micro-batch by default, enough work per block that compute, not messaging, dominates
MICROBATCH_ROWS = 32


@dataclass(frozen=True)
class WorkloadSettings:
    schedule: str = "1f1b"
    stages: int = 4
    microbatches: int = 8
    imbalance: float = 1.0
    hidden: int = 1024
    layers: int = 8
    device: str = "cpu"
    chunked_prefill: int = 0  # token budget per step; 0 = off (whole prompts, prefill-only steps)
    requests: int = 32
    arrival_rate: float = 0.25  # new requests per engine step (deterministic, not per second)
    async_steps: bool = False  # serve: launch each step without waiting for it (vLLM V1 async scheduling)
    batch: int | None = None  # pipeline: global batch in rows (None: MICROBATCH_ROWS per micro-batch)


def workload_command(name: str, settings: WorkloadSettings,
                     options: CaptureOptions) -> tuple[list[str], dict, CaptureOptions]:
    """The command that runs workload `name`, what to record about it, and the capture options it needs."""
    if name == "pipeline":
        return _pipeline(settings, options)
    if name == "serve":
        return _serve(settings, options)
    raise CaptureError(f"unknown workload {name!r}: expected one of {', '.join(WORKLOADS)}")


def microbatch_rows(batch: int | None, microbatches: int) -> int:
    """Rows per micro-batch when a global batch of ``batch`` rows is split into ``microbatches`` (None: the
    default, MICROBATCH_ROWS each). Every micro-batch gets the same whole number of rows, at least one, so
    the schedules compare like for like."""
    if batch is None:
        return MICROBATCH_ROWS
    if batch < microbatches or batch % microbatches:
        below = max(microbatches, batch // microbatches * microbatches)
        raise CaptureError(f"--batch {batch} does not split into {microbatches} micro-batches of the same whole "
                           f"number of rows (at least 1 each): give a multiple of --microbatches, e.g. {below} "
                           f"or {below + microbatches}")
    return batch // microbatches


def _pipeline(s: WorkloadSettings, options: CaptureOptions):
    if s.async_steps:
        raise CaptureError("--async applies to --workload serve only")
    if s.schedule not in SCHEDULES:
        raise CaptureError(f"--schedule must be one of {', '.join(SCHEDULES)}, not {s.schedule!r}")
    if s.stages < 1 or s.microbatches < 1 or s.imbalance < 1 or s.hidden < 1 or s.layers < 1:
        raise CaptureError("--stages, --microbatches, --hidden and --layers must be >= 1, --imbalance >= 1")
    batch = s.microbatches * microbatch_rows(s.batch, s.microbatches)
    _check_device(s.device, gpus=s.stages, who="the pipeline workload (one GPU per rank)")
    _check_numpy("the pipeline workload", "torch.distributed's recv_object_list, with which its stages agree on "
                 "shapes, uses numpy")
    steps = options.wait + options.warmup + options.active if options.mode == "steps" else 2
    command = [sys.executable, "-m", "pipebubble.capture.workloads.pipeline", "--schedule", s.schedule,
               "--stages", str(s.stages), "--microbatches", str(s.microbatches), "--imbalance", str(s.imbalance),
               "--batch", str(batch), "--hidden", str(s.hidden), "--layers", str(s.layers), "--device", s.device,
               "--steps", str(steps)]
    keys = ("schedule", "stages", "microbatches", "imbalance", "hidden", "layers", "device")
    about = {"name": "pipeline", **{k: asdict(s)[k] for k in keys}, "batch": batch, "steps": steps}
    # The command is a launcher: only its rank processes are profiled.
    return command, about, replace(options, only_ranks=True)


def _serve(s: WorkloadSettings, options: CaptureOptions):
    if s.batch is not None:
        raise CaptureError("--batch applies to --workload pipeline only")
    if s.requests < 1 or s.arrival_rate <= 0 or s.chunked_prefill < 0:
        raise CaptureError("--requests must be >= 1, --arrival-rate > 0 and --chunked-prefill >= 0")
    _check_device(s.device, gpus=1, who="the serve workload")
    _check_numpy("the serve workload")
    command = [sys.executable, "-m", "pipebubble.capture.workloads.serve", "--requests", str(s.requests),
               "--arrival-rate", str(s.arrival_rate), "--chunked-prefill", str(s.chunked_prefill),
               "--device", s.device, *(["--async"] if s.async_steps else [])]
    about = {"name": "serve", "requests": s.requests, "arrival_rate": s.arrival_rate,
             "chunked_prefill": s.chunked_prefill, "device": s.device, "async": s.async_steps}
    # A server has no optimizer steps to count: profile the whole run.
    return command, about, replace(options, mode="run")


def _check_device(device: str, gpus: int, who: str) -> None:
    if device not in ("cpu", "cuda"):
        raise CaptureError(f"--device must be cpu or cuda, not {device!r}")
    if device == "cuda" and (found := _cuda_devices()) < gpus:
        why = " (torch.cuda.is_available() is False: no NVIDIA driver, or a CPU build of torch)" if not found else ""
        raise CaptureError(f"--device cuda: {who} needs {gpus} GPU{'s' if gpus > 1 else ''}, torch sees {found}"
                           f"{why}; use --device cpu" + (" or fewer --stages" if found and gpus > 1 else ""))


def _cuda_devices() -> int:
    """The GPUs torch sees, asked in a child process (this one never imports torch): the workload's ranks
    would otherwise each find out, and each fail alike."""
    probe = "import torch; print(torch.cuda.device_count())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPEBUBBLE_CAPTURE")}
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CaptureError(f"--device cuda: cannot ask torch how many GPUs it sees ({exc})") from None
    if done.returncode != 0 or not done.stdout.strip().isdigit():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise CaptureError(f"--device cuda: cannot ask torch how many GPUs it sees: {last}")
    return int(done.stdout.strip())


def _check_numpy(who: str, why: str = "") -> None:
    # The workloads run in this interpreter, so what it lacks they lack.
    if importlib.util.find_spec("numpy") is None:
        because = f" ({why})" if why else ""
        raise CaptureError(f"numpy is not installed, and {who} needs it{because}: pip install numpy")
