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


def billed(kinds: list[str]) -> str:
    """What a job's ``*_gpu_ns`` figures count, given its lanes' kinds: ``"GPU"``, or ``"CPU"`` for a job whose
    lanes hold no GPU (a pipeline of CPU ranks on gloo), whose stages' time is CPU time."""
    return "CPU" if kinds and "gpu" not in kinds else "GPU"
