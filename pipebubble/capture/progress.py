"""What a capture says while it runs: one line saying what is captured, then each rank's progress as the
hook reports it (`.rank{R}.progress.json`, rewritten whole at each phase), ranks that move together on one
line. Text only: the command line decides what is shown.
"""

from __future__ import annotations

import json
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipebubble.capture.metadata import portable
from pipebubble.capture.options import CaptureOptions

PROGRESS_PATTERN = ".rank*.progress.json"
PHASES = ("started", "recording", "writing", "written")
GROUP_WAIT_S = 1.5  # how long a phase waits for the other ranks before it is reported for those there


def describe(command: Sequence[str], options: CaptureOptions, about: dict | None, shown_out: str) -> str:
    """`capturing 4 ranks of pipeline 1f1b (8 micro-batches, cpu): optimizer steps 3-4, into out/`."""
    return f"capturing {_what(command, about)}: {_window(options)}, into {shown_out}"


def _what(command: Sequence[str], about: dict | None) -> str:
    if about and about.get("name") == "pipeline":
        return (f"{_count(about['stages'], 'rank')} of pipeline {about['schedule']} ({about['microbatches']} "
                f"micro-batches, {about['device']})")
    if about and about.get("name") == "serve":
        chunked = f"chunked prefill {about['chunked_prefill']}" if about["chunked_prefill"] else "whole prompts"
        mode = ", async" if about["async"] else ""
        return f"serve ({about['requests']} requests, {chunked}, {about['device']}{mode})"
    shown = shlex.join(portable(command))
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    ranks = _nproc(command)
    return f"{_count(ranks, 'rank')} of `{shown}`" if ranks else f"`{shown}`"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}{'s' if n != 1 else ''}"


def _nproc(command: Sequence[str]) -> int | None:
    """The ranks a torchrun command line asks for (--nproc-per-node N, on one node), if it says."""
    if not command or (not command[0].endswith("torchrun") and "torch.distributed.run" not in command):
        return None
    for i, arg in enumerate(command):
        name, eq, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            value = value if eq else (command[i + 1] if i + 1 < len(command) else "")
            return int(value) if value.isdigit() else None
    return None


def _window(options: CaptureOptions) -> str:
    if options.mode == "run":
        return "the whole run"
    first, total = options.wait + options.warmup + 1, options.wait + options.warmup + options.active
    return f"optimizer steps {first}-{total}" if options.active > 1 else f"optimizer step {total}"


class Watcher:
    """Polls the ranks' progress files on a thread and hands each batch of changed states to ``on_change``."""

    def __init__(self, out: Path, on_change: Callable[[list[dict]], None], interval: float = 0.2) -> None:
        self.out, self.on_change, self.interval = out, on_change, interval
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pipebubble-progress")

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        changed = []
        for path in self.out.glob(PROGRESS_PATTERN):
            state = _read(path)
            if state is not None and self.seen.get(state["rank"]) != state["phase"]:
                self.seen[state["rank"]] = state["phase"]
                changed.append(state)
        if changed:
            self.on_change(sorted(changed, key=lambda s: s["rank"]))


def _read(path: Path) -> dict | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(state, dict) and isinstance(state.get("rank"), int) and state.get("phase") in PHASES
    return state if ok else None


class Lines:
    """Turns rank states into progress lines, one per phase for the ranks that reach it together: a phase is
    reported once every rank has reached it, or GROUP_WAIT_S after the first did, for those that have; not
    at all when they have all gone past it by then (writing a small trace takes no time worth a line)."""

    def __init__(self, options: CaptureOptions, start: float | None = None) -> None:
        self.options, self.start = options, time.monotonic() if start is None else start
        self.world = 1
        self.reached: dict[int, int] = {}  # rank -> index of its phase
        self.pending: dict[int, tuple[float, set[int]]] = {}  # phase index -> (first seen, ranks)

    def update(self, states: list[dict], now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        for state in states:
            self.world = max(self.world, int(state.get("world_size") or 1), state["rank"] + 1)
            phase, before = PHASES.index(state["phase"]), self.reached.get(state["rank"], -1)
            self.reached[state["rank"]] = phase
            for passed in range(before + 1, phase + 1):  # phases a rank went through between two polls too
                since, ranks = self.pending.get(passed, (now, set()))
                self.pending[passed] = (since, ranks | {state["rank"]})
        return self.due(now)

    def due(self, now: float | None = None, everything: bool = False) -> list[str]:
        """The lines whose ranks are all there (or have waited long enough; or all of them, at the end)."""
        now = time.monotonic() if now is None else now
        lines = []
        for phase in sorted(self.pending):
            since, ranks = self.pending[phase]
            behind = [r for r in range(self.world) if self.reached.get(r, -1) < phase]
            if everything or not behind or now - since >= GROUP_WAIT_S:
                del self.pending[phase]
                gone_past = all(self.reached[r] > phase for r in ranks)
                if not gone_past or phase == len(PHASES) - 1:
                    lines.append(f"[{since - self.start:.1f}s] {_ranks(ranks, self.world)}"
                                 f"{self._text(PHASES[phase])}")
        return lines

    def _text(self, phase: str) -> str:
        if phase == "started":
            return "profiler started" + (", recording the whole run" if self.options.mode == "run" else "")
        if phase == "recording":
            return f"recording {_window(self.options).removeprefix('optimizer ')}"
        return {"writing": "writing the trace", "written": "trace written"}[phase]


def _ranks(ranks: set[int], world: int) -> str:
    """`rank 2: `, `ranks 0-3: `, `ranks 0, 2-3: ` (nothing for a single process)."""
    if world == 1 and ranks == {0}:
        return ""
    spans: list[list[int]] = []
    for rank in sorted(ranks):
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {text}: "
