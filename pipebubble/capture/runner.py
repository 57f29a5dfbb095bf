"""Run a command with the profiling hook injected, keep its exit code, and gather what its processes wrote.

The parent never imports torch: the child program does, in whatever interpreter it uses, and the
sitecustomize in `inject/` (first on the child's PYTHONPATH) starts torch.profiler there. The child's
output reaches the user through a relay that keeps the profiler's chatter in capture.log.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from collections.abc import Callable, Sequence
from contextlib import nullcontext, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipebubble.capture import child
from pipebubble.capture.metadata import METADATA_NAME, build_metadata, write_metadata
from pipebubble.capture.options import MODES, CaptureOptions
from pipebubble.capture.progress import PROGRESS_PATTERN, Watcher
from pipebubble.capture.relay import LOG_NAME, Relay
from pipebubble.errors import CaptureError

INJECT_DIR = Path(__file__).resolve().parent / "inject"
CONFIG_ENV = "PIPEBUBBLE_CAPTURE"
OWNER_ENV = "PIPEBUBBLE_CAPTURE_OWNER"
# "PID" or "PID:launcher": the capture process that started this one (see inject/_pipebubble_parent.py).
PARENT_ENV = "PIPEBUBBLE_CAPTURE_PARENT"
TRACE_PATTERN = "rank*.pt.trace.json.gz"
STATUS_PATTERN = ".rank*.status.json"
# What a rank leaves behind only when it dies mid-write: a trace being exported, a status being written.
LEFTOVER_PATTERNS = (".rank*.partial.json.gz", ".rank*.tmp", f".{METADATA_NAME}.tmp", PROGRESS_PATTERN)
# The last line of an error stream that names the error: `[rank1]: ModuleNotFoundError: No module named 'x'`.
_ERROR_LINE = re.compile(r"(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*)")

_PROBLEMS = {
    "own_profiler": "rank {rank}: the program runs its own torch.profiler, so pipebubble stepped aside and "
    "wrote no trace; analyse the trace the program writes, or remove its profiler",
    "before_active": "rank {rank}: {detail} before the profiled window (wait {wait} + warmup {warmup} steps); "
    "lower --wait/--warmup, or use --mode run for a program without an optimizer",
    "partial": "rank {rank}: {detail}; the trace holds fewer steps than --active asked for",
    "flush_failed": "rank {rank}: writing the trace failed: {detail}",
}


@dataclass(frozen=True)
class CaptureResult:
    exit_code: int
    traces: tuple[Path, ...]
    metadata: Path
    warnings: tuple[str, ...] = field(default_factory=tuple)
    log: Path | None = None  # the profiler's own messages, kept off the terminal (None: it said nothing)
    log_warnings: int = 0  # how many of them are warnings or errors


Progress = Callable[[list[dict]], list[str]]


def capture(command: Sequence[str], options: CaptureOptions, about: dict | None = None,
            on_progress: Progress | None = None, on_start: Callable[[], None] | None = None) -> CaptureResult:
    """Run `command` under the profiler; returns its exit code, the traces written and any warnings.
    ``on_start`` is called once everything is checked, just before the command starts; ``on_progress`` is
    given the ranks' states (rank, world_size, phase) as they change and returns the lines to show for them,
    which go to stderr between the program's lines."""
    _check(command, options)
    out = options.out.resolve()
    _prepare(out)
    relay = Relay(out / LOG_NAME)
    if on_start is not None:
        on_start()
    watcher = Watcher(out, lambda states: relay.say(on_progress(states))) if on_progress is not None else None
    with watcher or nullcontext():
        exit_code = child.run(command, _child_env(out, options), relay)
    relay.end_line()
    statuses, unreadable = _collect_statuses(out)
    _remove_leftovers(out)
    traces = tuple(sorted(out.glob(TRACE_PATTERN), key=_rank_of))
    # An unreadable status still shows that a rank profiled: "nothing was profiled" would mislead.
    found = _warnings(statuses, options, exit_code, list(relay.tail)) if statuses or not unreadable else []
    warnings = unreadable + found
    path = out / METADATA_NAME
    write_metadata(path, build_metadata(command, options, exit_code, statuses, about))
    if not traces and exit_code == 0:
        raise CaptureError("; ".join(warnings) or "the command wrote no trace")
    log = relay.log if relay.wrote_log else None
    return CaptureResult(exit_code, traces, path, tuple(warnings), log, relay.loud)


