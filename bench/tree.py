"""Run a command and measure the whole process tree: wall seconds, CPU seconds of the tree, and the peak of
the tree's summed memory (a pool's workers included, not only the largest process).

Anonymous memory is summed as each process's ``Pss_Anon`` (``/proc/<pid>/smaps_rollup``): a worker forked from
the fork server shares its pages with the server and its siblings until it writes them, and Pss splits each
shared page among the processes that map it, so the sum counts every page once (summing RssAnon counts a shared
page once per process)."""

from __future__ import annotations

import compileall
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float
    peak_tree_rss: int  # bytes: the largest sum of RSS over the process group seen while it ran (sampled)
    peak_tree_anon: int  # bytes: the same of anonymous memory (Pss_Anon: the heap, each shared page counted once)
    leftover: int  # processes still in the group when the command exited
    #: at the sample of ``peak_tree_anon``: each process's Pss_Anon (bytes) by pid and name, biggest first
    peak_where: tuple[tuple[int, str, int], ...] = field(default=())
    peak_at_s: float = 0.0  # seconds after the start when ``peak_tree_anon`` was seen


def _rollup(pid: str) -> tuple[int, int]:
    """A process's resident and anonymous memory in bytes (``Rss`` and ``Pss_Anon`` of smaps_rollup; where
    the kernel has no Pss_Anon, RssAnon of its status)."""
    rss = anon = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss_Anon:"):
                    anon = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if rss is None or anon is None:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        rss = int(status["VmRSS"].split()[0]) * 1024 if rss is None else rss
        anon = int(status["RssAnon"].split()[0]) * 1024 if anon is None else anon
    return rss, anon


def _role(pid: str, pgid: int, parent: int) -> str:
    """What a process of the group is: the command itself, multiprocessing's fork server or resource
    tracker, a pool worker (forked from the server, or spawned by the command), or another child."""
    if int(pid) == pgid:
        return "command"
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        line = f.read().replace(b"\0", b" ")
    for helper in (b"forkserver", b"resource_tracker"):
        if helper in line:
            return "worker" if parent != pgid and helper == b"forkserver" else helper.decode()
    return "worker" if b"multiprocessing" in line else "child"


def _group(pgid: int) -> list[tuple[int, str, int, int]]:
    """(pid, name, RSS, Pss_Anon) of each process of group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
            fields = text.rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # field 5 of stat: the process group
                continue
            name = _role(entry, pgid, int(fields[1]))
            rss, anon = _rollup(entry)
            found.append((int(entry), name, rss, anon))
        except (OSError, IndexError, ValueError, KeyError):
            continue
    return found


def _group_rss(pgid: int) -> tuple[int, int, int]:
    """The summed RSS and Pss_Anon (bytes) of the processes of group ``pgid``, and how many there are."""
    found = _group(pgid)
    return sum(p[2] for p in found), sum(p[3] for p in found), len(found)


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
    where: tuple[tuple[int, str, int], ...] = ()
    peak_at = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak, peak_anon, where, peak_at
        while not done.is_set():
            found = _group(proc.pid)
            rss, anon = sum(p[2] for p in found), sum(p[3] for p in found)
            peak = max(peak, rss)
            if anon > peak_anon:
                peak_anon, peak_at = anon, time.perf_counter() - start
                where = tuple(sorted(((p[0], p[1], p[3]) for p in found), key=lambda p: -p[2]))
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
    return Measured(wall, usage.ru_utime + usage.ru_stime, peak, peak_anon, leftover, where, peak_at)


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
