"""Nsight Systems allocator events (``nsys profile --cuda-memory-usage=true``) into the allocator-event table.

``CUDA_GPU_MEMORY_USAGE_EVENTS`` has one row per allocation or free CUDA made: ``start`` (ns, on the clock of
the export's activity tables), ``globalPid`` (packed as there), ``deviceId`` (the CUDA device as the process
numbers it, like the kernels' ``deviceId``), ``bytes``, ``memKind`` (``ENUM_CUDA_MEM_KIND``) and
``memoryOperationType`` (``ENUM_CUDA_DEV_MEM_EVENT_OPER``: allocation or deallocation). They are the CUDA
driver's allocations: under PyTorch's caching allocator, the segments it reserves, not the tensors it hands
out. The export states no totals, so each lane's ``allocated`` is the running sum since the trace began
(``baseline`` = ``trace``).

Only device memory (kinds Device, Array, Device Static) goes on a GPU lane. Host memory (Pageable, Pinned) is
not the GPU's, and managed memory migrates between host and device, so where it lives is unknown: those rows
are counted in ``skipped`` (``memory_host``, ``memory_managed``), as are kinds the export does not name.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import polars as pl

from pipebubble import allocations
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.nsys.ranks import INT32_MAX, with_ranks
from pipebubble.ingest.nsys.spans import pid_of
from pipebubble.ingest.nsys.tables import Tables
from pipebubble.spans import TIME_LIMIT_NS

I64 = pl.Int64
TABLE = "CUDA_GPU_MEMORY_USAGE_EVENTS"
COLUMNS = {c: I64 for c in ("start", "globalPid", "deviceId", "bytes", "memKind", "memoryOperationType")}
#: One event's bytes at most: 256 TiB, beyond any device's memory (a bigger value is a damaged cell).
BYTES_LIMIT = 1 << 48

KIND_PREFIX, OPERATION_PREFIX = "CUDA_MEMOPR_MEMORY_KIND_", "CUDA_DEV_MEM_EVENT_OPR_"
#: ENUM_CUDA_MEM_KIND and ENUM_CUDA_DEV_MEM_EVENT_OPER as Nsight Systems numbers them (not CUPTI's
#: CUpti_ActivityMemoryKind order), less their prefix: for exports that lack those tables.
MEM_KINDS = {0: "PAGEABLE", 1: "PINNED", 2: "DEVICE", 3: "ARRAY", 4: "MANAGED", 5: "DEVICE_STATIC",
             6: "MANAGED_STATIC", 7: "UNKNOWN"}  # fmt: skip
OPERATIONS = {0: "ALLOCATION", 1: "DEALLOCATION"}
SIGNS = {"ALLOCATION": 1, "DEALLOCATION": -1}
#: Why a row of each memory kind is not kept (None: it is device memory, kept); other kinds are unknown.
KIND_REASONS = {"DEVICE": None, "ARRAY": None, "DEVICE_STATIC": None, "PAGEABLE": "memory_host",
                "PINNED": "memory_host", "MANAGED": "memory_managed", "MANAGED_STATIC": "memory_managed"}  # fmt: skip
UNKNOWN_KIND = "memory_unknown_kind"


def read_memory(tables: Tables, result: FileResult, ranks: dict[int, int]) -> None:
    """Read the export's allocator events into ``result.memory`` (None when it has none), counting every row
    read in ``events_read`` and every row not kept in ``skipped``."""
    events = tables.load(TABLE, COLUMNS)
    result.events_read += events.height
    if events.is_empty():
        return
    memory = allocator_events(events, _kinds(tables), _signs(tables), ranks, result.source, result.skipped)
    if _sums_fit(memory):
        result.memory = memory
    else:
        result.skipped["out_of_range"] += memory.height
        result.memory = allocations.empty()
        result.warnings.append(f"{TABLE} ignored: its bytes add up beyond 2**62")


def _kinds(tables: Tables) -> dict[int, str] | None:
    """Memory kind id -> name; None when the table has no ``memKind`` column (its rows are all device memory)."""
    if "memKind" not in tables.columns(TABLE):
        return None
    return _enum(tables, "ENUM_CUDA_MEM_KIND", KIND_PREFIX, MEM_KINDS)


def _signs(tables: Tables) -> dict[int, int | None]:
    """Operation id -> +1 (allocation) or -1 (deallocation); None for an operation that is neither."""
    names = _enum(tables, "ENUM_CUDA_DEV_MEM_EVENT_OPER", OPERATION_PREFIX, OPERATIONS)
    return {i: SIGNS.get(name) for i, name in names.items()}


def _enum(tables: Tables, table: str, prefix: str, default: dict[int, str]) -> dict[int, str]:
    """An export's enum table as id -> name less ``prefix``; ``default`` when the export lacks it."""
    rows = tables.load(table, {"id": I64, "name": pl.String}).drop_nulls()
    return {i: name.removeprefix(prefix) for i, name in rows.iter_rows()} or default


