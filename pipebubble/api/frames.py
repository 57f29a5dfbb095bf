"""The report's tables as polars DataFrames (and pandas, when it is installed), one registry of them.

A table's rows are the JSON report's (``Report.to_dict()``: the same keys, ``kernels`` with ``class``), one row
per item in report order; its columns are typed from the row's dataclass, so an all-unknown column is still
Int64 (null), not of polars' Null type, and an empty table still has its columns. Times are int64 ns, as in
the JSON, unless ``timed`` puts them in another unit (``start_ms``: a float) or from the job's start (the
origin the text's "at" columns count from); lists stay polars lists, and mappings and nested rows are
flattened into columns (``idle_causes`` → ``idle_sync_stall_ns`` ..., ``where`` → ``where_ranks`` ...), but a
finding's free-form ``evidence``, which differs by kind, stays a struct.
"""

from __future__ import annotations

import types
from dataclasses import fields, is_dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, Union, get_args, get_origin, get_type_hints

from pipebubble.errors import PipebubbleError
from pipebubble.report import (
    Breakdown,
    CollectiveCall,
    CollectiveRank,
    IdleCause,
    KernelStat,
    Lane,
    MemoryDevice,
    MemoryStage,
    PathSegment,
    Recommendation,
    ReplicaRow,
    RequestRow,
    Segment,
    Stage,
    StepResult,
    Wait,
    WorkerRow,
)
from pipebubble.report.breakdown import CallStat
from pipebubble.report.findings import Finding
from pipebubble.report.flops import FlopsGpu, FlopsOp, FlopsStage, FlopsStep
from pipebubble.report.launches import GpuAnnotation, LaunchDelay, LaunchQueue
from pipebubble.report.memcpy import MemcpyRow

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl


class Table(NamedTuple):
    """A table: the dataclass of its rows, where the rows lie in the JSON report (dotted keys), what a row
    is, and the JSON names of the fields that are named otherwise there."""

    row: type
    at: str  # dotted keys; ``key[]`` steps into each item of a list
    doc: str
    renamed: dict[str, str] = {}
    parent: tuple[str, ...] = ()  # keys of the list item above (``at``'s ``key[]``) each row carries


