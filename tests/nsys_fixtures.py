"""Small Nsight Systems exports written from a list of events, in the table layouts of several releases.

``Trace`` holds plain events; ``write(trace, path, layout)`` lays them out as nsys 2022 (``EXPORT_META_DATA``,
no ``ENUM_*`` tables, relative timestamps), 2023 (NVTX text only through ``textId``) or 2026 (the current
layout, with extra columns other tools add). ``to_parquetdir`` turns any of them into the Parquet layout.
"""

from __future__ import annotations

import sqlite3
import struct
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

LAYOUTS = ("2022", "2023", "2026")
#: The shared real export (two torchrun processes on 2x H100, no rank recorded), absent on a user's clone.
REAL_EXPORT = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nsys" / "torchrun_2xh100_nccl.sqlite"
SESSION_UTC_NS = 1_700_000_000_000_000_000
CLOCK_AT_SESSION_START = 5_000_000


def union(intervals: list[tuple[int, int]]) -> tuple[int, int, int]:
    """(busy, window start, window end) by sorting and merging, independently of the project's code."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return sum(e - s for s, e in merged), merged[0][0], merged[-1][1]


def gpid(pid: int) -> int:
    """Nsight's serialized process id: the pid sits in bits 24..47 above a hardware/vm id."""
    return (1 << 48) | (pid << 24)


def gtid(pid: int, tid: int) -> int:
    return gpid(pid) | tid


@dataclass
class Gpu:
    pid: int
    device: int
    stream: int
    start: int
    end: int
    kind: str = "kernel"  # kernel | memcpy | memset | graph
    name: str = "gemm"
    correlation: int | None = None
    launch_tid: int | None = None  # when set, a cudaLaunchKernel row on this thread precedes it


@dataclass
class Nvtx:
    pid: int
    tid: int
    start: int
    end: int | None
    text: str | bytes
    event_type: int = 59
    range_id: int | None = None
    domain: int = 0
    blob: bytes | None = None  # binaryData (``nsys export --include-blobs=true``; 2026 layout only)
    json: str | None = None  # jsonText (``--include-json=true``; 2026 layout only)


@dataclass
class Mem:
    """A ``CUDA_GPU_MEMORY_USAGE_EVENTS`` row: ``op`` 0 allocation, 1 free; ``kind`` as ``ENUM_CUDA_MEM_KIND``
    numbers it (0 pageable, 1 pinned, 2 device, 3 array, 4 managed, 5 device static, ...)."""

    pid: int
    device: int
    ts: int
    bytes: int
    op: int = 0
    kind: int = 2


@dataclass
class Trace:
    gpu: list[Gpu] = field(default_factory=list)
    nvtx: list[Nvtx] = field(default_factory=list)
    syncs: list[tuple[int, int, int, int, int]] = field(
        default_factory=list
    )  # pid, start, end, correlation, type
    processes: dict[int, str] = field(default_factory=dict)
    cuda_tables: bool = True
    strings: dict[str, int] = field(default_factory=dict)
    capture: list[tuple[str, str]] = field(default_factory=list)  # META_DATA_CAPTURE rows (name, value)
    schema_entries: list[tuple] = field(default_factory=list)  # NVTX_PAYLOAD_SCHEMA_ENTRIES rows
    memory: list[Mem] = field(default_factory=list)  # CUDA_GPU_MEMORY_USAGE_EVENTS (--cuda-memory-usage=true)
    gpus: list[tuple[int, int]] = field(default_factory=list)  # TARGET_INFO_GPU rows (id, totalMemory)
    cuda_devices: list[tuple[int, int, int]] = field(default_factory=list)  # (gpuId, cudaId, pid) rows

    def sid(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings) + 1)


