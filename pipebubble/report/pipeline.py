"""A pipeline's part of the report: its stages over the step window, the timeline's segments, the waits
and what they waited for, the metrics against theory and the what-if recommendations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stage:
    """One pipeline stage over the analysed step window W (ARCHITECTURE.md definitions).

    ``busy_ns`` is compute only; ``comm_ns`` is communication not overlapped by compute (a comm kernel
    spinning while it waits for a peer counts here and as idle); idle = |W| − busy = fill + drain + steady.
    """

    stage: int
    name: str
    lanes: list[str]
    busy_ns: int
    comm_ns: int
    idle_ns: int
    fill_ns: int
    drain_ns: int
    steady_idle_ns: int
    utilization: float
    forward_ns: int = 0
    backward_ns: int = 0
    weight_ns: int = 0
    microbatches: int = 0
    microbatch_cv: float | None = None
    p2p_wait_ns: int = 0  # its receives' spin before the peer's send began (``analysis/comm/p2p.py``), inside W
    p2p_transfer_ns: int = 0  # the rest of its receives, inside W
    # the coordinates the trace names for it (null where unnamed): its global rank, replica (the data-parallel
    # copy of the pipeline it belongs to), tensor-parallel rank, and the model chunks it ran
    rank: int | None = None
    replica: int | None = None
    tp: int | None = None
    chunk: list[int] | None = None


@dataclass(frozen=True)
class Segment:
    """A stretch of one stage's timeline: compute of one micro-batch pass, or communication."""

    stage: int
    start_ns: int
    end_ns: int
    phase: str  # forward | backward | weight | comm | other | prefill | decode | mixed
    microbatch: int | None = None
    chunk: int | None = None
    step: int | None = None
    lane: str | None = None  # the lane it ran on, for a timeline row per lane


@dataclass(frozen=True)
class Wait:
    """An idle gap on a stage (or, in a job that is not a pipeline, a rank's collective spinning), with what
    it waited for and what ran around it. ``waited_for`` names the rank that arrived last at the collective
    a ``collective`` wait spun in, or the rank whose send an ``upstream``/``downstream`` wait's receive
    waited for (where the receive was paired with it)."""

    stage: int | None
    start_ns: int
    dur_ns: int
    cause: str  # fill | drain | upstream | downstream | collective | comm | host | sync | unknown
    before: str | None
    after: str | None
    step: int | None = None
    lane: str | None = None
    rank: int | None = None
    waited_for: int | None = None
    pid: int | None = None  # the waiting process, where the trace names no ranks
    waited_for_pid: int | None = None  # the process waited for, where the trace names no ranks


@dataclass(frozen=True)
class StepResult:
    step: int
    window_start_ns: int
    window_end_ns: int
    bubble_fraction: float


@dataclass(frozen=True)
class Recommendation:
    """A predicted step under one change (``analysis/schedule/whatif.py`` replays it); ``speedup`` = current step time
    / predicted step time. ``bubble_fraction`` is defined as the measured bubble is: 1 − the measured step's compute
    / (p · the predicted step), so the current row's is the measured one where its replay meets the measured
    step; ``replay_bubble_fraction`` is the replay's own, its F/B/W passes alone busy (null in reports written
    before it; there ``bubble_fraction`` was the replay's own). Defined here, not in the analysis, because the
    report holds it: the report is the lower layer, and the analysis builds it."""

    label: str
    schedule: str
    microbatches: int
    chunks: int
    step_time_ns: int
    bubble_fraction: float
    speedup: float
    note: str = ""
    peak_memory_bytes: int | None = None  # the largest stage's predicted peak (null: memory not measured)
    fits: bool | None = None  # every stage within --memory-limit or its GPU's capacity (null: unknown)
    replay_bubble_fraction: float | None = None  # the replay's own: Σ (step − its passes) / (p · step)

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ReplicaRow:
    """One data-parallel replica of a DP × PP job over its own step windows (first to last pass compute of
    its stages): mean step, bubble, and each stage's compute per step."""

    replica: int
    step_time_ns: int
    bubble_fraction: float
    stage_busy_ns: list[int]
    replayed_step_ns: int | None = None


