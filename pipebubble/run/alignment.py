"""The reduce's first step: every file's part moved onto the job's one clock.

``analysis.clock`` estimates each file's offset from the job (collective ends, send/recv ends, pass order);
here it is taken off every time a file's part holds (``shift``), and each file's offset and what to say about
it become ``ingest.clock_offsets`` and the report's notes.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from pipebubble.options import Options
from pipebubble.report import ClockOffset

if TYPE_CHECKING:
    from pipebubble.run.mapper import FilePart


def aligned(parts: list[FilePart], options: Options) -> tuple[list[FilePart], list[ClockOffset], list[str]]:
    """The parts on one clock (``analysis.clock``: each file's offset estimated from the job, then taken off
    every time it holds), each file's offset, and the notes to say about them. One file, or ``--no-align``:
    the recorded clocks."""
    if len(parts) < 2:
        return parts, [], []
    from pipebubble.analysis.comm import clock

    names = [_who(p) for p in parts]
    gpus = [lane for p in parts for lane, kind in zip(p.lanes["lane"], p.lanes["kind"], strict=True) if kind == "gpu"]
    found, problems = clock.estimate([p.stages for p in parts], [p.comm for p in parts], names, gpus)
    offsets = [
        ClockOffset(p.file.source, _rank(p), c.offset, c.residual, c.evidence, c.support,
                    options.align and c.problem is None)
        for p, c in zip(parts, found, strict=True)
    ]
    if not options.align:
        return parts, offsets, clock_notes(offsets, names, problems, applied=False)
    moved = [parts[k] if c.offset == 0 else shift(parts[k], c.offset) for k, c in enumerate(found)]
    return moved, offsets, clock_notes(offsets, names, problems)


def clock_notes(offsets: list[ClockOffset], names: list[str], problems: list[str], applied: bool = True
                ) -> list[str]:
    """One line when a file's clock was moved by more than ``clock.NOTE_NS`` (or would have been, under
    ``--no-align``), one for what could not be explained."""
    from pipebubble.analysis.comm.clock import NOTE_NS

    notes = []
    big = [(abs(o.offset_ns), k) for k, o in enumerate(offsets) if abs(o.offset_ns) > NOTE_NS]
    if big:
        _, k = max(big)
        o = offsets[k]
        evidence = {"collectives": "collective ends", "send_recv": "send/recv ends", "passes": "dependent passes"}
        done = "put on the job's clock" if applied else "are off the job's clock but kept as recorded (--no-align)"
        notes.append(
            f"clocks: {len(big)} of {len(offsets)} files {done} (largest: {names[k]}, "
            f"{o.offset_ns / 1e6:+,.3f} ms, from {o.support:,} {evidence.get(o.evidence or '', 'measurements')}"
            + (f", residual {o.residual_ns / 1e3:,.0f} µs" if o.residual_ns is not None else "")
            + (")" if not applied else "); --no-align keeps the recorded clocks")
        )
    if problems:
        notes.append("clocks: one offset per file cannot explain " + "; ".join(problems)
                     + (": those files keep their recorded clocks" if applied else ""))
    return notes


def _rank(part: FilePart) -> int | None:
    rank = part.file.meta.get("rank")
    if isinstance(rank, int):
        return rank
    ranks = part.lanes["rank"].drop_nulls().unique() if "rank" in part.lanes.columns else []
    return int(ranks[0]) if len(ranks) == 1 else None


def _who(part: FilePart) -> str:
    rank = _rank(part)
    return f"rank {rank}" if rank is not None else Path(part.file.source).name


def shift(part: FilePart, offset: int) -> FilePart:
    """``part`` with ``offset`` taken off every time it holds (its file's clock moved onto the job's)."""
    def frame(f: pl.DataFrame, columns: tuple[str, ...] = ("start", "end")) -> pl.DataFrame:
        present = [c for c in columns if c in f.columns]
        return f.with_columns(pl.col(c) - offset for c in present) if present else f

    stages = part.stages
    if stages is not None:
        stages = replace(stages, work=frame(stages.work), host=frame(stages.host))
    comm = part.comm
    if comm is not None:
        comm = replace(comm, calls=frame(comm.calls), p2p=frame(comm.p2p),
                       windows=frame(comm.windows, ("origin", "arrival", "end")))
    gpu = part.gpu
    if gpu is not None:
        gpu = replace(gpu, rows=[replace(r, window_start_ns=r.window_start_ns - offset) for r in gpu.rows])
    return replace(
        part,
        lanes=frame(part.lanes, ("window_start_ns", "window_end_ns")),
        stages=stages,
        comm=comm,
        gpu=gpu,
        segments=[replace(s, start_ns=s.start_ns - offset, end_ns=s.end_ns - offset) for s in part.segments],
        memory=None if part.memory is None else part.memory.shifted(offset),
        strips=None if part.strips is None else frame(part.strips, ("step_start", "step_end")),
        critical=None if part.critical is None else part.critical.shifted(offset),
        requests=None if part.requests is None else part.requests.shifted(offset),
    )

