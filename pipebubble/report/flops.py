"""The FLOPs part of the report: useful work per operator, GPU, stage and step, as frozen data.

Definitions (``analysis/flops``): an operator's ``flops`` are its ``flops`` arg (``source: "arg"``) or the
model of its recorded shapes (``"shapes"``); ``bytes`` the tensors it reads and writes once; ``gpu_ns`` the
time of the GPU operations it launched (a CPU job: its own time). ``intensity`` = flops / bytes;
``flops_per_s`` = flops / gpu_ns; ``bound`` is ``compute`` where the intensity reaches the device's ridge
point (peak FLOP/s over peak bytes/s), else ``memory``; ``peak_share`` is the share of the roof that binds
it: flops_per_s over the device's peak for the dtype (compute-bound), bytes/s over its bandwidth
(memory-bound), flops_per_s over the peak where the bandwidth is unknown. A GPU's ``mfu`` is its model
FLOPs (matrix products, attention and convolutions) over its window (first to last busy instant) × its dense
peak for each dtype: Σ flops_d / peak_d / window. A stage's and a step's is the same over their GPUs (a step:
each GPU's window in that step). ``unmodelled_share``:
the part of the GPU time of non-communication operations that no modelled operator launched.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class FlopsOp:
    name: str
    input_dims: str | None
    dtype: str | None
    cls: str  # matmul, attention, conv, elementwise, reduction
    count: int
    flops: int
    bytes: int | None
    gpu_ns: int
    flops_per_s: float | None
    intensity: float | None
    bound: str | None  # compute | memory; null without the device's peaks
    peak_share: float | None
    source: str  # arg | shapes


@dataclass(frozen=True)
class FlopsGpu:
    lane: str
    rank: int | None
    device: str | None  # the device as the trace names it
    peak_flops_per_s: float | None  # for the lane's main dtype (the one with the most FLOPs)
    peak_bytes_per_s: float | None
    dtype: str | None
    flops: int  # model FLOPs (matrix work)
    gpu_ns: int  # GPU time of the operators counted
    window_ns: int
    flops_per_s: float | None  # achieved while the counted operators ran
    mfu: float | None
    stage: int | None = None
    replica: int | None = None


@dataclass(frozen=True)
class FlopsStage:
    stage: int
    flops: int
    gpu_ns: int
    flops_per_s: float | None
    mfu: float | None
    replica: int | None = None


@dataclass(frozen=True)
class FlopsStep:
    step: int
    flops: int
    window_ns: int | None  # the step's GPU windows, summed over its GPUs (null: a CPU lane's, not measured)
    mfu: float | None


@dataclass(frozen=True)
class Unmodelled:
    name: str | None  # the operator that launched the work (null: none did)
    gpu_ns: int
    share: float


@dataclass(frozen=True)
class Flops:
    ops: list[FlopsOp] = field(default_factory=list)  # by GPU time, biggest first (at most OPS_KEPT)
    by_gpu: list[FlopsGpu] = field(default_factory=list)
    by_stage: list[FlopsStage] = field(default_factory=list)
    by_step: list[FlopsStep] = field(default_factory=list)
    unmodelled_share: float | None = None
    unmodelled: list[Unmodelled] = field(default_factory=list)  # biggest first (at most 20)
    flops: int = 0  # model FLOPs of the job
    gpu_ns: int = 0  # GPU time of the operators counted
    modelled_share: float | None = None  # GPU time in modelled operators over GPU time of non-comm work
    mfu: float | None = None  # the job's: Σ over GPUs of flops_d / peak_d over Σ of their windows
    # the matrix work's FLOP/s while it ran against the peak: Σ flops_d / peak_d over the GPU time of the
    # products, attention and convolutions counted
    peak_share: float | None = None
    peak_source: str | None = None  # "table" (the device's name), "flag" (--peak-flops), null: no peak
    notes: list[str] = field(default_factory=list)