#: Every table by name (``Report.lanes`` ...): adding one (``requests``, say) is one line here.
TABLES: dict[str, Table] = {
    "lanes": Table(Lane, "lanes", "One row per GPU, GPU stream and CPU thread: busy and idle time"),
    "stages": Table(Stage, "stages", "One row per pipeline stage: busy, fill, drain, utilization"),
    "replicas": Table(ReplicaRow, "pipeline.replicas.rows", "One row per data-parallel replica of a DP × PP "
                      "job: its step, bubble, replayed step and each stage's compute"),
    "workers": Table(WorkerRow, "pipeline.replicas.workers", "One row per worker (stage, replica) of a DP × PP job: "
                     "compute against its peers' median and what its fix gives back"),
    "waits": Table(Wait, "waits", "The waits: idle gaps on a stage or lane, with cause and peer"),
    "breakdown": Table(Breakdown, "breakdown", "Each GPU's time (whole window, then per step) as compute, "
                       "exposed comm, exposed memory and idle by cause"),
    "kernels": Table(KernelStat, "kernels", "One row per GPU operation name: count, total, mean, median",
                     {"kind": "class"}),
    "findings": Table(Finding, "findings", "The diagnosis, biggest worth first"),
    "memory": Table(MemoryDevice, "memory.devices", "One row per device: allocator peak, capacity"),
    "memory_stages": Table(MemoryStage, "memory.stages", "One row per pipeline stage: peak, static, per "
                           "micro-batch bytes"),
    "requests": Table(RequestRow, "requests.rows", "One row per served request: queue, TTFT, TPOT, e2e, tokens"),
    "steps": Table(StepResult, "pipeline.steps", "One row per pipeline step: its window and bubble"),
    "recommendations": Table(Recommendation, "pipeline.recommendations", "The what-if rows: each change replayed, "
                             "its step, bubble, speed-up and memory"),
    "timeline": Table(Segment, "timeline", "The stages' timeline: each pass and communication stretch"),
    "collective_ranks": Table(CollectiveRank, "collectives.ranks", "One row per rank at the collectives: calls, "
                              "wait, late"),
    "collective_calls": Table(CollectiveCall, "collectives.worst", "The collective calls with the most waiting: "
                              "skew, the last to arrive"),
    "critical_path": Table(PathSegment, "critical_path[].segments", "The critical path of each step analysed: "
                           "one row per segment, with its step", parent=("step",)),
    "idle": Table(IdleCause, "idle", "GPU idle by cause (the idle account): per lane, cause, operator and call"),
    "host_api": Table(CallStat, "host.api", "Host API calls by name: count, total, mean, max"),
    "host_ranges": Table(CallStat, "host.ranges", "Annotation (NVTX) ranges by name: count, total, mean, max"),
    "host_ops": Table(CallStat, "host.ops", "CPU operators by name over every rank: count, total (inclusive of "
                      "the operators they call), mean, max"),
    "gpu_annotations": Table(GpuAnnotation, "gpu_annotations", "One row per GPU annotation name: ranges, their "
                             "union, the GPU operations within and the top kernels (a list)"),
    "launch_queue": Table(LaunchQueue, "launch_queue", "One row per GPU stream: its launch queue's max, mean, "
                          "p50, p95, time at max, empty and full (``queue_series``: the queue as it changes)"),
    "launch_delays": Table(LaunchDelay, "launch_delays", "One row per launching operator: launch delays' "
                           "count, total, mean, median, max, its kernels' mean, the share over its kernel"),
    "memcpy": Table(MemcpyRow, "memcpy.rows", "Memory copies by direction and host memory: count, bytes, busy, GB/s"),
    "memcpy_lanes": Table(MemcpyRow, "memcpy.lanes", "The same per device lane"),
    "flops": Table(FlopsGpu, "flops.by_gpu", "One row per GPU (a CPU job: thread): model FLOPs, achieved FLOP/s, "
                   "peak and MFU"),
    "flops_ops": Table(FlopsOp, "flops.ops", "One row per operator, input shapes and dtype: count, FLOPs, bytes, "
                       "GPU time, FLOP/s, intensity, roofline bound and share of peak"),
    "flops_stages": Table(FlopsStage, "flops.by_stage", "One row per pipeline stage (and replica): FLOPs, "
                          "achieved FLOP/s, MFU"),
    "flops_steps": Table(FlopsStep, "flops.by_step", "One row per step: FLOPs, GPU windows, MFU"),
}
#: Times that are instants on the trace's clock (the rest are durations): ``relative`` counts them from the
#: job's start.
INSTANTS = ("start_ns", "end_ns", "window_start_ns", "window_end_ns", "peak_at_ns", "at_ns")
#: Nested rows and mappings flattened into columns: column -> (prefix, suffix) of each key's column.
FLATTENED = {"idle_causes": ("idle_", "_ns")}
KEPT_STRUCTS = ("evidence",)  # free-form per row: left a struct
UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}


def frame(report: dict[str, Any], name: str) -> pl.DataFrame:
    """Table ``name`` of a JSON report as a DataFrame, times in int64 ns as in the JSON, nested rows and
    mappings flattened; an unknown name is a PipebubbleError naming the known."""
    import polars as pl

    schema = {**dict.fromkeys(TABLES[check_name(name)].parent, pl.Int64), **_schema(name)}
    found = rows(report, name)
    if not found:
        return pl.DataFrame(schema={column: dtype or pl.Null for column, dtype in schema.items()})
    known = {column: dtype for column, dtype in schema.items() if dtype is not None}
    return _flattened(pl.DataFrame(found, schema_overrides=known, infer_schema_length=None))


def _flattened(table: pl.DataFrame) -> pl.DataFrame:
    """Struct columns as one column per field (``FLATTENED``'s names, else ``column_field``), but
    ``KEPT_STRUCTS``."""
    import polars as pl

    for column, dtype in table.schema.items():
        if not isinstance(dtype, pl.Struct) or column in KEPT_STRUCTS:
            continue
        prefix, suffix = FLATTENED.get(column, (f"{column}_", ""))
        parts = table[column].struct.unnest()
        parts = parts.rename({f: f"{prefix}{f}{suffix}" for f in parts.columns})
        at = table.columns.index(column)
        table = pl.concat([table.select(table.columns[:at]), parts, table.select(table.columns[at + 1:])],
                          how="horizontal")
    return table


