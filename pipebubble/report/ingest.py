"""What was read: the files, their events and spans, what was skipped, each file's clock against the
job's, and every lane's busy and idle time over its window."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ClockOffset:
    """One file's clock against the job's (``analysis.clock``): its times were recorded ``offset_ns`` ahead of
    the job's clock and moved back by it (``aligned``); ``residual_ns`` is the median distance of the single
    measurements from it, ``support`` how many calls, pairs or passes measured it, ``evidence`` which."""

    source: str
    rank: int | None
    offset_ns: int
    residual_ns: int | None = None
    evidence: str | None = None
    support: int = 0
    aligned: bool = True


#: Why events were not kept that mean the trace lost them (bytes that do not parse, values out of range), not
#: that they are of no use here (metadata, instants) or lie at a profile window's edge (a ``B`` without ``E``).
LOST = ("bad_time", "bad_value", "malformed_line", "unreadable_line", "cut_off_line", "out_of_range",
        "device_out_of_range")


@dataclass(frozen=True)
class Completeness:
    """How much of the job the input holds, what gates check first: files cut off mid-write (read up to their
    last whole event), events lost to damage (``LOST``), and the ranks present against the job's
    ``world_size`` where a file names it. ``reasons``: each gap as a sentence naming what is missing."""

    complete: bool = True
    cut_off: list[str] = field(default_factory=list)
    unread_bytes: int = 0
    lost_events: int = 0
    ranks: int = 0  # ranks present
    world_size: int | None = None
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class IngestSummary:
    files: list[str] = field(default_factory=list)
    events_read: int = 0
    spans: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    formats: dict[str, str] = field(default_factory=dict)
    unread_bytes: int = 0
    clock_offsets: list[ClockOffset] = field(default_factory=list)  # files of a multi-file job, in file order
    memory_events: int = 0  # allocator events read (``memory`` summarises them)
    completeness: Completeness = field(default_factory=Completeness)


@dataclass(frozen=True)
class Lane:
    lane: str
    kind: str
    rank: int | None
    pid: int | None
    tid: int | None
    device: int | None
    stream: int | None
    busy_ns: int
    idle_ns: int
    window_start_ns: int
    window_end_ns: int

    @property
    def window_ns(self) -> int:
        return self.window_end_ns - self.window_start_ns

    @property
    def idle_fraction(self) -> float:
        return self.idle_ns / self.window_ns if self.window_ns else 0.0


def completeness(files: list[tuple[str, dict]], skipped: dict[str, int]) -> Completeness:
    """The input's completeness from each file's (source, meta) and the job's skipped counts."""
    cut = [(source, int(meta.get("unread_bytes") or 0)) for source, meta in files if meta.get("unread_bytes")]
    lost = sum(n for reason, n in skipped.items() if reason in LOST)
    ranks = {r for _, meta in files for r in ([meta.get("rank")] + list((meta.get("ranks") or {}).values()))
             if r is not None}
    worlds = [int(meta["world_size"]) for _, meta in files if meta.get("world_size")]
    world = max(worlds) if worlds else None
    reasons = [f"{source}: cut off mid-write, {unread:,} bytes after its last whole event unread"
               for source, unread in cut]
    if lost:
        reasons.append(f"{lost:,} events lost to damage ({', '.join(r for r in LOST if skipped.get(r))})")
    if world is not None and len(ranks) < world:
        reasons.append(f"{len(ranks)} of the job's {world} ranks present (world_size {world})")
    return Completeness(not reasons, [source for source, _ in cut], sum(n for _, n in cut), lost, len(ranks), world,
                        reasons)


def billed(kinds: list[str]) -> str:
    """What a job's ``*_gpu_ns`` figures count, given its lanes' kinds: ``"GPU"``, or ``"CPU"`` for a job whose
    lanes hold no GPU (a pipeline of CPU ranks on gloo), whose stages' time is CPU time."""
    return "CPU" if kinds and "gpu" not in kinds else "GPU"
