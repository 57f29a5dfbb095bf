"""The report's diagnosis: findings, sorted by what fixing each would give back, biggest first.

A finding's ``worth_ns`` is the step time a fix would give back, computed on the critical path or by the
what-if replay, never by summing idle time; ``worth_gpu_ns`` is that time times the GPUs it frees (GPU-ns per
step); ``how`` says how the worth was computed. ``evidence`` holds the measured numbers the finding rests on
(names of report fields or plain measures, in ns, bytes, fractions or counts), so every finding can be checked
against the rest of the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Findings worth at most this share of their step are left out (and the report says when none is left).
THRESHOLD = 0.01

#: Kinds of finding, as ``kind`` names them.
KINDS = (
    "warmup_profile",  # the profile holds the job's start-up (context, modules, first allocations)
    "too_few_microbatches",  # the bubble a larger m would take back
    "imbalance",  # the slowest stage sets the pace
    "slow_worker",  # one worker of a DP x PP job computes longer than the same stage in the other replicas
    "schedule",  # another schedule replays shorter
    "exposed_p2p",  # sends/receives between stages not hidden under compute
    "late_rank",  # the rank the others wait for at collectives, and why it is late
    "exposed_comm",  # DP/FSDP/EP communication not overlapped with compute
    "launch_bound",  # GPU idle waiting for the host to launch (short kernels, launch delay)
    "sync_stall",  # GPU idle while the host waits in a synchronize, and refills the queue after it
    "blocking_copy",  # GPU idle while the host is in a copy that returns once done (pageable memory)
    "allocator",  # GPU idle while the host is in cudaMalloc / cudaFree
    "cpu_bound",  # GPU idle while the launching thread runs operators or Python
    "exposed_copy",  # memcpy time no compute or communication hides (direction, pageable or pinned)
    "comm_on_compute_stream",  # NCCL/RCCL kernels on the compute stream: no overlap by construction
    "tiny_kernels",  # GPU idle between kernels under 10 µs (launch overhead)
    "layout_conversion",  # cuDNN NCHW <-> NHWC conversions that channels_last removes
    "data_loader",  # a rank's step held back by its data loader
    "interference",  # prefill/decode interference in serving
    "memory",  # the best what-if does not fit in memory
    "queueing",  # requests' TTFT tail spent waiting in the queue
    "tail_interference",  # requests' TPOT tail from decodes sharing steps with prefills
    "preemption",  # requests evicted from the KV cache and queued again
    "prefill_heavy_tail",  # requests' TTFT tail waiting through prefill-heavy engine steps
)


@dataclass(frozen=True)
class Where:
    """Where a finding lies: ranks, pipeline stages and GPU lanes (each empty when it does not apply)."""

    ranks: list[int] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    kind: str
    title: str
    where: Where
    cause: str
    evidence: dict[str, Any]
    worth_ns: int
    worth_gpu_ns: int
    action: str
    how: str  # how worth_ns was computed (critical path, replay, ...)
    worth_share: float | None = None  # worth_ns / the step time it is part of
    cost_per_hour: float | None = None  # worth_gpu_ns per step as dollars an hour, with --gpu-cost
