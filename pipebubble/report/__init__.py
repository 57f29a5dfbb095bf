"""The result of an analysis as plain frozen data, and its JSON form.

``SCHEMA_VERSION`` guards the public JSON contract (ARCHITECTURE.md): keys may be added freely; renaming or
dropping one bumps the version.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import msgspec

from pipebubble.errors import PipebubbleError
from pipebubble.report.critical import CriticalPath, PathSegment, PathShare  # noqa: F401 (the report's)
from pipebubble.report.findings import Finding, Where  # noqa: F401 (the report's)
from pipebubble.report.memory import Memory, MemoryDevice, MemoryStage, MemoryStep  # noqa: F401 (the report's)
from pipebubble.report.requests import RequestRow, Requests  # noqa: F401 (the report's)
from pipebubble.report.serving import Episode, Interference, StepClass, ms4
from pipebubble.report.strips import Strip, Strips  # noqa: F401 (the report's)

__all__ = ["Episode", "Interference", "StepClass", "ms4"]  # the serving part, re-exported: one place to import

SCHEMA_VERSION = 1
SNIFF_BYTES = 256  # a saved report starts with schema_version (Kineto's key is schemaVersion)


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
    / predicted step time. Defined here, not in the analysis, because the report holds it: the report is the
    lower layer, and the analysis builds it."""

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

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CollectiveRank:
    """One rank's collectives: ``wait_ns`` its collective kernels spun before the last peer arrived (waiting,
    not work); ``late_ns`` the time its peers spun waiting for it, at the calls where it arrived last
    (``last`` of its ``calls``)."""

    rank: int | None
    calls: int
    wait_ns: int
    late_ns: int
    last: int = 0
    lane: str | None = None
    pid: int | None = None  # a process where the trace names no ranks (``rank`` is then null)


@dataclass(frozen=True)
class CollectiveCall:
    """One collective matched across ranks (its members' kernels end together): the ``seq``-th call of
    ``name`` in the job; ``skew_ns`` from the first arrival to the last (``last_rank``), ``waited_ns`` the
    peers' spin summed."""

    name: str
    seq: int
    start_ns: int
    skew_ns: int
    last_rank: int | None
    waited_ns: int
    ranks: int = 0
    last_pid: int | None = None  # the process that arrived last, where the trace names no ranks


#: Fewer matched calls than this make a claim across ranks thin (``Support.thin``).
THIN_CALLS = 3


@dataclass(frozen=True)
class Support:
    """How much evidence the claims across ranks rest on: ``calls`` matched over ``ranks`` participants;
    ``world`` the job's ranks when only some were traced (None: all of them); ``straggler_calls`` the calls
    the straggler arrived last at. ``thin``: fewer than 3 calls, or only some of the job's ranks."""

    calls: int
    ranks: int
    world: int | None = None
    straggler_calls: int | None = None
    thin: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "thin", self.calls < THIN_CALLS or self.world is not None)


@dataclass(frozen=True)
class Collectives:
    """Collective calls matched across the ranks of a multi-rank job (pipeline or not). ``matched`` calls
    plus the ``left_out`` ones (by reason) account for every collective call of every participant
    (``participant_calls``)."""

    calls: int
    ranks: list[CollectiveRank] = field(default_factory=list)
    worst: list[CollectiveCall] = field(default_factory=list)
    straggler: int | None = None  # the rank the others waited for most, when one stands out
    waited_ns: int = 0  # every rank's collective spin, summed
    matched_by: str = "end"  # how calls were paired across ranks: their kernels' ends
    unmatched: int = 0  # participants' calls in no matched collective (sum of ``left_out``)
    straggler_pid: int | None = None  # the straggler, where it is a process of a trace without ranks
    left_out: dict[str, int] = field(default_factory=dict)  # reason (collectives.LEFT_OUT) -> participants' calls
    participant_calls: int = 0  # every participant's collective calls: in matched calls or left out
    support: Support | None = None


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


