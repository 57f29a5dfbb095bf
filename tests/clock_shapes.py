"""Kineto traces moved in time or cut, as a second host's clock or a late profile window makes them.

``moved`` adds an offset to every timestamp of a trace (another host's clock); ``cut`` drops every event
that starts before an instant (a profile window that opened later). Both keep the file's layout: gzip or
not, integer microseconds where the trace writes integers.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path


def load(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def save(doc: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(doc, f, separators=(",", ":"))
    return path


def moved(src: Path, dst: Path, offset_ns: int) -> Path:
    """``src`` with every time ``offset_ns`` later (earlier when negative), written to ``dst``."""
    doc = load(src)
    for event in doc["traceEvents"]:
        ts = event.get("ts")
        if isinstance(ts, int) and offset_ns % 1000 == 0:
            event["ts"] = ts + offset_ns // 1000
        elif isinstance(ts, (int, float)):
            event["ts"] = ts + offset_ns / 1000
    return save(doc, dst)


def cut(src: Path, dst: Path, before_us: float) -> Path:
    """``src`` without the timed events that start before ``before_us`` (its own timestamps), to ``dst``."""
    doc = load(src)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not isinstance(e.get("ts"), (int, float))
                          or e["ts"] >= before_us]
    return save(doc, dst)


def job(folder: Path, files: list[Path], offsets: dict[int, int] | None = None) -> Path:
    """The files copied into ``folder``, file k moved by ``offsets[k]`` ns."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, path in enumerate(files):
        moved(path, folder / path.name, (offsets or {}).get(k, 0))
    return folder
