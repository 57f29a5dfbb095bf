"""The timeline every job gets: one step drawn per GPU, each of a fixed number of bins split into compute,
communication, memory operations and idle by cause (``analysis/breakdown/strips.py``), as frozen data."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipebubble.report.idle import CAUSES

#: A bin's classes, in order: compute, exposed comm, exposed memory, then idle by cause (the idle account's).
CLASSES = ("compute", "comm", "memory", *CAUSES)


@dataclass(frozen=True)
class Strip:
    """One GPU's row: its step window [start_ns, end_ns) and, per bin, the ns of each class (``CLASSES``
    order; they add up to the bin's width)."""

    lane: str
    rank: int | None
    start_ns: int
    end_ns: int
    bins: list[list[int]]


@dataclass(frozen=True)
class Strips:
    """The step drawn for the job (null: the GPUs' whole windows, the trace has no steps), a row per GPU
    that ran it, and the GPUs that did not (``missing``)."""

    step: int | None
    rows: list[Strip]
    classes: list[str] = field(default_factory=lambda: list(CLASSES))
    missing: list[str] = field(default_factory=list)


def bin_edges(start, end, i, bins: int):
    """Where bin ``i`` of ``bins`` over [start, end) begins (ints, or polars expressions alike):
    start + ⌈(end − start)·i/bins⌉, as whole and remainder parts so that no product leaves int64."""
    span = end - start
    return start + span // bins * i + (span % bins * i + bins - 1) // bins
