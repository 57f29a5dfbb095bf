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
from pipebubble.report.breakdown import Breakdown, CallStat, Host, KernelStat  # noqa: F401 (the report's)
from pipebubble.report.collectives import (  # noqa: F401 (the report's)
    THIN_CALLS,
    CollectiveCall,
    CollectiveRank,
    Collectives,
    Support,
)
from pipebubble.report.critical import CriticalPath, PathSegment, PathShare  # noqa: F401 (the report's)
from pipebubble.report.findings import Finding, Where  # noqa: F401 (the report's)
from pipebubble.report.flops import Flops, FlopsGpu, FlopsOp, FlopsStage, FlopsStep, Unmodelled  # noqa: F401
from pipebubble.report.idle import IdleCause  # noqa: F401 (the report's)
from pipebubble.report.ingest import ClockOffset, Completeness, IngestSummary, Lane, billed  # noqa: F401 (the report's)
from pipebubble.report.launches import AnnotatedKernel, GpuAnnotation, LaunchDelay, LaunchQueue  # noqa: F401
from pipebubble.report.memcpy import Memcpy, MemcpyRow  # noqa: F401 (the report's)
from pipebubble.report.memory import Memory, MemoryDevice, MemoryStage, MemoryStep  # noqa: F401 (the report's)
from pipebubble.report.names import short_names
from pipebubble.report.pipeline import (  # noqa: F401 (the report's)
    Pipeline,
    Recommendation,
    ReplicaRow,
    Replicas,
    Segment,
    Stage,
    StepResult,
    Wait,
    WorkerRow,
)
from pipebubble.report.requests import RequestRow, Requests  # noqa: F401 (the report's)
from pipebubble.report.serving import Episode, Interference, StepClass, ms4
from pipebubble.report.strips import Strip, Strips  # noqa: F401 (the report's)

__all__ = ["Episode", "Interference", "StepClass", "ms4"]  # the serving part, re-exported: one place to import

SCHEMA_VERSION = 1
SNIFF_BYTES = 256  # a saved report starts with schema_version (Kineto's key is schemaVersion)


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
    # the idle account per GPU, cause, operator and call, whole window (``analysis/idle``)
    idle: list[IdleCause] = field(default_factory=list)
    # GPU annotations by name, each GPU stream's launch queue, launch delays per operator (``report.launches``)
    gpu_annotations: list[GpuAnnotation] = field(default_factory=list)
    launch_queue: list[LaunchQueue] = field(default_factory=list)
    launch_delays: list[LaunchDelay] = field(default_factory=list)
    memcpy: Memcpy | None = None  # copies by direction and host memory (``analysis/memcpy.py``); null: none
    # useful work: operators' FLOPs and roofline, MFU per GPU, stage and step (``analysis/flops``); null: no
    # operator with shapes or a flops arg
    flops: Flops | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def billed(self) -> str:
        """What the ``*_gpu_ns`` figures (idle per step, a finding's worth) count: ``"GPU"``, or ``"CPU"`` for a
        job whose lanes hold no GPU (a pipeline of CPU ranks on gloo), whose stages' time is CPU time. The JSON
        keys keep their names."""
        return billed([lane.kind for lane in self.lanes])

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return from_dict(cls, _with_short_names(data))

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


def _with_short_names(data: dict[str, Any]) -> dict[str, Any]:
    """A report's JSON with its kernels' short names: one saved before they were kept (no ``name_full``)
    names each kernel with its full name, which it keeps as ``name_full`` (``report.names``)."""
    kernels = data.get("kernels") or []
    if all("name_full" in k for k in kernels):
        return data
    short = short_names(k.get("name") for k in kernels)
    return {**data, "kernels": [k if "name_full" in k else {**k, "name": short.get(k.get("name")),
                                                             "name_full": k.get("name")} for k in kernels]}


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
