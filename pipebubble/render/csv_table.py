"""One table of the report as CSV (``--format csv --table NAME``), for pandas, spreadsheets and ``nsys stats
--format csv`` habits: a header row, then one row per item in report order.

Columns are the JSON report's keys, with each time's ``_ns`` replaced by the unit it is written in
(``--timeunit``: ``total_ms``); times are exact decimals of the report's integer nanoseconds (means to the
thousandth of a ns), fractions as they are (0.25 = 25 %); no thousands separators; unknown is an empty cell. A
mapping becomes one column per key (``idle_causes`` → ``idle_sync_stall_ms`` ...), a list one cell joined by
``;``. Lanes add their ``window`` and ``idle_fraction``.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import fields
from decimal import Decimal
from typing import Any

from pipebubble.render.cells import per
from pipebubble.report import (
    Breakdown,
    KernelStat,
    Lane,
    MemoryDevice,
    MemoryStage,
    ReplicaRow,
    Report,
    RequestRow,
    Stage,
    Wait,
    WorkerRow,
)
from pipebubble.report.flops import FlopsGpu, FlopsOp, FlopsStage, FlopsStep
from pipebubble.report.idle import CAUSES
from pipebubble.report.launches import GpuAnnotation, LaunchDelay, LaunchQueue
from pipebubble.report.memcpy import MemcpyRow

# name: (the item's dataclass, the report's items, JSON names of fields that differ, properties added)
TABLES: dict[str, tuple[type, Any, dict[str, str], tuple[str, ...]]] = {
    "kernels": (KernelStat, lambda r: r.kernels, {"kind": "class"}, ()),
    "breakdown": (Breakdown, lambda r: r.breakdown, {}, ()),
    "lanes": (Lane, lambda r: r.lanes, {}, ("window_ns", "idle_fraction")),
    "waits": (Wait, lambda r: r.waits, {}, ()),
    "stages": (Stage, lambda r: r.stages, {}, ()),
    "replicas": (ReplicaRow, lambda r: r.pipeline.replicas.rows if r.pipeline and r.pipeline.replicas else [], {}, ()),
    "workers": (WorkerRow, lambda r: r.pipeline.replicas.workers if r.pipeline and r.pipeline.replicas else [], {},
                ()),
    "memory": (MemoryDevice, lambda r: r.memory.devices if r.memory else [], {}, ()),
    "memory_stages": (MemoryStage, lambda r: r.memory.stages if r.memory else [], {}, ()),
    "requests": (RequestRow, lambda r: r.requests.rows if r.requests else [], {}, ()),
    # the job's rows (``lane`` empty), then each lane's
    "memcpy": (MemcpyRow, lambda r: [*r.memcpy.rows, *r.memcpy.lanes] if r.memcpy else [], {}, ()),
    "gpu_annotations": (GpuAnnotation, lambda r: r.gpu_annotations, {}, ()),
    "launch_queue": (LaunchQueue, lambda r: r.launch_queue, {}, ()),
    "launch_delays": (LaunchDelay, lambda r: r.launch_delays, {}, ()),
    "flops": (FlopsGpu, lambda r: r.flops.by_gpu if r.flops else [], {}, ()),
    "flops_ops": (FlopsOp, lambda r: r.flops.ops if r.flops else [], {}, ()),
    "flops_stages": (FlopsStage, lambda r: r.flops.by_stage if r.flops else [], {}, ()),
    "flops_steps": (FlopsStep, lambda r: r.flops.by_step if r.flops else [], {}, ()),
}
#: Fields a table leaves out: lists of rows of their own (a device's drawn timeline, its per-step peaks).
LEFT_OUT = {"memory": ("steps", "timeline"), "gpu_annotations": ("kernels",)}


def render(report: Report, table: str = "kernels", unit: str = "ms") -> str:
    """The CSV text of ``table`` (one of TABLES), times in ``unit``; an unknown table or unit raises ValueError."""
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}: expected one of {', '.join(TABLES)}")
    per(unit)  # an unknown unit fails before any row is written
    cls, items, renamed, extra = TABLES[table]
    rows = items(report)
    keys = [*(f.name for f in fields(cls) if f.name not in LEFT_OUT.get(table, ())), *extra]
    mapped = {key: _subkeys(rows, key) for key in keys if _is_mapping(cls, key)}
    header = [name for key in keys for name in _names(key, renamed, mapped.get(key), unit)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for item in rows:
        writer.writerow([cell for key in keys for cell in _cells(getattr(item, key), key, mapped.get(key), unit)])
    return out.getvalue()


def _is_mapping(cls: type, key: str) -> bool:
    return any(f.name == key and "dict" in str(f.type) for f in fields(cls))


def _subkeys(rows: list, key: str) -> list[str]:
    """A mapping's columns: the idle causes always (a stable header), then any other key the rows hold."""
    known = list(CAUSES) if key == "idle_causes" else []
    return [*known, *sorted({k for row in rows for k in getattr(row, key)} - set(known))]


def _names(key: str, renamed: dict[str, str], subkeys: list[str] | None, unit: str) -> list[str]:
    if subkeys is None:
        return [_unit_name(renamed.get(key, key), unit)]
    prefix = key.removesuffix("_causes")  # idle_causes -> idle_sync_stall_ns
    return [_unit_name(f"{prefix}_{sub}_ns", unit) for sub in subkeys]


def _unit_name(name: str, unit: str) -> str:
    return f"{name[:-3]}_{unit}" if name.endswith("_ns") else name


def _cells(value: Any, key: str, subkeys: list[str] | None, unit: str) -> list[str]:
    if subkeys is not None:
        return [_time(value.get(sub), unit) for sub in subkeys]
    if key.endswith("_ns") and isinstance(value, list | tuple):  # a time per stage: joined as any list
        return [";".join(_time(v, unit) for v in value)]
    return [_time(value, unit) if key.endswith("_ns") else _plain(value)]


def _plain(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ""
    if isinstance(value, list | tuple):
        return ";".join(str(v) for v in value)
    return str(value)


def _time(ns: int | float | None, unit: str) -> str:
    """``ns`` in ``unit`` as an exact decimal without exponent: 1234567 ns is ``1.234567`` ms."""
    if ns is None or (isinstance(ns, float) and not math.isfinite(ns)):
        return ""
    exact = Decimal(ns) if isinstance(ns, int) else Decimal(repr(round(ns, 3)))
    text = format((exact / per(unit)).normalize(), "f")
    return "0" if text in ("-0", "0") else text