def allocator_events(
    events: pl.DataFrame,
    kinds: dict[int, str] | None,
    signs: dict[int, int | None],
    ranks: dict[int, int],
    source: str,
    skipped: Counter[str],
) -> pl.DataFrame:
    """``CUDA_GPU_MEMORY_USAGE_EVENTS`` rows as allocator events on their GPU's lane, named as the spans name
    it (``rank0/gpu1``, or ``pid123/gpu1`` for a process without a rank), with running totals. ``kinds`` maps
    memory kind ids to names (None: the export has no ``memKind`` column, every row is device memory),
    ``signs`` operation ids to +1 / -1; rows not kept are counted in ``skipped`` by reason."""
    sign = pl.col("memoryOperationType").replace_strict(signs, default=None, return_dtype=I64)
    events = events.with_columns(sign=sign, reason=_reason(sign, kinds))
    for reason, n in events.group_by("reason").len().drop_nulls().iter_rows():
        skipped[reason] += n
    kept = events.filter(pl.col("reason").is_null()).select(
        source=pl.lit(source),
        pid=pid_of("globalPid"),
        device_type=pl.lit("cuda"),
        device="deviceId",
        ts="start",
        bytes=pl.col("bytes") * pl.col("sign"),
    )
    frame = allocations.conform(kept.with_columns(lane=allocations.lane(pl.format("pid{}", "pid"))))
    return allocations.with_running_totals(with_ranks(frame, ranks))


def _reason(sign: pl.Expr, kinds: dict[int, str] | None) -> pl.Expr:
    """Why a row is not kept, null for a kept one: a missing or unknown value (``memory_bad_row``), a value
    out of range (``out_of_range``), or memory that is not a GPU's (``KIND_REASONS``)."""
    bad = pl.any_horizontal(pl.col(c).is_null() for c in ("start", "globalPid", "deviceId", "bytes"))
    bad = bad | sign.is_null() | (pl.col("bytes") < 0)
    out_of_range = (
        ~pl.col("start").is_between(-TIME_LIMIT_NS, TIME_LIMIT_NS, closed="none")
        | ~pl.col("deviceId").is_between(0, INT32_MAX)
        | (pl.col("bytes") > BYTES_LIMIT)
    )
    if kinds is None:
        kind = pl.lit(None, pl.String)
    else:
        bad = bad | pl.col("memKind").is_null()
        reasons = {i: KIND_REASONS.get(name, UNKNOWN_KIND) for i, name in kinds.items()}
        kind = pl.col("memKind").replace_strict(reasons, default=UNKNOWN_KIND, return_dtype=pl.String)
    return pl.when(bad).then(pl.lit("memory_bad_row")).when(out_of_range).then(pl.lit("out_of_range")).otherwise(kind)


def _sums_fit(memory: pl.DataFrame) -> bool:
    """Whether every running total stays within +-2**62 (so none can overflow int64): the bytes moved, added
    up as floats, stay below it."""
    return memory.is_empty() or memory["bytes"].abs().cast(pl.Float64).sum() < TIME_LIMIT_NS


def gpu_capacity(tables: Tables, warnings: list[str]) -> dict[str, Any]:
    """``{"gpu_memory_bytes": {device: bytes}}``: each GPU's total memory (``TARGET_INFO_GPU.totalMemory``) by
    the CUDA device number the events use (``TARGET_INFO_CUDA_DEVICE`` maps a process's ``cudaId`` to the
    GPU's ``id``; without it the GPU's ``id`` is that number). Empty when the export states none; a device
    number that names GPUs of different sizes (processes numbering them differently) is left out, with a
    warning."""
    gpus = tables.load("TARGET_INFO_GPU", {"id": I64, "totalMemory": I64, "name": pl.String})
    if gpus.is_empty():
        return {}
    mapping = tables.load("TARGET_INFO_CUDA_DEVICE", {"gpuId": I64, "cudaId": I64})
    if not mapping.is_empty():
        gpus = mapping.join(gpus, left_on="gpuId", right_on="id").select(
            id="cudaId", totalMemory="totalMemory", name="name")
    names = {d: n[0] for d, n in gpus.filter(pl.col("id").is_between(0, INT32_MAX) & pl.col("name").is_not_null())
             .group_by("id").agg(pl.col("name").unique()).iter_rows() if len(n) == 1}
    sizes = (
        gpus.filter(pl.col("id").is_between(0, INT32_MAX) & (pl.col("totalMemory") > 0))  # 0: unknown
        .group_by("id")
        .agg(pl.col("totalMemory").unique())
        .sort("id")
    )
    capacity = {d: s[0] for d, s in sizes.iter_rows() if len(s) == 1}
    if mixed := [d for d, s in sizes.iter_rows() if len(s) > 1]:
        warnings.append(f"CUDA devices {mixed} name GPUs of different memory sizes: their capacity left unknown")
    return ({"gpu_memory_bytes": capacity} if capacity else {}) | ({"gpu_names": names} if names else {})
