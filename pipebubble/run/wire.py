"""Mapped parts as bytes, to cross between processes (a pool worker or a Ray task to this one).

A unit's parts (a batch of rank files, or one file) cross as one msgpack envelope: each part's scalars as
they are, and its frames kind by kind (``lanes``, ``comm.calls`` ...) as one Arrow IPC table holding that
kind's rows of every part, one after another, with each part's row count: a batch of 30 files crosses as
some 20 tables, not 600, and each part's frame comes back as a slice of its kind's table. A kind whose
frames' schemas differ crosses as one table a part.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict

import msgspec
import polars as pl

from pipebubble.analysis.breakdown import GpuPart
from pipebubble.analysis.critical import CriticalPart
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.memory import MemoryPart
from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.analysis.requests.part import RequestsPart
from pipebubble.ingest.base import FileResult
from pipebubble.report import Breakdown, Interference, Segment
from pipebubble.run.mapper import FilePart

Put = Callable[[str, pl.DataFrame], str]


def encode(parts: list[FilePart]) -> bytes:
    """``parts`` as one envelope (``decode`` gives them back)."""
    kinds: dict[str, list[tuple[int, pl.DataFrame]]] = {}

    def keeper(i: int) -> Put:
        def put(name: str, frame: pl.DataFrame) -> str:
            kinds.setdefault(name, []).append((i, frame))
            return name
        return put

    envelopes = [_envelope(part, keeper(i)) for i, part in enumerate(parts)]
    tables = {}
    for name, frames in kinds.items():
        owners = [i for i, _ in frames]
        schema = frames[0][1].schema
        if all(frame.schema == schema for _, frame in frames):
            whole = pl.concat([frame for _, frame in frames], how="vertical")
            tables[name] = {"owners": owners, "heights": [f.height for _, f in frames], "whole": _ipc(whole)}
        else:
            tables[name] = {"owners": owners, "each": [_ipc(frame) for _, frame in frames]}
    return msgspec.msgpack.encode({"parts": envelopes, "tables": tables}, enc_hook=str)


def decode(blob: bytes) -> list[FilePart]:
    """The parts ``encode`` wrote, in their order."""
    env = msgspec.msgpack.decode(blob)
    frames: list[dict[str, pl.DataFrame]] = [{} for _ in env["parts"]]
    for name, table in env["tables"].items():
        if "whole" in table:
            whole, at = _frame(table["whole"]), 0
            for i, height in zip(table["owners"], table["heights"], strict=True):
                frames[i][name] = whole.slice(at, height)
                at += height
        else:
            for i, data in zip(table["owners"], table["each"], strict=True):
                frames[i][name] = _frame(data)
    return [_part(part, frames[i].__getitem__) for i, part in enumerate(env["parts"])]


def _ipc(frame: pl.DataFrame) -> bytes:
    buffer = io.BytesIO()
    frame.write_ipc(buffer)
    return buffer.getvalue()


def _frame(data: bytes) -> pl.DataFrame:
    return pl.read_ipc(io.BytesIO(data))


def _envelope(part: FilePart, put: Put) -> dict:
    """The part as plain values, each frame replaced by the name ``put`` files it under."""
    f = part.file
    stages = None
    if part.stages is not None:
        s = part.stages
        stages = {
            "names": s.names,
            "order": [list(o) for o in s.order],
            "work": put("stages.work", s.work),
            "host": put("stages.host", s.host),
            "facts": s.facts,
            "pipeline": s.pipeline,
        }
    return {
        "file": {
            "source": f.source,
            "events_read": f.events_read,
            "skipped": dict(f.skipped),
            "warnings": f.warnings,
            "meta": {**f.meta, "spans": f.meta.get("spans", 0)},
            "format": f.format,
        },
        "lanes": put("lanes", part.lanes),
        "stages": stages,
        "serving": None if part.serving is None else part.serving.to_dict(),
        "segments": [asdict(s) for s in part.segments],
        "comm": None if part.comm is None else {
            "calls": put("comm.calls", part.comm.calls), "facts": part.comm.facts,
            "p2p": put("comm.p2p", part.comm.p2p), "windows": put("comm.windows", part.comm.windows),
        },
        "gpu": None if part.gpu is None else {
            "rows": [asdict(r) for r in part.gpu.rows],
            "delay": part.gpu.delay,
            "short": part.gpu.short,
            **{k: put(f"gpu.{k}", getattr(part.gpu, k)) for k in GpuPart.FRAMES},
        },
        "memory": None if part.memory is None else {
            k: put(f"memory.{k}", getattr(part.memory, k)) for k in MemoryPart.FRAMES},
        "strips": None if part.strips is None else put("strips", part.strips),
        "requests": None if part.requests is None else {
            k: put(f"requests.{k}", getattr(part.requests, k)) for k in RequestsPart.FRAMES},
        "critical": None if part.critical is None else {
            k: put(f"critical.{k}", getattr(part.critical, k)) for k in CriticalPart.FRAMES},
    }


def _part(env: dict, get: Callable[[str], pl.DataFrame]) -> FilePart:
    """The part ``_envelope`` wrote, its frames from ``get``."""
    f = env["file"]
    account = FileResult(
        f["source"], pl.DataFrame(), f["events_read"], Counter(f["skipped"]), f["warnings"], f["meta"], f["format"]
    )
    s = env["stages"]
    stages = None if s is None else StagePart(
        s["names"], [_tuple(o) for o in s["order"]], get(s["work"]), get(s["host"]), s["facts"], s.get("pipeline"))
    segments = [Segment(**seg) for seg in env["segments"]]
    serving = None if env["serving"] is None else Interference.from_dict(env["serving"])
    c = env["comm"]
    comm = None if c is None else CommPart(get(c["calls"]), c["facts"], get(c["p2p"]), get(c["windows"]))
    g = env["gpu"]
    gpu = None if g is None else GpuPart(
        [Breakdown(**r) for r in g["rows"]], delay=g["delay"], short=g["short"],
        **{k: get(g[k]) for k in GpuPart.FRAMES})
    m = env["memory"]
    memory = None if m is None else MemoryPart(**{k: get(m[k]) for k in MemoryPart.FRAMES})
    strips = None if env["strips"] is None else get(env["strips"])
    k = env["critical"]
    critical = None if k is None else CriticalPart(**{name: get(k[name]) for name in CriticalPart.FRAMES})
    q = env["requests"]
    requests = None if q is None else RequestsPart(**{name: get(q[name]) for name in RequestsPart.FRAMES})
    return FilePart(account, get(env["lanes"]), stages, serving, segments, comm, gpu, memory, strips, critical,
                    requests)


def _tuple(value):
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value
