"""Run a command and measure the whole process tree: wall seconds, CPU seconds of the tree, and the peak of
the tree's summed resident memory (a pool's workers included, not only the largest process)."""

from __future__ import annotations

import compileall
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    peak_tree_rss: int  # bytes: the largest sum of RSS over the process group seen while it ran (sampled)
    peak_tree_anon: int  # bytes: the same of anonymous memory (RssAnon: the heap, not the page cache's mapped files)
    leftover: int  # processes still in the group when the command exited


def _group_rss(pgid: int) -> tuple[int, int, int]:
    """The summed RSS and RssAnon (bytes) of the processes of group ``pgid``, and how many there are."""
    total, anon, count = 0, 0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat: the process group
                continue
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            total += int(status["VmRSS"].split()[0]) * 1024
            anon += int(status["RssAnon"].split()[0]) * 1024
            count += 1
        except (OSError, IndexError, ValueError, KeyError):
            continue
    return total, anon, count


PACKAGE = Path(__file__).resolve().parents[1] / "pipebubble"


@cache
def compiled() -> None:
    """pipebubble's bytecode written, once, before anything is timed, as pip writes it when it installs a
    wheel and as a first run writes it: where the environment sets ``PYTHONDONTWRITEBYTECODE``, every timed
    run would otherwise compile all of pipebubble's modules again (about 0.12 s a run on 2 cores, two-thirds
    of a 64-file folder's ``json.load``), which no installed copy does."""
    compileall.compile_dir(PACKAGE, quiet=1)


def run(cmd: list[str], env: dict[str, str] | None = None, interval: float = 0.02) -> Measured:
    """``cmd`` in its own process group, sampled every ``interval`` seconds (pipebubble's bytecode
    ``compiled`` first)."""
    compiled()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env, start_new_session=True)
    peak = peak_anon = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_anon
        while not done.is_set():
            rss, anon, _ = _group_rss(proc.pid)
            peak, peak_anon = max(peak, rss), max(peak_anon, anon)
            time.sleep(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    leftover = _group_rss(proc.pid)[2]
    if leftover:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    # Sampled only: the child's ru_maxrss starts from this process's own size (it is kept across fork and exec).
    return Measured(wall, usage.ru_utime + usage.ru_stime, peak, peak_anon, leftover)


@dataclass(frozen=True)
class Paired:
    """Runs of a command A and a baseline B in turn (A B A B ...): each one's median run, and the ratio A/B
    of wall time pair by pair (median, min, max), which holds when the machine's speed drifts."""

    a: Measured
    b: Measured
    ratio: float
    low: float
    high: float

    def text(self) -> str:
        return f"{self.ratio:.2f} ({self.low:.2f}-{self.high:.2f})"


def paired(a: list[str], b: list[str], env: dict[str, str] | None = None, repeat: int = 3) -> Paired:
    """``a`` against the baseline ``b``, ``repeat`` pairs after one warm-up run of each."""
    run(a, env), run(b, env)
    runs = [(run(a, env), run(b, env)) for _ in range(repeat)]
    ratios = sorted(x.wall_s / y.wall_s for x, y in runs)

    def median(side: int) -> Measured:
        return sorted((r[side] for r in runs), key=lambda m: m.wall_s)[len(runs) // 2]

    return Paired(median(0), median(1), ratios[len(ratios) // 2], ratios[0], ratios[-1])


def folder_against_json_load(folder, repeat: int = 3, target=None) -> tuple[Paired, float]:
    """``pipebubble analyze FOLDER --format json --no-cache -q`` against a bare ``json.load`` of each of its
    ``rank*.json`` files (one process, one after another), in a fresh cache: the pair and the files' MB.
    ``target``: analyse that instead, against the same baseline (a tiny trace: the command's fixed cost in
    units of this folder's ``json.load``)."""
    import sys
    import tempfile

    files = sorted(str(p) for p in folder.glob("rank*.json"))
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        load = "import json, sys\nfor f in sys.argv[1:]:\n    json.load(open(f))"
        analyze = [sys.executable, "-m", "pipebubble", "analyze", str(target or folder), "--format", "json",
                   "--no-cache", "-q"]
        return paired(analyze, [sys.executable, "-c", load, *files], env, repeat), mb
