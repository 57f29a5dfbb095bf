"""The report's tables as polars DataFrames (and pandas, when it is installed), one registry of them.

A table's rows are the JSON report's (``Report.to_dict()``: the same keys, ``kernels`` with ``class``), one row
per item in report order; its columns are typed from the row's dataclass, so an all-unknown column is still
Int64 (null), not of polars' Null type, and an empty table still has its columns. Times are int64 ns, as in
the JSON; lists and mappings are polars lists and structs.
"""

from __future__ import annotations

import types
from dataclasses import fields, is_dataclass
from functools import cache
from typing import TYPE_CHECKING, Any, NamedTuple, Union, get_args, get_origin, get_type_hints

from pipebubble.errors import PipebubbleError
from pipebubble.report import (
    Breakdown,
    KernelStat,
    Lane,
    MemoryDevice,
    MemoryStage,
    ReplicaRow,
    RequestRow,
    Stage,
    Wait,
    WorkerRow,
)
from pipebubble.report.findings import Finding

if TYPE_CHECKING:
    import pandas as pd
    import polars as pl


class Table(NamedTuple):
    """A table: the dataclass of its rows, where the rows lie in the JSON report (dotted keys), what a row
    is, and the JSON names of the fields that are named otherwise there."""

    row: type
    at: str
    doc: str
    renamed: dict[str, str] = {}


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
}


def frame(report: dict[str, Any], name: str) -> pl.DataFrame:
    """Table ``name`` of a JSON report as a DataFrame; an unknown name is a PipebubbleError naming the known."""
    import polars as pl

    schema = _schema(name)
    found = rows(report, name)
    if not found:
        return pl.DataFrame(schema={column: dtype or pl.Null for column, dtype in schema.items()})
    known = {column: dtype for column, dtype in schema.items() if dtype is not None}
    return pl.DataFrame(found, schema_overrides=known, infer_schema_length=None)


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
    """The rows of table ``name`` in a JSON report; a section it lacks (no memory, no findings) has none."""
    found: Any = report
    for key in TABLES[name].at.split("."):
        found = (found or {}).get(key)
    return found or []


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