_DEVICE = "start INTEGER, end INTEGER, deviceId INTEGER, contextId INTEGER, streamId INTEGER, "
_DEVICE += "correlationId INTEGER, globalPid INTEGER"
_TABLES = {
    "CUPTI_ACTIVITY_KIND_KERNEL": _DEVICE + ", demangledName INTEGER, shortName INTEGER, gridX INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": _DEVICE + ", bytes INTEGER, copyKind INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": _DEVICE + ", value INTEGER, bytes INTEGER",
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": _DEVICE + ", graphId INTEGER, graphExecId INTEGER",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION": _DEVICE + ", syncType INTEGER, eventId INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER, end INTEGER, eventClass INTEGER, globalTid INTEGER, "
    "correlationId INTEGER, nameId INTEGER, returnValue INTEGER",
}
_NVTX = {
    "2022": "start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, text TEXT, globalTid INTEGER, "
    "textId INTEGER",
    "2023": "start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, globalTid INTEGER, "
    "endGlobalTid INTEGER, textId INTEGER, domainId INTEGER",
    "2026": "start INTEGER, end INTEGER, eventType INTEGER, rangeId INTEGER, category INTEGER, "
    "color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, "
    "jsonText TEXT, binaryData TEXT",
}
#: NVTX_PAYLOAD_SCHEMA_ENTRIES as Nsight Systems 2026.2 writes it (the shared real export's columns).
_SCHEMA_ENTRIES = (
    "domainId INTEGER NOT NULL, schemaId INTEGER NOT NULL, idx INTEGER NOT NULL, flags INTEGER, type INTEGER, "
    "name TEXT, description TEXT, arrayOrUnionDetail INTEGER, offset INTEGER"
)
#: NCCL's ncclCommInitRank payload schema as the shared real export lists it: communicator id (uint64), then
#: "No. of ranks", "Rank" and "CUDA device" (NVTX_PAYLOAD_ENTRY_TYPE_INT, 4 bytes each), in NCCL's NVTX domain.
NCCL_DOMAIN, COMM_INIT_SCHEMA = 1, 16777218
COMM_INIT_ENTRIES = [
    (NCCL_DOMAIN, COMM_INIT_SCHEMA, 0, None, 18, "NCCL communicator ID", None, None, None),
    (NCCL_DOMAIN, COMM_INIT_SCHEMA, 1, None, 5, "No. of ranks", None, None, 8),
    (NCCL_DOMAIN, COMM_INIT_SCHEMA, 2, None, 5, "Rank", None, None, 12),
    (NCCL_DOMAIN, COMM_INIT_SCHEMA, 3, None, 5, "CUDA device", None, None, 16),
]


def comm_init_blob(comm: int, nranks: int, rank: int, device: int, schema: int = COMM_INIT_SCHEMA) -> bytes:
    """A ``binaryData`` payload of ncclCommInitRank: the 32-byte header (domain, schema id, payload size,
    payload offset) and NCCL's ``NcclNvtxParamsCommInitRank`` struct (padded to 24 bytes)."""
    payload = struct.pack("<Qiii4x", comm, nranks, rank, device)
    return struct.pack("<QQQQ", NCCL_DOMAIN, schema, len(payload), 32) + payload


def env(launch: int, **variables: object) -> list[tuple[str, str]]:
    """``META_DATA_CAPTURE`` rows of launch ``launch``'s environment, values quoted as nsys writes them."""
    return [(f"PROCESS_{launch}:ENVIRONMENT_VARIABLE", f'{k}="{v}"') for k, v in variables.items()]


def write(trace: Trace, path: Path, layout: str = "2026") -> Path:
    """Write ``trace`` as an Nsight Systems SQLite export in ``layout``."""
    offset = 0 if layout == "2022" else CLOCK_AT_SESSION_START  # 2022 timestamps count from session start
    conn = sqlite3.connect(path)
    with conn:
        _write_meta(conn, layout)
        if trace.cuda_tables:
            _write_cuda(conn, trace, layout, offset)
        if trace.nvtx:
            _write_nvtx(conn, trace, layout, offset)
        conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
        conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in trace.strings.items()])
        conn.execute("CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT)")
        conn.executemany(
            "INSERT INTO PROCESSES VALUES (?, ?, ?)", [(gpid(p), p, n) for p, n in trace.processes.items()]
        )
        _write_ranks(conn, trace)
        _write_memory(conn, trace, layout, offset)
    conn.close()
    return path


def _write_ranks(conn: sqlite3.Connection, trace: Trace) -> None:
    if trace.capture:
        conn.execute("CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)")
        conn.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", trace.capture)
    if trace.schema_entries:
        conn.execute(f"CREATE TABLE NVTX_PAYLOAD_SCHEMA_ENTRIES ({_SCHEMA_ENTRIES})")
        conn.executemany(
            f"INSERT INTO NVTX_PAYLOAD_SCHEMA_ENTRIES VALUES ({', '.join('?' * 9)})", trace.schema_entries
        )


#: CUDA_GPU_MEMORY_USAGE_EVENTS with the columns public exports show (those this reader reads, and some others).
_MEMORY = (
    "start INTEGER NOT NULL, globalPid INTEGER, deviceId INTEGER, contextId INTEGER, address INTEGER, pc INTEGER, "
    "bytes INTEGER, memKind INTEGER, memoryOperationType INTEGER, name TEXT, correlationId INTEGER, streamId INTEGER"
)
MEM_KIND_NAMES = ["PAGEABLE", "PINNED", "DEVICE", "ARRAY", "MANAGED", "DEVICE_STATIC", "MANAGED_STATIC", "UNKNOWN"]