@dataclass(frozen=True)
class WorkerRow:
    """One worker (a stage of one replica): its compute per step against its peers' median (the same stage in
    the other replicas), and the job's replayed step with its compute at that median (``worth_ns`` given back)."""

    stage: int
    replica: int
    name: str
    rank: int | None
    compute_ns: int
    peers_ns: int
    ratio: float
    step_time_ns: int | None = None
    worth_ns: int | None = None


@dataclass(frozen=True)
class Replicas:
    """A DP × PP job: p stages × ``count`` replicas, which sync their gradients each step, so the job's step is
    its slowest replica's. ``analysed``: the replica the stages, waits and what-if rows describe (the slowest).
    Job figures over the steps every replica completed: step = first to last pass compute over all replicas,
    bubble = Σ idle of every worker / (p · replicas · Σ step). ``replayed_step_ns``: the replicas' calibrated
    replays, the job's being the longest. ``balanced``: the layers moved so that each stage's least compute
    over the replicas is even, the same move in every replica, replayed; ``heavy_stage`` the stage whose
    least compute is the most, ``heavy_ratio`` that against the median stage's,
    ``heavy_min_ratio`` the least such ratio in any one replica (above 1: heavier in every replica)."""

    count: int
    analysed: int
    step_time_ns: int
    bubble_fraction: float
    rows: list[ReplicaRow] = field(default_factory=list)
    workers: list[WorkerRow] = field(default_factory=list)
    replayed_step_ns: int | None = None
    balanced_step_ns: int | None = None
    balanced_worth_ns: int | None = None
    heavy_stage: int | None = None
    heavy_ratio: float | None = None
    heavy_min_ratio: float | None = None
    # the slow workers (WorkerRow.name) replayed at their peers' median in the balanced what-if and its
    # baseline: the partition move is judged as if they ran at their peers' pace
    balanced_paced: list[str] = field(default_factory=list)
    sync_wait_ns: int = 0  # per step, the workers' waits for their stage's slowest peer (the gradient sync)
    # the replica computing the most, its compute against the others' (each stage's median), and the job's
    # replay with all its workers at their peers' median (a slow node, not one GPU)
    slow_replica: int | None = None
    slow_replica_ratio: float | None = None
    slow_replica_step_ns: int | None = None
    slow_replica_worth_ns: int | None = None


@dataclass(frozen=True)
class Pipeline:
    stages: int
    microbatches: int | None
    schedule: str | None
    chunks: int
    window_ns: int
    window_start_ns: int
    bubble_fraction: float
    theoretical_bubble_fraction: float | None
    excess_bubble_fraction: float | None
    excess_causes: dict[str, float]
    stage_time_cv: float
    imbalance: float
    throughput_bound: float  # steps per second if every stage ran only its own compute, back to back
    pipeline_efficiency: float | None
    microbatches_inferred: bool = False
    steps: list[StepResult] = field(default_factory=list)
    step_time_ns: int = 0
    idle_gpu_ns_per_step: int = 0  # GPU time billed without work, per step: the stages' idle summed
    idle_cost_per_hour: float | None = None
    idle_cost_per_step: float | None = None
    effective_price_per_useful_gpu_hour: float | None = None
    recommendations: list[Recommendation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # why this job is a pipeline (labels, send/recv, ...)
    # steps per second if every stage ran its compute and its exposed communication back to back
    throughput_bound_with_comm: float = 0.0
    replayed_step_ns: int | None = None  # the what-if simulator's replay of the measured step
    replay_error: float | None = None  # (replayed - measured) / measured step time
    # sends paired with their receives across ranks: pairs, wait_ns, transfer_ns (the stages' sums inside
    # W) and unpaired {reason: operations}; None without point-to-point operations
    p2p: dict[str, Any] | None = None
    replicas: Replicas | None = None  # a DP × PP job's replicas; null for one pipeline