def _check(command: Sequence[str], options: CaptureOptions) -> None:
    if not command:
        raise CaptureError("no command to profile: put it after `--`, e.g. pipebubble capture -- python train.py")
    if options.mode not in MODES:
        raise CaptureError(f"--mode must be one of {', '.join(MODES)}, not {options.mode!r}")
    if min(options.wait, options.warmup) < 0 or options.active < 1:
        raise CaptureError("--wait and --warmup must be >= 0 and --active >= 1")
    if shutil.which(command[0]) is None:  # said now, before anything starts or is written
        why = "not found on PATH" if os.sep not in command[0] else (
            "not executable" if os.path.exists(command[0]) else "no such file")
        raise CaptureError(f"cannot start {command[0]!r}: {why}")


def _prepare(out: Path) -> None:
    """Create the output folder and empty it of an earlier capture, or say in one line why not."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        _clear_previous(out)
    except OSError as exc:
        raise CaptureError(f"cannot write the traces to {out}: {exc.strerror or exc}") from exc


def _clear_previous(out: Path) -> None:
    # Only our own file names: stale ranks from an earlier, wider capture would otherwise mix in.
    for pattern in (TRACE_PATTERN, STATUS_PATTERN, *LEFTOVER_PATTERNS, METADATA_NAME, LOG_NAME):
        for path in out.glob(pattern):
            path.unlink(missing_ok=True)


def _remove_leftovers(out: Path) -> None:
    """Delete what ranks that died mid-write left (half-exported traces, half-written statuses).

    They are hidden and never named like a trace, but nothing will ever finish them."""
    for pattern in LEFTOVER_PATTERNS:
        for path in out.glob(pattern):
            with suppress(OSError):  # one we cannot delete is harmless: hidden, and not a trace name
                path.unlink(missing_ok=True)


def _child_env(out: Path, options: CaptureOptions) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(OWNER_ENV, None)
    config = {k: v for k, v in asdict(options).items() if k != "out"} | {"out": str(out)}
    env[CONFIG_ENV] = json.dumps(config)
    # This process waits for the child on the thread that started it, so the child may die with it.
    env[PARENT_ENV] = f"{os.getpid()}:launcher"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(INJECT_DIR), env.get("PYTHONPATH")) if p)
    return env


def _rank_of(path: Path) -> int:
    """The rank in `rank3.pt.trace.json.gz` or `.rank3.status.json` (so rank 10 sorts after rank 2)."""
    found = re.match(r"\.?rank(\d+)\.", path.name)
    return int(found.group(1)) if found else -1


def _collect_statuses(out: Path) -> tuple[list[dict], list[str]]:
    """Read and delete the ranks' status files; returns the statuses and a warning per unreadable one.

    A status is written to a temporary name and renamed, so an unreadable one is rare (a full disk, an
    out-of-date hook): it costs that rank's details, never the capture."""
    statuses, unreadable = [], []
    for path in sorted(out.glob(STATUS_PATTERN), key=_rank_of):
        status = _read_status(path)
        with suppress(OSError):  # read or not, it has served its purpose
            path.unlink()
        (statuses if isinstance(status, dict) else unreadable).append(status)
    return statuses, unreadable


def _read_status(path: Path) -> dict | str:
    """One rank's status, or the warning that says why it cannot be used."""
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return f"{path.name} could not be read ({exc}); that rank's details are missing"
    if not isinstance(status, dict) or not isinstance(status.get("rank"), int):
        return f"{path.name} is not a status pipebubble wrote; ignored"
    return status