def _write_memory(conn: sqlite3.Connection, trace: Trace, layout: str, offset: int) -> None:
    """The allocator events, TARGET_INFO_GPU and TARGET_INFO_CUDA_DEVICE; the enum tables in the 2026 layout."""
    if trace.memory:
        conn.execute(f"CREATE TABLE CUDA_GPU_MEMORY_USAGE_EVENTS ({_MEMORY})")
        rows = [(m.ts + offset, gpid(m.pid), m.device, 1, 0x7F0000 + n, 0, m.bytes, m.kind, m.op, None, n, 7)
                for n, m in enumerate(trace.memory)]  # fmt: skip
        conn.executemany(f"INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS VALUES ({', '.join('?' * 12)})", rows)
    if trace.memory and layout == "2026":
        kinds = [(i, f"CUDA_MEMOPR_MEMORY_KIND_{k}", k.title()) for i, k in enumerate(MEM_KIND_NAMES)]
        opers = [(0, "CUDA_DEV_MEM_EVENT_OPR_ALLOCATION", "Allocation"),
                 (1, "CUDA_DEV_MEM_EVENT_OPR_DEALLOCATION", "Deallocation")]  # fmt: skip
        for table, rows in (("ENUM_CUDA_MEM_KIND", kinds), ("ENUM_CUDA_DEV_MEM_EVENT_OPER", opers)):
            conn.execute(f"CREATE TABLE {table} (id INTEGER NOT NULL PRIMARY KEY, name TEXT, label TEXT)")
            conn.executemany(f"INSERT INTO {table} VALUES (?, ?, ?)", rows)
    if trace.gpus:
        conn.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT, busLocation TEXT, "
                     "totalMemory INTEGER, smCount INTEGER, chipName TEXT)")  # fmt: skip
        rows = [(i, "NVIDIA H100 80GB HBM3", f"0000:{i:02x}:00.0", total, 132, "GH100") for i, total in trace.gpus]
        conn.executemany("INSERT INTO TARGET_INFO_GPU VALUES (?, ?, ?, ?, ?, ?)", rows)
    if trace.cuda_devices:
        conn.execute("CREATE TABLE TARGET_INFO_CUDA_DEVICE (gpuId INTEGER, cudaId INTEGER, pid INTEGER, uuid TEXT, "
                     "numMultiprocessors INTEGER)")  # fmt: skip
        conn.executemany("INSERT INTO TARGET_INFO_CUDA_DEVICE VALUES (?, ?, ?, NULL, 132)", trace.cuda_devices)


def _write_meta(conn: sqlite3.Connection, layout: str) -> None:
    meta = "EXPORT_META_DATA" if layout == "2022" else "META_DATA_EXPORT"
    conn.execute(f"CREATE TABLE {meta} (name TEXT, value TEXT)")
    conn.execute(f"INSERT INTO {meta} VALUES ('EXPORT_PRODUCT_VERSION', ?)", (f"{layout}.1.0",))
    if layout == "2022":
        conn.execute(
            "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT)"
        )
        conn.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", (SESSION_UTC_NS,))
        conn.execute("CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER, duration INTEGER, startTime INTEGER)")
        conn.execute("INSERT INTO ANALYSIS_DETAILS VALUES (0, 0, 0)")
        return
    conn.execute("CREATE TABLE ENUM_CUPTI_SYNC_TYPE (id INTEGER, name TEXT, label TEXT)")
    conn.execute(
        "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT, "
        "systemClockNs INTEGER)"
    )
    conn.execute(
        "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '', ?)",
        (SESSION_UTC_NS, CLOCK_AT_SESSION_START),
    )


def _write_cuda(conn: sqlite3.Connection, trace: Trace, layout: str, offset: int) -> None:
    for table, cols in _TABLES.items():
        extra = ", greenContextId INTEGER" if layout == "2026" and "RUNTIME" not in table else ""
        conn.execute(f"CREATE TABLE {table} ({cols}{extra})")
    table_of = {
        "kernel": "KERNEL",
        "memcpy": "MEMCPY",
        "memset": "MEMSET",
        "graph": "GRAPH_TRACE",
    }
    for g in trace.gpu:
        head = (g.start + offset, g.end + offset, g.device, 1, g.stream, g.correlation, gpid(g.pid))
        tail = {
            "kernel": (trace.sid(g.name), trace.sid(g.name.split("<")[0]), 1),
            "memcpy": (1024, 1),
            "memset": (0, 1024),
            "graph": (7, 70),
        }[g.kind]
        cols = len(head) + len(tail)
        conn.execute(
            f"INSERT INTO CUPTI_ACTIVITY_KIND_{table_of[g.kind]} VALUES ({', '.join('?' * cols)}"
            + (", NULL)" if layout == "2026" else ")"),
            head + tail,
        )
        if g.launch_tid is not None:
            row = (g.start + offset - 50, g.start + offset - 40, 0, gtid(g.pid, g.launch_tid), g.correlation)
            conn.execute(
                "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?, ?, 0)",
                (*row, trace.sid("cudaLaunchKernel_v7000")),
            )
    for pid, start, end, corr, sync_type in trace.syncs:
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_SYNCHRONIZATION VALUES (?, ?, 0, 1, 7, ?, ?, ?, 0"
            + (", NULL)" if layout == "2026" else ")"),
            (start + offset, end + offset, corr, gpid(pid), sync_type),
        )


