"""Data-parallel jobs with one late rank, for ``analysis.rootcause``: synthetic ones (``shapes.Rank``) whose
late rank's data loader or step start is slow, and copies of a real rank's trace with one copy's steps
entered late.

Synthetic step k of rank r: ``ProfilerStep#k`` from base_k, a data-loader range (0.2 ms; the slow rank's
longer), a forward and a backward kernel launched after it (2 ms, 4 ms), then the NCCL all-reduce kernel,
which every rank's kernel ends 1 ms after the last rank's began (the last arrival releases them all).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from shapes import ALL_REDUCE, ALL_REDUCE_KERNEL, MS, Rank

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
STEP_MS = 20


def dp_job(folder: Path, world: int = 4, steps: int = 3, loader_ms: dict[int, float] | None = None,
           enter_ms: dict[int, float] | None = None) -> list[Path]:
    """``world`` ranks of ``steps`` steps each; ``loader_ms[r]``: rank r's loader takes that much longer;
    ``enter_ms[r]``: rank r enters every step that much later (its whole step shifted)."""
    loader_ms, enter_ms = loader_ms or {}, enter_ms or {}
    ranks = [Rank(r, world) for r in range(world)]
    for k in range(steps):
        base = MS + STEP_MS * MS * k
        arrive = {r: _arrival(base, loader_ms.get(r, 0), enter_ms.get(r, 0)) for r in range(world)}
        release = max(arrive.values()) + MS
        for r, rank in enumerate(ranks):
            start = base + int(enter_ms.get(r, 0) * MS)
            load = int((0.2 + loader_ms.get(r, 0)) * MS)
            rank.step(k, start, 15 * MS)
            rank.x("user_annotation", LOADER, start + 100_000, load)
            at = start + 100_000 + load + 50_000
            rank.kernel("sm90_xmma_gemm_fprop", at, 2 * MS)
            rank.kernel("sm90_xmma_gemm_dgrad", at + 2 * MS, 4 * MS)
            rank.kernel(ALL_REDUCE_KERNEL, arrive[r], release - arrive[r], 20, ALL_REDUCE)
    return [rank.write(folder) for rank in ranks]


def _arrival(base: int, loader_ms: float, enter_ms: float) -> int:
    """When a rank's all-reduce kernel starts: after its loader and its 6 ms of compute."""
    return base + int(enter_ms * MS) + 100_000 + int((0.2 + loader_ms) * MS) + 50_000 + 6 * MS


def copies_entered_late(source: Path, folder: Path, world: int = 4, late: int = 2, delay_us: int = 5_000
                        ) -> list[Path]:
    """``world`` copies of one rank's Kineto trace, renumbered; copy ``late`` enters each profiler step
    ``delay_us`` later than the others. Every event of step k of the late copy moves by (k+1) x delay; in
    the others, step k's events before its first collective kernel move by k x delay, that kernel spins
    ``delay_us`` longer (it waits for the late copy) and what follows it moves by (k+1) x delay: what the
    peers of a rank that starts its steps late record."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    events = doc["traceEvents"]
    steps = sorted(e["ts"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
    firsts = [_first_collective(events, lo, hi) for lo, hi in zip(steps, [*steps[1:], float("inf")], strict=True)]
    paths = []
    for r in range(world):
        moved = [_moved(e, steps, firsts, delay_us, r == late) for e in events]
        info = {**doc["distributedInfo"], "rank": r, "world_size": world}
        info["pg_config"] = [{**g, "pg_size": world, "ranks": list(range(world))} for g in info.get("pg_config") or []]
        path = folder / f"rank{r}.json.gz"
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps({**doc, "distributedInfo": info, "traceEvents": moved}).encode(), 1))
        paths.append(path)
    return paths


def _first_collective(events: list[dict], lo: float, hi: float) -> float:
    """The start of the first NCCL kernel in [lo, hi)."""
    return min(e["ts"] for e in events if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel")
               and lo <= e["ts"] < hi)


def _moved(event: dict, steps: list[float], firsts: list[float], delay: int, late: bool) -> dict:
    """``event`` as ``copies_entered_late`` moves it."""
    ts = event.get("ts")
    if not isinstance(ts, (int, float)) or ts < steps[0]:
        return event
    k = max(i for i, s in enumerate(steps) if s <= ts)
    if late:
        return {**event, "ts": ts + (k + 1) * delay}
    if ts < firsts[k]:
        return {**event, "ts": ts + k * delay}
    if ts == firsts[k] and event.get("cat") == "kernel":
        return {**event, "ts": ts + k * delay, "dur": event["dur"] + delay}
    return {**event, "ts": ts + (k + 1) * delay}
