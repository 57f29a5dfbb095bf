"""The names a lane, a stream and a wait keep in a second recording of the same job: stage numbers, ranks,
GPU device numbers, the order of a process's threads and of waits, never a PID or a TID. A GPU's streams
match by number, and those whose numbers differ by their order of first use.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any


def lane_names(lanes: list[dict]) -> dict[str, str]:
    """Each lane id -> a name that a second recording of the same job gives the same lane: ``rank0/gpu0``,
    ``rank0/gpu0/stream7``, ``rank0/thread0`` (a process's main thread first, then the others by when they
    started working), ``process1/...`` for the second process of a rank (or of a job without ranks), never
    a PID or TID. Two lanes that would share a name get ``#2``, ``#3`` in report order."""
    pids: dict[Any, set[int]] = defaultdict(set)
    for lane in lanes:
        if lane.get("pid") is not None:
            pids[lane.get("rank")].add(lane["pid"])
    process = {(rank, pid): i for rank, found in pids.items() for i, pid in enumerate(sorted(found))}
    threads: dict[tuple, list[dict]] = defaultdict(list)
    for lane in lanes:
        if lane.get("device") is None:
            threads[lane.get("rank"), lane.get("pid")].append(lane)
    order = {lane["lane"]: i for group in threads.values()
             for i, lane in enumerate(sorted(group, key=lambda x: (x.get("tid") != x.get("pid"),
                                                                  x["window_start_ns"], x.get("tid") or 0)))}
    names: dict[str, str] = {}
    seen: dict[str, int] = defaultdict(int)
    for lane in lanes:
        rank, p = lane.get("rank"), process.get((lane.get("rank"), lane.get("pid")))
        parts = [f"rank{rank}"] if rank is not None else []
        if p is not None and (rank is None or p > 0):
            parts.append(f"process{p}")
        if lane.get("device") is not None:
            parts.append(f"gpu{lane['device']}")
            parts += [f"stream{lane['stream']}"] if lane.get("stream") is not None else []
        else:
            parts.append(f"thread{order[lane['lane']]}")
        name = "/".join(parts)
        seen[name] += 1
        names[lane["lane"]] = name if seen[name] == 1 else f"{name}#{seen[name]}"
    return names


def paired_names(base: list[dict], new: list[dict]) -> tuple[dict[str, str], dict[str, str], list[tuple[str, str]]]:
    """Both reports' lane names (``lane_names``), the new report's streams renamed after the base's they match,
    and those (base name, new name) pairs. Within each GPU (its rank, process and device) a stream number
    found in both reports matches itself; the streams left on each side match in their order of first use
    (ties by number), as far as both have streams left; the rest keep their names, only in one report."""
    names = lane_names(base), lane_names(new)
    pairs: list[tuple[str, str]] = []
    theirs = _streams(new, names[1])
    for gpu, ours in _streams(base, names[0]).items():
        common = {number for number, _ in ours} & {number for number, _ in theirs.get(gpu, [])}
        left = [[name for number, name in side if number not in common] for side in (ours, theirs.get(gpu, []))]
        pairs += zip(*left, strict=False)
    renamed = {b: a for a, b in pairs}
    return names[0], {lane: renamed.get(name, name) for lane, name in names[1].items()}, pairs


def _streams(lanes: list[dict], names: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """Each GPU's streams (by the GPU's name) as (number, lane name), in their order of first use."""
    streams = [lane for lane in lanes if lane.get("device") is not None and lane.get("stream") is not None]
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for lane in sorted(streams, key=lambda x: (x.get("window_start_ns") is None, x.get("window_start_ns") or 0,
                                               x["stream"])):
        name = names[lane["lane"]]
        out[name.rsplit("/stream", 1)[0]].append((lane["stream"], name))
    return out


def streams_note(pairs: list[tuple[str, str]], shown: int = 5) -> str:
    """One line: which streams matched by order, ``rank0/gpu0/stream7 as stream13`` (the base's name first)."""
    listed = ", ".join(f"{a} as {b.rsplit('/', 1)[-1]}" for a, b in pairs[:shown])
    return (f"{len(pairs)} GPU stream(s) matched by order of first use (their numbers differ): {listed}"
            + (" ..." if len(pairs) > shown else ""))


def by_name(lanes: list[dict], names: dict[str, str]) -> dict[str, dict]:
    """Lanes by their stable name (``lane_names``)."""
    return {names[lane["lane"]]: lane for lane in lanes}


_IDS = re.compile(r"(pid|tid|cpu/)-?\d+")


def stable_name(lane: str | None, names: dict[str, str], default: str = "") -> str:
    """A lane's stable name; one the lanes do not list keeps its id with the PIDs and TIDs blanked."""
    if lane is None:
        return default
    return names.get(lane) or _IDS.sub(lambda m: m.group(1) + "*", lane)


def wait_label(wait: dict, names: dict[str, str], head: str = "wait ", open_: str = " (", close: str = ")") -> str:
    """``wait stage 3 step 0 drain (B7 → -)``: where, when, why and between which passes (never a lane id)."""
    where = f"stage {wait['stage']}" if wait.get("stage") is not None else stable_name(wait.get("lane"), names, "job")
    step = f" step {wait['step']}" if wait.get("step") is not None else ""
    passes = f"{wait.get('before') or '-'} → {wait.get('after') or '-'}"
    return f"{head}{where}{step} {wait['cause']}{open_}{passes}{close}"
