"""The memory part of the report, as frozen data: bytes are int, times int64 ns on the job's clock.

Definitions (ARCHITECTURE.md, "Memory"): a device's ``peak_bytes`` is the largest allocated total its
allocator reported (``Total Allocated``), ``peak_at_ns`` when it first reached it. A stage's
``static_bytes`` is what it holds with no micro-batch in flight (allocated before the first forward of its
step: weights, optimizer state, workspace); ``per_microbatch_bytes`` what one micro-batch holds from its
forward until its backward frees it (the median of what a backward frees), ``kept_per_microbatch_bytes``
what the step keeps to its end per forward (allocated at the end of its passes less ``static_bytes``, over
the forwards: gradients, a last stage's outputs); ``inflight_at_peak`` the micro-batches
(passes of a chunk) whose forward had begun and whose backward had not ended at the stage's peak
(``analysis/memory/part.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryStep:
    """One profiler step's peak on a device."""

    step: int
    peak_bytes: int
    peak_at_ns: int


@dataclass(frozen=True)
class MemoryDevice:
    """One device's allocator timeline, summarised. ``baseline`` is ``allocator`` when the trace states the
    allocator's totals, ``trace`` when they are running sums since the trace began (memory held before it is
    unseen). ``timeline`` is ``[[t_ns, allocated_bytes], ...]``: the largest total in each of at most
    ``TIMELINE_POINTS`` equal slices of the device's events, so its peak is the device's."""

    lane: str
    rank: int | None
    device_type: str
    device: int | None
    events: int
    peak_bytes: int
    peak_at_ns: int
    reserved_peak_bytes: int | None
    capacity_bytes: int | None
    start_bytes: int
    end_bytes: int
    baseline: str = "allocator"
    steps: list[MemoryStep] = field(default_factory=list)
    timeline: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryStage:
    """One pipeline stage's memory: its peak, the static part, the bytes one micro-batch holds, and how many
    were in flight at the peak (``expected_inflight``: what the schedule holds at most there, GPipe m,
    1F1B p−s; null where the schedule is unknown). ``lanes`` are the devices whose memory it is."""

    stage: int
    lanes: list[str]
    peak_bytes: int
    peak_at_ns: int
    static_bytes: int
    per_microbatch_bytes: int | None
    inflight_at_peak: int | None
    expected_inflight: int | None = None
    forwards_measured: int = 0
    capacity_bytes: int | None = None
    outside_bytes: int | None = None  # the device's peak outside the stage's passes (an optimizer step, say)
    chunks: int = 1  # model chunks of the stage whose passes were measured
    kept_per_microbatch_bytes: int | None = None  # held to the step's end, per forward


@dataclass(frozen=True)
class Memory:
    """Allocator events, summarised per device and per pipeline stage (``stages`` empty for a job that is not
    a pipeline). ``events`` counts the allocator events read."""

    events: int
    devices: list[MemoryDevice] = field(default_factory=list)
    stages: list[MemoryStage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


#: How to record allocator events, for a report that has none.
HOW_TO_RECORD = (
    "torch.profiler: profile(..., profile_memory=True) (pipebubble capture records it by default); "
    "Nsight Systems: nsys profile --cuda-memory-usage=true"
)
