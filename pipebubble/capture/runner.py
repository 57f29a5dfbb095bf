"""Run a command with the profiling hook injected, keep its exit code, and gather what its processes wrote.

The parent never imports torch: the child program does, in whatever interpreter it uses, and the
sitecustomize in `inject/` (first on the child's PYTHONPATH) starts torch.profiler there.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipebubble.errors import CaptureError

INJECT_DIR = Path(__file__).resolve().parent / "inject"
CONFIG_ENV = "PIPEBUBBLE_CAPTURE"
OWNER_ENV = "PIPEBUBBLE_CAPTURE_OWNER"
# "PID" or "PID:launcher": the capture process that started this one (see the hook's _die_with_parent).
PARENT_ENV = "PIPEBUBBLE_CAPTURE_PARENT"
METADATA_NAME = "capture.json"
MODES = ("steps", "run")
TRACE_PATTERN = "rank*.pt.trace.json.gz"
STATUS_PATTERN = ".rank*.status.json"
# What a rank leaves behind only when it dies mid-write: a trace being exported, a status being written.
LEFTOVER_PATTERNS = (".rank*.partial.json.gz", ".rank*.tmp", f".{METADATA_NAME}.tmp")
PR_SET_PDEATHSIG = 1
SECRET_WORDS = re.compile(r"key|token|password|passwd|secret", re.IGNORECASE)
REDACTED = "***"

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
    _prepare(out)
    exit_code = _run(command, _child_env(out, options))
    statuses, unreadable = _collect_statuses(out)
    _remove_leftovers(out)
    traces = tuple(sorted(out.glob(TRACE_PATTERN), key=_rank_of))
    # An unreadable status still shows that a rank profiled: "nothing was profiled" would mislead.
    warnings = unreadable + (_warnings(statuses, options, exit_code) if statuses or not unreadable else [])
    metadata = out / METADATA_NAME
    _write_metadata(metadata, _metadata(command, options, exit_code, statuses, about))
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


def _prepare(out: Path) -> None:
    """Create the output folder and empty it of an earlier capture, or say in one line why not."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        _clear_previous(out)
    except OSError as exc:
        raise CaptureError(f"cannot write the traces to {out}: {exc.strerror or exc}") from exc


def _clear_previous(out: Path) -> None:
    # Only our own file names: stale ranks from an earlier, wider capture would otherwise mix in.
    for pattern in (TRACE_PATTERN, STATUS_PATTERN, *LEFTOVER_PATTERNS, METADATA_NAME):
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


def _run(command: Sequence[str], env: dict[str, str]) -> int:
    """Start the child in its own session, so a terminal Ctrl-C reaches it once, forwarded by us.

    On Linux the child is also killed when this process dies, even by SIGKILL, so no program is left
    running unobserved after a capture that was killed."""
    try:
        child = subprocess.Popen(list(command), env=env, start_new_session=True, preexec_fn=_die_with_us())
    except OSError as exc:
        raise CaptureError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
    with _forwarding_signals(child):
        code = child.wait()
    return 128 - code if code < 0 else code  # killed by a signal: the shell's convention


def _die_with_us() -> Callable[[], None] | None:
    """A preexec_fn that makes the kernel SIGKILL the child when this process dies (Linux; else None).

    The parent-death signal follows the thread that forked, which is the one that waits for the child.
    libc is looked up here, before the fork, so the child only makes the call. The parent may die
    between fork and prctl, too late for the signal: the child then kills itself."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, option, deathsig = os.getpid(), ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(int(signal.SIGKILL))

    def arm() -> None:
        prctl(option, deathsig)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


@contextmanager
def _forwarding_signals(child: subprocess.Popen) -> Iterator[None]:
    """While waiting, pass SIGINT/SIGTERM on to the child's process group and keep waiting.

    The group is what a terminal would have signalled; the program then exits on its own terms and its
    profiler flushes. A second signal means "now": the group is killed. Signal handlers can only be set
    on the main thread; elsewhere the caller's own handling stays (the child still dies with us)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def forward(signum, frame) -> None:
        received.append(signum)
        _signal_group(child, signum if len(received) == 1 else signal.SIGKILL)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(child: subprocess.Popen, signum: int) -> None:
    """Signal the child's process group (it leads one: start_new_session), or the child alone if that fails."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass  # everyone in it has exited already
    except OSError:
        child.send_signal(signum)


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


def _warnings(statuses: list[dict], options: CaptureOptions, exit_code: int) -> list[str]:
    if not statuses and exit_code != 0:
        return [f"the command failed ({_exit_reason(exit_code)}) before any process of it reported a profile "
                "(if it failed to import torch, its interpreter lacks it)"]
    if not statuses:
        return ["no process of the command imported torch (its interpreter may lack torch, or it ignores "
                "PYTHONPATH, e.g. python -E/-I), so nothing was profiled"]
    found = []
    for status in statuses:
        if status.get("problem"):
            kind, _, detail = str(status["problem"]).partition(": ")
            template = _PROBLEMS.get(kind, "rank {rank}: {detail}")
            found.append(template.format(rank=status["rank"], detail=detail, wait=options.wait,
                                         warmup=options.warmup))
    return found


def _portable(command: Sequence[str]) -> list[str]:
    # The bundled workloads run under this interpreter; its install path says nothing about the capture.
    return ["python" if arg == sys.executable else arg for arg in command]


def redact(command: Sequence[str]) -> list[str]:
    """The command with the values of secret-looking arguments replaced by ***, for capture.json.

    capture.json is meant to be shared with the traces, and training commands carry API keys and
    tokens: `--api-key V`, `--api-key=V`, `HF_TOKEN=V` (as given to env) and `https://user:V@host`.
    Everything else is kept as typed."""
    redacted, hide_next = [], False
    for arg in command:
        if hide_next and not arg.startswith("--"):
            redacted.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        option, eq, _ = arg.partition("=")
        if option.startswith("--") and SECRET_WORDS.search(option):
            hide_next = not eq
            redacted.append(f"{option}={REDACTED}" if eq else arg)
        elif eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", option) and SECRET_WORDS.search(option):
            redacted.append(f"{option}={REDACTED}")
        else:
            redacted.append(re.sub(r"(://[^/\s:@]+:)[^/\s@]+@", rf"\g<1>{REDACTED}@", arg))
    return redacted


def _write_metadata(path: Path, metadata: dict) -> None:
    """Write capture.json whole or not at all (temporary name, then rename)."""
    partial = path.with_name(f".{path.name}.tmp")
    try:
        partial.write_text(json.dumps(metadata, indent=2) + "\n")
        os.replace(partial, path)
    except OSError as exc:
        with suppress(OSError):
            partial.unlink(missing_ok=True)
        raise CaptureError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _metadata(command, options, exit_code, statuses, about) -> dict:
    first = statuses[0] if statuses else {}
    return {
        "tool": "pipebubble capture",
        "command": redact(_portable(command)),
        "exit_code": exit_code,
        "mode": options.mode,
        "schedule": {"wait": options.wait, "warmup": options.warmup, "active": options.active},
        "record_shapes": options.record_shapes,
        "torch": first.get("torch"),
        "world_size": first.get("world_size", len(statuses) or None),
        "python": sys.version.split()[0],
        "ranks": [{k: s.get(k) for k in ("rank", "devices", "optimizer_steps", "trace", "problem")} for s in statuses],
        **({"workload": about} if about else {}),
    }