def timed(table: pl.DataFrame, unit: str = "ns", origin_ns: int | None = None) -> pl.DataFrame:
    """``table`` with its times (``*_ns`` columns) in ``unit`` (``UNITS``: ``start_ms`` ..., floats but in ns),
    and, given ``origin_ns``, its instants (``INSTANTS``) counted from it."""
    import polars as pl

    scale = ns_per(unit)
    times = [c for c, t in table.schema.items() if c.endswith("_ns") and t.is_numeric()]
    moved = [pl.col(c) - origin_ns for c in times if origin_ns is not None and c in INSTANTS]
    table = table.with_columns(moved) if moved else table
    if unit == "ns":
        return table
    return table.with_columns(
        (pl.col(c) / scale).alias(c.removesuffix("_ns") + f"_{unit}") for c in times
    ).select(c.removesuffix("_ns") + f"_{unit}" if c in times else c for c in table.columns)


def timed_spans(table: pl.DataFrame, unit: str = "ns", origin_ns: int | None = None) -> pl.DataFrame:
    """The span table with ``start`` and ``end`` from ``origin_ns`` (when given) and in ``unit`` (as
    ``timed`` puts a table's times; the span table's columns keep their names)."""
    import polars as pl

    scale = ns_per(unit)
    if origin_ns is not None:
        table = table.with_columns(pl.col("start") - origin_ns, pl.col("end") - origin_ns)
    return table if unit == "ns" else table.with_columns(pl.col("start", "end") / scale)


def ns_per(unit: str) -> int:
    """Nanoseconds in one ``unit`` (``UNITS``); a PipebubbleError naming the units for any other."""
    if unit not in UNITS:
        raise PipebubbleError(f"unit={unit!r}: expected one of {', '.join(UNITS)}")
    return UNITS[unit]


def to_pandas(table: pl.DataFrame) -> pd.DataFrame:
    """``table`` as a pandas DataFrame with pandas' nullable types (unknown is ``pd.NA``); lists and structs
    become Python lists and dicts. A PipebubbleError when pandas is not installed."""
    try:
        import pandas as pd
    except ModuleNotFoundError:
        raise PipebubbleError("to_pandas needs pandas, which is not installed: pip install pandas") from None
    import polars as pl

    nullable = {pl.Int64: "Int64", pl.Float64: "Float64", pl.String: "string", pl.Boolean: "boolean"}
    return pd.DataFrame({column: pd.Series(table[column].to_list(), dtype=nullable.get(dtype, object))
                         for column, dtype in table.schema.items()})


def check_name(name: str) -> str:
    if name not in TABLES:
        raise PipebubbleError(f"unknown table {name!r}: expected one of {', '.join(TABLES)}")
    return name


def rows(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The rows of table ``name`` in a JSON report; a section it lacks (no memory, no findings) has none. Where
    ``at`` steps into a list (``critical_path[].segments``), the rows of every item, each with the item's
    ``parent`` keys."""
    table = TABLES[name]
    head, _, rest = table.at.partition("[].")
    found: Any = report
    for key in head.split("."):
        found = (found or {}).get(key)
    if not rest:
        return found or []
    out = []
    for item in found or []:
        inner: Any = item
        for key in rest.split("."):
            inner = (inner or {}).get(key)
        out += [{**{k: item.get(k) for k in table.parent}, **row} for row in inner or []]
    return out


@cache
def _schema(name: str) -> dict[str, Any]:
    """Each column (JSON name, field order) and its polars type, None where polars should read it from the
    values (mappings, nested rows)."""
    table = TABLES[check_name(name)]
    hints = get_type_hints(table.row)
    return {table.renamed.get(f.name, f.name): _dtype(hints[f.name]) for f in fields(table.row)}


def _dtype(hint: Any) -> Any:
    """The polars type of a field's type: ``int | None`` is Int64, ``list[str]`` a list of String."""
    import polars as pl

    args = [a for a in get_args(hint) if a is not type(None)]
    if get_origin(hint) in (Union, types.UnionType):
        return _dtype(args[0]) if len(args) == 1 else None
    if get_origin(hint) is list:
        inner = _dtype(args[0])
        return None if inner is None else pl.List(inner)
    if is_dataclass(hint):  # a nested row (a device's steps, a finding's where): a struct of its fields
        inner = {f.name: _dtype(t) for f, t in zip(fields(hint), get_type_hints(hint).values(), strict=True)}
        return None if None in inner.values() else pl.Struct(inner)
    return {int: pl.Int64, float: pl.Float64, str: pl.String, bool: pl.Boolean}.get(hint)
