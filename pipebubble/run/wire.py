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
from typing import Any

import msgspec
import polars as pl

from pipebubble.analysis.breakdown import GpuPart
from pipebubble.analysis.critical import CriticalPart
from pipebubble.analysis.flops import FlopsPart
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.launch import LaunchPart
from pipebubble.analysis.memory import MemoryPart
from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.analysis.pipeline.stages import Worker
from pipebubble.analysis.requests.part import RequestsPart
from pipebubble.ingest.base import FileResult
from pipebubble.report import Breakdown, Interference, Segment
from pipebubble.run.mapper import FilePart

Put = Callable[[str, pl.DataFrame], str]
Get = Callable[[str], pl.DataFrame]
Codec = tuple[Callable[..., Any], Callable[..., Any]]


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
    """The part as plain values, field by field (``FIELDS``), each frame replaced by the name ``put`` files it
    under."""
    f = part.file
    account = {"source": f.source, "events_read": f.events_read, "skipped": dict(f.skipped),
               "warnings": f.warnings, "meta": {**f.meta, "spans": f.meta.get("spans", 0)}, "format": f.format}
    values = {name: getattr(part, name) for name in FIELDS}
    return {"file": account, **{name: None if value is None else FIELDS[name][0](value, put, name)
                                for name, value in values.items()}}


def _part(env: dict, get: Get) -> FilePart:
    """The part ``_envelope`` wrote, its frames from ``get``."""
    f = env["file"]
    account = FileResult(source=f["source"], spans=pl.DataFrame(), events_read=f["events_read"],
                         skipped=Counter(f["skipped"]), warnings=f["warnings"], meta=f["meta"], format=f["format"])
    return FilePart(file=account, **{name: None if env[name] is None else FIELDS[name][1](env[name], get)
                                     for name in FIELDS})


def _frames(cls: type, scalars: tuple[str, ...] = ()) -> Codec:
    """The codec of a part made of frames (``cls.FRAMES``, each filed as ``field.frame``) and ``scalars``
    that cross as they are."""
    def encode(value, put: Put, name: str) -> dict:
        return {**{k: getattr(value, k) for k in scalars}, **{k: put(f"{name}.{k}", getattr(value, k))
                                                              for k in cls.FRAMES}}

    def decode(env: dict, get: Get):
        return cls(**{k: env[k] for k in scalars}, **{k: get(env[k]) for k in cls.FRAMES})

    return encode, decode


def _stages_in(s: StagePart, put: Put, name: str) -> dict:
    return {"names": s.names, "order": [list(o) for o in s.order], "work": put(f"{name}.work", s.work),
            "host": put(f"{name}.host", s.host), "facts": s.facts, "pipeline": s.pipeline,
            "workers": None if s.workers is None else [[w.stage, list(w.order), w.replica, w.rank, w.tp]
                                                       for w in s.workers]}


def _stages_out(s: dict, get: Get) -> StagePart:
    return StagePart(names=s["names"], order=[_tuple(o) for o in s["order"]], work=get(s["work"]),
                     host=get(s["host"]), facts=s["facts"], pipeline=s.get("pipeline"),
                     workers=None if s.get("workers") is None else [
                         Worker(w[0], _tuple(w[1]), *w[2:]) for w in s["workers"]])


def _gpu_in(g: GpuPart, put: Put, name: str) -> dict:
    return {"rows": [asdict(r) for r in g.rows], "delay": g.delay, "short": g.short,
            **{k: put(f"{name}.{k}", getattr(g, k)) for k in GpuPart.FRAMES}}


def _gpu_out(g: dict, get: Get) -> GpuPart:
    return GpuPart(rows=[Breakdown(**r) for r in g["rows"]], delay=g["delay"], short=g["short"],
                   **{k: get(g[k]) for k in GpuPart.FRAMES})


def _tuple(value):
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


#: A frame, filed under its field's name.
FRAME: Codec = (lambda frame, put, name: put(name, frame), lambda name, get: get(name))

#: How each field of a ``FilePart`` but its account crosses: ``encode(value, put, field) -> plain values``
#: (its frames filed by ``put``) and ``decode(plain, get) -> value``; a None crosses as None.
FIELDS: dict[str, Codec] = {
    "lanes": FRAME,
    "stages": (_stages_in, _stages_out),
    "serving": (lambda s, put, name: s.to_dict(), lambda d, get: Interference.from_dict(d)),
    "segments": (lambda segs, put, name: [asdict(s) for s in segs], lambda segs, get: [Segment(**s) for s in segs]),
    "comm": _frames(CommPart, ("facts",)),
    "gpu": (_gpu_in, _gpu_out),
    "strips": FRAME,
    "critical": _frames(CriticalPart),
    "requests": _frames(RequestsPart),
    "memory": _frames(MemoryPart),
    "launch": _frames(LaunchPart),
    "memcpy": FRAME,
    "flops": _frames(FlopsPart, ("gpu_ns",)),
}