@dataclass(frozen=True)
class Breakdown:
    """One GPU's time over a window (its whole first-to-last busy window, ``step`` null, or one profiler
    step's range), as unions, never sums of overlapping work: ``compute_ns`` = union of non-communication
    kernels; ``comm_ns`` = union of communication kernels; ``comm_exposed_ns`` = communication not under
    compute; ``memory_ns`` = union of memcpy/memset, ``memory_exposed_ns`` = that under neither;
    ``idle_ns`` = window − union of all GPU work. compute + exposed comm + exposed memory + idle = window,
    exactly. ``idle_causes`` splits idle (host_launch, sync, peer, other; they add up to ``idle_ns``);
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
    ``kind`` (JSON ``class``) is compute, comm, memcpy or memset; ``share`` its total over all GPU work's
    total (a sum: kernels overlapping on streams each count)."""

    name: str
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
        return {"name": body.pop("name"), "class": body.pop("kind"), **body}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KernelStat:
        data = dict(data)
        data["kind"] = data.pop("class", data.get("kind"))
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
class Host:
    """The host side: runtime API calls, launch delay (a launch call's start to its kernel's start),
    kernels shorter than ``short_kernel_ns``, and annotation (NVTX) ranges."""

    api: list[CallStat] = field(default_factory=list)
    ranges: list[CallStat] = field(default_factory=list)
    launches: int = 0
    launch_delay_mean_ns: float | None = None
    launch_delay_median_ns: float | None = None
    launch_delay_max_ns: int | None = None
    short_kernels: int = 0
    short_kernel_ns: int = 10_000
    ranges_total: int = 0  # distinct range names (``ranges`` lists the 1,000 with the most time)


@dataclass(frozen=True)
class Report:
    ingest: IngestSummary = field(default_factory=IngestSummary)
    lanes: list[Lane] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    pipeline: Pipeline | None = None
    waits: list[Wait] = field(default_factory=list)
    interference: Interference | None = None
    timeline: list[Segment] = field(default_factory=list)
    collectives: Collectives | None = None
    notes: list[str] = field(default_factory=list)  # what the job is (a pipeline or not, and why; a straggler)
    breakdown: list[Breakdown] = field(default_factory=list)
    kernels: list[KernelStat] = field(default_factory=list)
    host: Host | None = None
    memory: Memory | None = None
    findings: list[Finding] = field(default_factory=list)  # biggest worth first (``analysis/findings``)
    strips: Strips | None = None  # one step per GPU, binned (``analysis/breakdown/strips``); null: no GPU
    # each step's critical path across ranks; only the median step's keeps its segments
    critical_path: list[CriticalPath] = field(default_factory=list)
    requests: Requests | None = None  # served requests (OTLP / Jaeger spans, or an engine's request events)
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return from_dict(cls, data)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report: ``schema_version`` first, then the sections in the documented order; plain JSON
        values (lists, not tuples), so it equals what a saved report reads back as."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        version = body.pop("schema_version")
        body["interference"] = None if self.interference is None else self.interference.to_dict()
        body["kernels"] = [k.to_dict() for k in self.kernels]
        body["requests"] = None if self.requests is None else self.requests.to_dict()
        head = {"schema_version": version, "ingest": body.pop("ingest"), "findings": body.pop("findings")}
        return msgspec.to_builtins({**head, **body}, str_keys=True)


def from_dict(cls: type, data: Any) -> Any:
    """Rebuild a report dataclass (and everything nested in it) from its ``to_dict`` form, e.g. a saved
    JSON report or a cached one. Keys the dataclass does not know (added by later versions) are ignored."""
    if data is None or not is_dataclass(cls):
        return data
    if cls is Interference or cls is KernelStat or cls is Requests:  # their JSON keys are not their fields
        return cls.from_dict(data)
    hints = _hints(cls)
    return cls(**{k: _value(hints[k], v) for k, v in data.items() if k in hints})


@cache
def _hints(cls: type) -> dict[str, Any]:
    """The field types of a report dataclass, resolved once (not once per lane of a big report)."""
    every = get_type_hints(cls)
    return {f.name: every[f.name] for f in fields(cls)}


def _value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    args = [a for a in get_args(hint) if a is not type(None)]
    origin = get_origin(hint)
    if origin is list:
        return [_value(args[0], v) for v in value]
    if is_dataclass(hint):
        return from_dict(hint, value)
    if args and origin is not dict:  # X | None
        return _value(args[0], value)
    return value


def is_saved_report(path: Path) -> bool:
    """Whether ``path`` is a JSON report pipebubble wrote (``analyze --format json -o``), not a trace."""
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    try:
        with open(path, "rb") as file:
            return b'"schema_version"' in file.read(SNIFF_BYTES)
    except OSError:
        return False


def read_saved_report(path: Path) -> Report:
    """A saved JSON report as the Report it was; sections it lacks are empty."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipebubbleError(f"{path}: not a readable JSON report ({exc})") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise PipebubbleError(f"{path}: expected a report with schema_version {SCHEMA_VERSION}, found {version!r}")
    try:
        return Report.from_dict(data)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise PipebubbleError(f"{path}: not a report of schema_version {SCHEMA_VERSION} ({exc})") from None