def _exit_reason(exit_code: int) -> str:
    """`exit code 1`, or `killed by SIGSEGV` for the shell's 128 + signal codes."""
    try:
        return f"killed by {signal.Signals(exit_code - 128).name}" if exit_code > 128 else f"exit code {exit_code}"
    except ValueError:
        return f"exit code {exit_code}"


def _warnings(statuses: list[dict], options: CaptureOptions, exit_code: int, tail: list[str]) -> list[str]:
    if not statuses and exit_code != 0:
        why = _reason(tail)
        return [f"the command failed ({_exit_reason(exit_code)}) before any process of it reported a profile"
                + (f": {why}" if why else " (if it failed to import torch, its interpreter lacks it)")]
    if not statuses:
        return ["no process of the command imported torch (its interpreter may lack torch, or it ignores "
                "PYTHONPATH, e.g. python -E/-I), so nothing was profiled"]
    world = max([int(s.get("world_size") or 1) for s in statuses] + [s["rank"] + 1 for s in statuses])
    missing = sorted(set(range(world)) - {s["rank"] for s in statuses})
    silent = [f"{'rank' if len(missing) == 1 else 'ranks'} {', '.join(map(str, missing))} reported nothing (ended "
              "before importing torch, or killed)"] if missing else []
    if exit_code == 0:
        return [line for s in statuses if (line := _problem(s, options))] + silent
    # A failed command: say why, and never advise a schedule: the steps were cut short by the failure.
    own = sorted((s for s in statuses if _failed_itself(s)), key=lambda s: s.get("failed_at") or float("inf"))
    first = [_failure(s, world) for s in own] or [
        f"the command failed ({_exit_reason(exit_code)})" + (f": {why}" if (why := _reason(tail)) else "")]
    rest = [line for s in statuses if s not in own and (line := _after_failure(s, world, options))]
    return first + silent + rest


def _who(status: dict, world: int) -> str:
    return f"rank {status['rank']}" if world > 1 else "the program"


def _failed_itself(status: dict) -> bool:
    """Exited with an error of its own (not stopped by a signal, as a launcher stops the peers of a failure)."""
    code = status.get("exit_code")
    return isinstance(code, int) and 0 < code <= 128


def _failure(status: dict, world: int) -> str:
    """`rank 1 exited with code 1: ModuleNotFoundError: No module named 'numpy'`."""
    error = status.get("error")
    return f"{_who(status, world)} exited with code {status['exit_code']}" + (f": {error}" if error else "")


def _after_failure(status: dict, world: int, options: CaptureOptions) -> str | None:
    """What became of a rank of a failed command that did not fail itself (a peer, stopped with the rest)."""
    code, steps = status.get("exit_code"), status.get("optimizer_steps", 0)
    who = _who(status, world)
    how = f"was {_exit_reason(code)}" if isinstance(code, int) and code > 128 else "ended"
    kind = str(status.get("problem") or "").partition(": ")[0]
    if kind == "before_active":
        return f"{who} {how} after {steps} optimizer step(s), before the profiled window: no trace"
    if kind == "partial":
        total = options.wait + options.warmup + options.active
        return f"{who} {how} after {steps} of {total} steps: its trace holds fewer than --active asked for"
    if kind:
        return _problem(status, options)
    return f"{who} {how}" if how != "ended" else None


def _problem(status: dict, options: CaptureOptions) -> str | None:
    if not status.get("problem"):
        return None
    kind, _, detail = str(status["problem"]).partition(": ")
    template = _PROBLEMS.get(kind, "rank {rank}: {detail}")
    return template.format(rank=status["rank"], detail=detail, wait=options.wait, warmup=options.warmup)


def _reason(tail: list[str]) -> str | None:
    """The line of the command's error stream that says what went wrong: the last exception line (a
    traceback ends with it), else the last line that is not a rule of `=` or `-`."""
    for line in reversed(tail):
        if found := _ERROR_LINE.fullmatch(line):
            return found.group(1)[:300]
    words = [line for line in tail if not re.fullmatch(r"[\W_]*", line)]
    return words[-1][:300] if words else None
