"""Run a command with the profiling hook injected, keep its exit code, and gather what its processes wrote.

The parent never imports torch: the child program does, in whatever interpreter it uses, and the
sitecustomize in `inject/` (first on the child's PYTHONPATH) starts torch.profiler there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipebubble.errors import CaptureError

INJECT_DIR = Path(__file__).resolve().parent / "inject"
CONFIG_ENV = "PIPEBUBBLE_CAPTURE"
OWNER_ENV = "PIPEBUBBLE_CAPTURE_OWNER"
METADATA_NAME = "capture.json"
MODES = ("steps", "run")

_PROBLEMS = {
    "own_profiler": "rank {rank}: the program runs its own torch.profiler, so pipebubble stepped aside and "
    "wrote no trace; analyse the trace the program writes, or remove its profiler",
    "before_active": "rank {rank}: {detail} before the profiled window (wait {wait} + warmup {warmup} steps); "
    "lower --wait/--warmup, or use --mode run for a program without an optimizer",
    "partial": "rank {rank}: {detail}; the trace holds fewer steps than --active asked for",
    "flush_failed": "rank {rank}: writing the trace failed: {detail}",
}


@dataclass(frozen=True)
class CaptureOptions:
    out: Path
    mode: str = "steps"  # steps: a few optimizer steps after warm-up; run: the whole run
    wait: int = 1
    warmup: int = 1
    active: int = 2
    record_shapes: bool = False
    only_ranks: bool = False  # profile only processes with RANK set (the command is a launcher)


@dataclass(frozen=True)
class CaptureResult:
    exit_code: int
    traces: tuple[Path, ...]
    metadata: Path
    warnings: tuple[str, ...] = field(default_factory=tuple)


def capture(command: Sequence[str], options: CaptureOptions, about: dict | None = None) -> CaptureResult:
    """Run `command` under the profiler; returns its exit code, the traces written and any warnings."""
    _check(command, options)
    out = options.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    _clear_previous(out)
    exit_code = _run(command, _child_env(out, options))
    statuses = _collect_statuses(out)
    traces = tuple(sorted(out.glob("rank*.pt.trace.json.gz"), key=_rank_of))
    warnings = _warnings(statuses, options, exit_code)
    metadata = out / METADATA_NAME
    metadata.write_text(json.dumps(_metadata(command, options, exit_code, statuses, about), indent=2) + "\n")
    if not traces and exit_code == 0:
        raise CaptureError("; ".join(warnings) or "the command wrote no trace")
    return CaptureResult(exit_code, traces, metadata, tuple(warnings))


def _check(command: Sequence[str], options: CaptureOptions) -> None:
    if not command:
        raise CaptureError("no command to profile: put it after `--`, e.g. pipebubble capture -- python train.py")
    if options.mode not in MODES:
        raise CaptureError(f"--mode must be one of {', '.join(MODES)}, not {options.mode!r}")
    if min(options.wait, options.warmup) < 0 or options.active < 1:
        raise CaptureError("--wait and --warmup must be >= 0 and --active >= 1")


def _clear_previous(out: Path) -> None:
    # Only our own file names: stale ranks from an earlier, wider capture would otherwise mix in.
    for pattern in ("rank*.pt.trace.json.gz", ".rank*.status.json", ".rank*.partial.json.gz", METADATA_NAME):
        for path in out.glob(pattern):
            path.unlink()


def _child_env(out: Path, options: CaptureOptions) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(OWNER_ENV, None)
    config = {k: v for k, v in asdict(options).items() if k != "out"} | {"out": str(out)}
    env[CONFIG_ENV] = json.dumps(config)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(INJECT_DIR), env.get("PYTHONPATH")) if p)
    return env


def _run(command: Sequence[str], env: dict[str, str]) -> int:
    """Start the child in its own session, so a terminal Ctrl-C reaches it once, forwarded by us."""
    try:
        child = subprocess.Popen(list(command), env=env, start_new_session=True)
    except OSError as exc:
        raise CaptureError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
    forward = {sig: signal.signal(sig, lambda s, f: child.send_signal(s)) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = child.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


def _rank_of(path: Path) -> int:
    digits = path.name.split(".")[0].removeprefix(".rank").removeprefix("rank")
    return int(digits) if digits.isdigit() else -1


def _collect_statuses(out: Path) -> list[dict]:
    statuses = []
    for path in sorted(out.glob(".rank*.status.json"), key=_rank_of):
        statuses.append(json.loads(path.read_text()))
        path.unlink()
    return statuses


def _warnings(statuses: list[dict], options: CaptureOptions, exit_code: int) -> list[str]:
    if not statuses:
        return ["no process of the command imported torch (or it ignores PYTHONPATH, e.g. python -E/-I), "
                "so nothing was profiled"]
    found = []
    for status in statuses:
        if status["problem"]:
            kind, _, detail = status["problem"].partition(": ")
            template = _PROBLEMS.get(kind, "rank {rank}: {detail}")
            found.append(template.format(rank=status["rank"], detail=detail, wait=options.wait,
                                         warmup=options.warmup))
    return found


def _portable(command: Sequence[str]) -> list[str]:
    # The bundled workloads run under this interpreter; its install path says nothing about the capture.
    return ["python" if arg == sys.executable else arg for arg in command]


def _metadata(command, options, exit_code, statuses, about) -> dict:
    first = statuses[0] if statuses else {}
    return {
        "tool": "pipebubble capture",
        "command": _portable(command),
        "exit_code": exit_code,
        "mode": options.mode,
        "schedule": {"wait": options.wait, "warmup": options.warmup, "active": options.active},
        "record_shapes": options.record_shapes,
        "torch": first.get("torch"),
        "world_size": first.get("world_size", len(statuses) or None),
        "python": sys.version.split()[0],
        "ranks": [{k: s[k] for k in ("rank", "devices", "optimizer_steps", "trace", "problem")} for s in statuses],
        **({"workload": about} if about else {}),
    }
