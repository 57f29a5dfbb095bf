"""GPU annotations, the launch queue per stream and operators' launch delays, as frozen data: times int64 ns,
counts int, unknown null (``analysis/launch``).

Definitions:
- **GPU annotation** (Kineto's ``gpu_user_annotation``: a user range, or a profiler step, as the GPU lived it,
  drawn on a stream): per name, ``count`` ranges; ``gpu_ns`` the length of the union of its ranges on each
  GPU stream, summed over streams (nested or overlapping ranges of one name count once;
  HolisticTraceAnalysis sums the ranges instead, so ``sum_ns`` is given too). The GPU operations (kernels,
  copies, memsets, communication) that lie within that union on the annotation's own lane and stream:
  ``kernel_count`` and ``kernel_ns`` (the sum of their durations); ``kernels`` the few of them with most
  time, by kernel name.
- **Launch queue** of a stream: at each instant, the GPU operations on it whose launching call has begun on
  the host (joined by correlation id) and that have not yet ended on the GPU (HolisticTraceAnalysis'
  "queue length"; CUDA blocks the launching thread at about ``FULL_QUEUE`` of them). Over the stream's own
  window (its first launch to its last end): ``max``, the time-weighted ``mean``, ``p50`` and ``p95`` (the
  least length the queue stays at or under for that share of the window), ``at_max_ns`` (time at ``max``),
  ``empty_ns`` (time at 0) and ``full_ns`` (time at ``FULL_QUEUE`` or more).
- **Launch delay** of an operation: its GPU start − its launching call's start (never below 0). Per
  operator (the innermost CPU operator open on the launching thread at the call's start; null: none is):
  ``count`` launches, ``total_ns``, ``mean_ns``, exact ``median_ns``, ``max_ns`` of the delays,
  ``kernel_mean_ns`` (the mean duration of what it launched) and ``over_share`` (the share of its launches
  whose delay exceeds that operation's own duration).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: A stream's launch queue holds about this many operations before a launch blocks (HolisticTraceAnalysis'
#: queue-length counters, "Augmented Counters": 1024 or more and the CPU stalls).
FULL_QUEUE = 1024


@dataclass(frozen=True)
class AnnotatedKernel:
    """One kernel name under a GPU annotation: ``name`` short (``report.names``), ``name_full`` as recorded."""

    name: str | None
    name_full: str | None
    count: int
    gpu_ns: int


@dataclass(frozen=True)
class GpuAnnotation:
    """One GPU annotation name over the job (definitions above)."""

    name: str | None
    count: int
    gpu_ns: int
    sum_ns: int
    kernel_count: int
    kernel_ns: int
    kernels: list[AnnotatedKernel] = field(default_factory=list)


@dataclass(frozen=True)
class LaunchQueue:
    """One GPU stream's launch queue over its own window (definitions above)."""

    lane: str
    rank: int | None
    stream: int | None
    launches: int
    window_ns: int
    max: int
    mean: float
    p50: int
    p95: int
    at_max_ns: int
    empty_ns: int
    full_ns: int


@dataclass(frozen=True)
class LaunchDelay:
    """One operator's launch delays (definitions above)."""

    operator: str | None
    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    max_ns: int
    kernel_mean_ns: float
    over_share: float
