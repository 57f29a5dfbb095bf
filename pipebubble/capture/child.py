"""The profiled child's lifetime: started in its own session, sent our signals, and killed when we die.

Standard library only; the child's environment is made by the runner, its output passed on by a relay.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from pipebubble.capture.relay import Relay
from pipebubble.errors import CaptureError

PR_SET_PDEATHSIG = 1


def run(command: Sequence[str], env: dict[str, str], relay: Relay | None = None) -> int:
    """Start the child in its own session, so a terminal Ctrl-C reaches it once, forwarded by us; its
    stdout and stderr go through ``relay`` when one is given (else they are ours).

    On Linux the child is also killed when this process dies, even by SIGKILL, so no program is left
    running unobserved after a capture that was killed."""
    stdout, stderr = relay.child_fds if relay is not None else (None, None)
    try:
        child = subprocess.Popen(list(command), env=env, start_new_session=True, preexec_fn=_die_with_us(),
                                 stdout=stdout, stderr=stderr)
    except OSError as exc:
        if relay is not None:
            relay.abandon()
        raise CaptureError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from exc
    if relay is not None:
        relay.start()
    with _forwarding_signals(child):
        code = child.wait()
    if relay is not None:
        relay.finish()
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
