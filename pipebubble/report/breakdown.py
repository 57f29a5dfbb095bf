"""GPU time as unions (compute, exposed communication and memory, idle by cause), the kernel summary over
the job and the host side (runtime calls, launch delay, annotation ranges)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Breakdown:
    """One GPU's time over a window (its whole first-to-last busy window, ``step`` null, or one profiler
    step's range), as unions, never sums of overlapping work: ``compute_ns`` = union of non-communication
    kernels; ``comm_ns`` = union of communication kernels; ``comm_exposed_ns`` = communication not under
    compute; ``memory_ns`` = union of memcpy/memset, ``memory_exposed_ns`` = that under neither;
    ``idle_ns`` = window − union of all GPU work. compute + exposed comm + exposed memory + idle = window,
    exactly. ``idle_causes`` splits idle by the idle account's causes (``report.idle.CAUSES``; they add up to
    ``idle_ns``);
    ``overlap`` is the share of communication hidden under compute (None without communication)."""

    lane: str
    rank: int | None
    pid: int | None
    device: int | None
    step: int | None
    window_start_ns: int
    window_ns: int
    compute_ns: int
    comm_ns: int
    comm_exposed_ns: int
    memory_ns: int
    memory_exposed_ns: int
    idle_ns: int
    idle_causes: dict[str, int] = field(default_factory=dict)
    overlap: float | None = None


@dataclass(frozen=True)
class KernelStat:
    """One GPU operation name over the whole job (``nsys stats cuda_gpu_kern_sum`` / ``cuda_gpu_mem_time_sum``):
    ``name`` its short name, unique in the table (``report.names``: ``elementwise_kernel[CUDAFunctor_add]``),
    ``name_full`` the name the trace gives it (a C++ signature, template arguments and all); ``kind`` (JSON
    ``class``) is compute, comm, memcpy or memset; ``share`` its total over all GPU work's total (a sum:
    kernels overlapping on streams each count)."""

    name: str | None
    name_full: str | None
    kind: str
    count: int
    total_ns: int
    mean_ns: float
    median_ns: float
    min_ns: int
    max_ns: int
    std_ns: float
    share: float

    def to_dict(self) -> dict[str, Any]:
        body = dict(self.__dict__)
        return {"name": body.pop("name"), "name_full": body.pop("name_full"), "class": body.pop("kind"), **body}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelStat:
        """A row of the JSON report; one saved before ``name_full`` was kept names it with its full name."""
        data = dict(data)
        data["kind"] = data.pop("class", data.get("kind"))
        data.setdefault("name_full", data.get("name"))
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class CallStat:
    """A host call or range by name (``cuda_api_sum``, ``nvtx_sum``): count, total, mean, max."""

    name: str
    count: int
    total_ns: int
    mean_ns: float
    max_ns: int


@dataclass(frozen=True)
class StreamStat:
    """GPU operations of one lane, stream, class (``kind``: compute, comm, memcpy, memset) and ``tag`` (a
    copy's direction and host memory as its name says them, ``HtoD pageable``, ``DtoD``; ``layout`` for a
    layout-conversion kernel; else null): count and total time, and how many ran under ``Host.short_kernel_ns``
    (``tiny``, their time ``tiny_ns``; kernels only)."""

    lane: str
    stream: int | None
    kind: str
    tag: str | None
    count: int
    total_ns: int
    tiny: int = 0
    tiny_ns: int = 0


@dataclass(frozen=True)
class LaneGaps:
    """One GPU's idle between two consecutive kernels that both ran under ``Host.short_kernel_ns``: ``count``
    gaps of ``total_ns``, each at most ``max_gap_ns`` (a longer gap is another cause's)."""

    lane: str
    count: int
    total_ns: int
    max_gap_ns: int = 1_000_000


@dataclass(frozen=True)
class ThreadCall:
    """A host thread's start-up calls (context, module, library, handle creation; allocations and frees) and
    framework markers (DDP, FSDP, TorchRec, CUDA-graph replays) by name: count, total, and ``inside_ns``, the
    time within its rank's (or process's) GPU window, first to last GPU operation."""

    lane: str
    name: str
    count: int
    total_ns: int
    inside_ns: int


@dataclass(frozen=True)
class Facts:
    """What the findings read that the unions do not keep (``analysis/breakdown/facts``)."""

    streams: list[StreamStat] = field(default_factory=list)
    tiny_gaps: list[LaneGaps] = field(default_factory=list)
    calls: list[ThreadCall] = field(default_factory=list)


@dataclass(frozen=True)
class Host:
    """The host side: runtime API calls, launch delay (a launch call's start to its kernel's start),
    kernels shorter than ``short_kernel_ns``, annotation (NVTX) ranges, and CPU operators (``ops``, kind
    ``cpu_op``, by name over every rank: count and total inclusive time, so a nested operator counts in its
    parent's too); ``steps``: the distinct steps the host marked over the job (``ProfilerStep#N``, or the
    ranges ``--step-regex`` matches), null without any, what a count per step divides by; ``facts``: per GPU
    stream and host thread, what the findings read."""

    api: list[CallStat] = field(default_factory=list)
    ranges: list[CallStat] = field(default_factory=list)
    launches: int = 0
    launch_delay_mean_ns: float | None = None
    launch_delay_median_ns: float | None = None
    launch_delay_max_ns: int | None = None
    short_kernels: int = 0
    short_kernel_ns: int = 10_000
    ranges_total: int = 0  # distinct range names (``ranges`` lists the 1,000 with the most time)
    facts: Facts = field(default_factory=Facts)
    ops: list[CallStat] = field(default_factory=list)
    steps: int | None = None
