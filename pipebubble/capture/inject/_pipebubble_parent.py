"""Die with the parent: the process tree of a capture goes down with the capture (loaded by the hook).

Standard library only, and no pipebubble import: this runs in the profiled program's interpreter.
"""

import os
import signal
import sys

# "PID" or "PID:launcher", set by each process of the capture for its children: who started them, and
# whether that process starts its children from the thread that outlives them (see die_with_parent).
PARENT_ENV = "PIPEBUBBLE_CAPTURE_PARENT"
_LAUNCHERS = ("torchrun", "torch/distributed/run.py", "torch/distributed/launch.py")
_PR_SET_PDEATHSIG = 1


def is_launcher() -> bool:
    """Whether this process is torchrun (or torch.distributed.launch): it starts the workers."""
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    return any(argv0.endswith(name) for name in _LAUNCHERS)


def become_parent(launcher: bool = False) -> None:
    """Tell this process's future children who started them (and whether it is a launcher)."""
    os.environ[PARENT_ENV] = f"{os.getpid()}:launcher" if launcher else str(os.getpid())


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies, where that is safe (Linux only).

    A killed capture kills its child; this carries that down the tree, so torchrun's workers (in
    sessions of their own, out of reach of a process-group signal) do not outlive a killed torchrun.
    The signal fires when the parent *thread* that started us ends, and on purpose when the parent
    ends, so it is set only where neither can surprise a program: the parent is a process of this
    capture and either a launcher (which starts and waits for its children on its main thread) or a
    single-threaded process in our own session (a child put in a new session may be meant to outlive it)."""
    pid, _, kind = os.environ.get(PARENT_ENV, "").partition(":")
    parent = os.getppid()
    if not sys.platform.startswith("linux") or pid != str(parent):
        return
    if kind != "launcher" and not (_threads(parent) == 1 and _same_session(parent)):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(int(signal.SIGKILL)))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the signal was set: too late for it to fire
        os.kill(os.getpid(), signal.SIGKILL)


def _threads(pid: int) -> int:
    """How many threads process `pid` runs (0 when that cannot be read)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _same_session(pid: int) -> bool:
    try:
        return os.getsid(0) == os.getsid(pid)
    except OSError:
        return False
