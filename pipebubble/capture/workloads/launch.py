"""Start P copies of a workload module as ranks (RANK, WORLD_SIZE, MASTER_ADDR/PORT), the way torchrun would,
without torchrun's agent: one launcher process that imports no torch, then the ranks."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_ranks(module: str, argv: list[str], world: int) -> int:
    """Run `python -m module argv` as ranks 0..world-1; returns the first failing rank's exit code, else 0."""
    port = str(free_port())
    children = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        children.append(subprocess.Popen([sys.executable, "-m", module, *argv], env=env))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: [c.send_signal(s) for c in children if c.poll() is None])
    return _wait_all(children)


def _wait_all(children: list[subprocess.Popen]) -> int:
    # A rank that fails leaves its peers blocked in a collective forever: stop them (SIGTERM lets
    # the profiler flush) rather than hang.
    while True:
        codes = [c.poll() for c in children]
        failed = [code for code in codes if code not in (None, 0)]
        if failed:
            for child in children:
                if child.poll() is None:
                    child.terminate()
            for child in children:
                child.wait()
            return failed[0] if failed[0] > 0 else 128 - failed[0]
        if all(code == 0 for code in codes):
            return 0
        time.sleep(0.05)