def _write_nvtx(conn: sqlite3.Connection, trace: Trace, layout: str, offset: int) -> None:
    conn.execute(f"CREATE TABLE NVTX_EVENTS ({_NVTX[layout]})")
    for n in trace.nvtx:
        end = None if n.end is None else n.end + offset
        head = (n.start + offset, end, n.event_type, n.range_id)
        text_id = trace.sid(n.text) if isinstance(n.text, str) else None
        if layout == "2022":
            conn.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, CAST(? AS TEXT), ?, NULL)",
                (*head, n.text, gtid(n.pid, n.tid)),
            )
        elif layout == "2023":
            conn.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, NULL, ?, 0)",
                (*head, gtid(n.pid, n.tid), text_id),
            )
        else:
            conn.execute(
                "INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, 0, 0, CAST(? AS TEXT), ?, NULL, NULL, ?, ?, ?)",
                (*head, n.text, gtid(n.pid, n.tid), n.domain, n.json, n.blob),
            )


def to_parquetdir(sqlite_path: Path, folder: Path) -> Path:
    """The ``nsys export --type parquetdir`` layout of an export: one ``TABLE.parquet`` per table."""
    folder.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(sqlite_path)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
        schema = {
            c[1]: (pl.String if c[2] == "TEXT" else pl.Float64 if c[2] == "REAL" else pl.Int64) for c in info
        }
        if "binaryData" in schema:  # declared TEXT, holds BLOBs
            schema["binaryData"] = pl.Binary
        rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
        pl.DataFrame(rows, schema=schema, orient="row").write_parquet(folder / f"{table}.parquet")
    conn.close()
    return folder


# --- processes that carry their ranks ---

RANKED = {100: 1, 200: 0}  #: pid -> rank of ``ranked_pair``: the pid order is not the rank order


def ranked_pair(by: str, ranks: dict[int, int] = RANKED, world: int = 2) -> Trace:
    """Two processes, each launching a kernel on its own GPU from thread ``pid + 1`` inside an NVTX range, that
    carry their ``ranks`` ``by`` ``"env"`` (each an attached process with ``RANK``/``WORLD_SIZE``), ``"blob"``
    (NCCL's ncclCommInitRank payload, ``--include-blobs``), ``"json"`` (the same as ``--include-json``) or
    ``"none"``."""
    trace = Trace(processes={pid: "python3" for pid in ranks})
    for n, (pid, rank) in enumerate(sorted(ranks.items())):
        tid, device = pid + 1, n
        trace.gpu.append(Gpu(pid, device, 7, 10_000, 20_000, correlation=1, launch_tid=tid))
        trace.nvtx.append(Nvtx(pid, tid, 9_000, 21_000, "step 0"))
        if by == "env":
            trace.capture += [(f"PROCESS_{n}:PID", str(pid)), *env(n, RANK=rank, LOCAL_RANK=0, WORLD_SIZE=world)]
        elif by in ("blob", "json"):
            trace.nvtx.append(comm_init(pid, tid, 1_000, world, rank, device, by))
    if by in ("blob", "json"):
        trace.schema_entries = list(COMM_INIT_ENTRIES)
    return trace


def comm_init(pid: int, tid: int, start: int, nranks: int, rank: int, device: int, by: str = "blob") -> Nvtx:
    """An ncclCommInitRank range in NCCL's domain whose payload names ``rank`` of ``nranks``."""
    comm = 0xC0FFEE + nranks
    if by == "blob":
        return Nvtx(pid, tid, start, start + 500, "ncclCommInitRank", domain=NCCL_DOMAIN,
                    blob=comm_init_blob(comm, nranks, rank, device))
    text = f'{{"NCCL communicator ID": {comm}, "No. of ranks": {nranks}, "Rank": {rank}, "CUDA device": {device}}}'
    return Nvtx(pid, tid, start, start + 500, "ncclCommInitRank", domain=NCCL_DOMAIN, json=text)
