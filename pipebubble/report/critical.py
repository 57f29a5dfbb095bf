"""The critical path of each step across ranks (``analysis/critical/``), as frozen data: its length equals the
step's duration; its segments tile it; each participant's share splits it by kind."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PathSegment:
    """A stretch of the critical path: on ``lane`` (a GPU stream ``rank0/gpu0/stream7`` or a CPU thread)."""

    rank: int | None
    pid: int | None
    lane: str
    start_ns: int
    end_ns: int
    kind: str  # compute | memory | comm | host | waiting


@dataclass(frozen=True)
class PathShare:
    """One participant's time on a step's critical path, by kind (they add up to its share of the step)."""

    rank: int | None
    pid: int | None
    compute_ns: int
    memory_ns: int
    comm_ns: int
    host_ns: int
    waiting_ns: int


@dataclass(frozen=True)
class CriticalPath:
    """A step's critical path: ``length_ns`` (= the step's duration), its segments (at most
    ``MAX_SEGMENTS``, of ``segments_total``) and each participant's share of it."""

    step: int | None
    start_ns: int
    length_ns: int
    segments: list[PathSegment]
    by_rank: list[PathShare]
    segments_total: int
