"""The same job recorded again: a copy of a folder of Kineto traces whose host processes and threads have other
ids, as a second run gets (GPU events keep theirs: there the pid is the device and the tid the stream)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g"}


def host_pids(events: list[dict]) -> set:
    """The pids of host work (CPU operators, runtime calls, annotations), not of GPU devices."""
    return {e["pid"] for e in events if e.get("ph") == "X" and isinstance(e.get("pid"), int)
            and str(e.get("cat", "")).lower() not in GPU_CATEGORIES}


def rerecord(trace: dict, offset: int) -> dict:
    """``trace`` with every host pid and every tid of a host process moved by ``offset`` (a main thread's tid
    stays its process's pid, and thread ids keep their order, as a new run's would)."""
    events = trace["traceEvents"]
    hosts = host_pids(events)
    moved = []
    for event in events:
        if event.get("pid") in hosts:
            event = {**event, "pid": event["pid"] + offset}
            if isinstance(event.get("tid"), int):
                event["tid"] += offset
        moved.append(event)
    return {**trace, "traceEvents": moved}


def rerecord_folder(source: Path, target: Path, offset: int = 7919) -> Path:
    """Every trace of ``source`` (``.json`` or ``.json.gz``) rewritten into ``target``; other files copied."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        gz = path.name.endswith(".json.gz")
        if not (gz or path.suffix == ".json"):
            shutil.copy(path, target / path.name)
            continue
        data = json.loads(gzip.decompress(path.read_bytes()) if gz else path.read_bytes())
        if not isinstance(data, dict) or "traceEvents" not in data:
            shutil.copy(path, target / path.name)
            continue
        text = json.dumps(rerecord(data, offset)).encode()
        (target / path.name).write_bytes(gzip.compress(text, mtime=0) if gz else text)
    return target
