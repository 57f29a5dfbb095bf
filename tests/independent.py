"""A from-scratch GPU time breakdown and kernel summary, to check pipebubble's against.

Reads the raw files with json/gzip/sqlite3/decimal only and computes every figure with plain Python:
sorted intervals merged in one sweep, lengths summed. Nothing here shares code with pipebubble but the
communication regex (``spans.COMM_KERNELS``), which is the definition being applied, not a computation.

Definitions (per GPU lane, over a window W):
  compute = |U compute|, comm = |U comm|, comm_exposed = |U(comm + compute)| - compute,
  memory = |U memory|, memory_exposed = |U all| - |U(compute + comm)|, idle = |W| - |U all|,
so compute + comm_exposed + memory_exposed + idle = |W|. The whole-window row spans the lane's first to
last GPU-work instant; a step row spans one ``ProfilerStep#N`` of the lane's rank as the GPU lives it (its CPU
range extended to the end of the GPU work launched inside it, begun no earlier than the step before ended),
with the work clipped to it.

Time rules (as pipebubble's reader applies them, reproduced from the text):
  Kineto ``ts``/``dur`` are decimal µs; ``ts`` is relative to ``baseTimeNanoseconds`` when the header has
  it. A value with at most 3 fraction digits is exact in ns. One with more: ``dur`` and a ``ts`` below
  2**43 µs round to the nearest ns; a larger ``ts`` (absolute epoch µs) keeps its first 3 fraction
  digits (truncated toward zero). Nsight times are integer ns on the host clock, moved to UTC by
  ``TARGET_INFO_SESSION_START_TIME`` (utcEpochNs - systemClockNs) when the export has it.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import statistics
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

from pipebubble.spans import COMM_KERNELS

_COMM = re.compile(COMM_KERNELS)
#: Kineto categories of GPU work (old traces capitalise them): category -> operation class.
GPU_CATEGORIES = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
}  # fmt: skip
#: Categories whose events sit on a device (a ``ProfilerStep#`` there is the GPU's copy, not the CPU range).
_ON_DEVICE = {*GPU_CATEGORIES, "gpu_user_annotation", "cuda_sync"}
#: Categories of the host calls that launch GPU work (they carry its correlation id).
_LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_BIG_US = 2**43
# CUpti_ActivityMemcpyKind (cupti_activity.h), as pipebubble names a memcpy: "Memcpy HtoD", with its source and
# destination memory where the export's ENUM_CUDA_MEM_KIND names both: "Memcpy HtoD (Pageable -> Device)".
_MEMCPY_KINDS = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA",
    6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP",
}  # fmt: skip

FIELDS = ("window_start_ns", "window_ns", "compute_ns", "comm_ns", "comm_exposed_ns", "memory_ns",
          "memory_exposed_ns", "idle_ns")  # fmt: skip


@dataclass(frozen=True)
class Op:
    """One GPU operation: ``cls`` is compute, comm, memcpy or memset."""

    lane: str
    rank: int | None
    pid: int | None
    device: int
    stream: int | None
    name: str
    cls: str
    start: int
    end: int
    correlation: int | None = None


@dataclass
class Job:
    """GPU operations of every file, each rank's ``ProfilerStep#N`` CPU ranges (step -> (start, end)) and the
    start of each launching call, per rank, by correlation id."""

    ops: list[Op] = field(default_factory=list)
    steps: dict[int | None, dict[int, tuple[int, int]]] = field(default_factory=dict)
    launches: dict[int | None, dict[int, int]] = field(default_factory=dict)


# --------------------------------------------------------------------------- time text


def _ns(value: int | Decimal, *, truncate_big: bool) -> int:
    """Decimal µs (an int or a Decimal from ``parse_float=Decimal``) to integer ns."""
    scaled = Decimal(value) * 1000
    if scaled == scaled.to_integral_value():
        return int(scaled)
    if truncate_big and abs(Decimal(value)) >= _BIG_US:
        return int(scaled)  # int() truncates toward zero: the first 3 fraction digits are kept
    return int(scaled.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def ts_ns(value: int | Decimal) -> int:
    return _ns(value, truncate_big=True)


def dur_ns(value: int | Decimal) -> int:
    return _ns(value, truncate_big=False)


# --------------------------------------------------------------------------- readers


def load_json(path: Path) -> object:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        return json.load(file, parse_float=Decimal)


def kineto_rank(doc: object, path: Path, position: int) -> int:
    """``distributedInfo.rank``, else a ``rank-N`` in the file name, else the file's position."""
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    match = _RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else position


def read_kineto(path: Path, position: int = 0, job: Job | None = None) -> Job:
    job = job if job is not None else Job()
    doc = load_json(path)
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    base = int(doc.get("baseTimeNanoseconds") or 0) if isinstance(doc, dict) else 0
    rank = kineto_rank(doc, path, position)
    steps = job.steps.setdefault(rank, {})
    launches = job.launches.setdefault(rank, {})
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("ts") is None or e.get("dur") is None:
            continue
        cat = str(e.get("cat") or "").lower()
        name = e.get("name") or ""
        start = ts_ns(e["ts"]) + base
        end = start + dur_ns(e["dur"])
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        corr = args.get("correlation")
        corr = corr if isinstance(corr, int) else None
        if cat in GPU_CATEGORIES:
            kind = GPU_CATEGORIES[cat]
            cls = ("comm" if _COMM.search(name) else "compute") if kind == "kernel" else kind
            device = int(e["pid"])
            job.ops.append(Op(f"rank{rank}/gpu{device}", rank, None, device, e.get("tid"), name, cls, start, end,
                              corr))
        elif cat in _LAUNCH_CATEGORIES and corr is not None:
            launches.setdefault(corr, start)
        elif name.startswith("ProfilerStep#") and cat not in _ON_DEVICE:
            steps[int(name.split("#", 1)[1])] = (start, end)
    return job


def gpu_steps(job: Job, rank: int | None) -> dict[int, tuple[int, int]]:
    """The rank's steps as the GPU lives them: each CPU range extended to the end of the GPU work launched
    inside it, and begun no earlier than the step before ended (ARCHITECTURE.md, "Step")."""
    cpu = sorted(job.steps.get(rank, {}).items(), key=lambda kv: kv[1])
    launches = job.launches.get(rank, {})
    ends = [hi for _, (_, hi) in cpu]
    for op in job.ops:
        at = launches.get(op.correlation) if op.rank == rank and op.correlation is not None else None
        if at is None:
            continue
        for k, (_, (lo, hi)) in enumerate(cpu):
            if lo <= at < hi:
                ends[k] = max(ends[k], op.end)
    out, before = {}, None
    for k, (step, (lo, _)) in enumerate(cpu):
        start = lo if before is None else max(lo, before)
        out[step] = (start, max(ends[k], start))
        before = ends[k] if before is None else max(before, ends[k])
    return out


def read_nsys(path: Path, job: Job | None = None) -> Job:
    """Kernels, memcpys and memsets of an Nsight Systems SQLite export, on UTC when the export says how."""
    job = job if job is not None else Job()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {n for (n,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        memory = dict(con.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND WHERE label != 'Unknown'")) if (
            "ENUM_CUDA_MEM_KIND" in tables) else {}
        offset = 0
        if "TARGET_INFO_SESSION_START_TIME" in tables:
            utc, clock = con.execute("SELECT utcEpochNs, systemClockNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            offset = utc - clock
        queries = {
            "CUPTI_ACTIVITY_KIND_KERNEL": "demangledName, shortName",
            "CUPTI_ACTIVITY_KIND_MEMCPY": "copyKind, srcKind * 1000 + dstKind",
            "CUPTI_ACTIVITY_KIND_MEMSET": "NULL, NULL",
        }
        for table, extra in queries.items():
            if table not in tables:
                continue
            sql = f"SELECT start, end, deviceId, streamId, globalPid, {extra} FROM {table}"
            for start, end, device, stream, gpid, a, b in con.execute(sql):
                if start is None or end is None or end < start or gpid is None:
                    continue
                if table.endswith("KERNEL"):
                    name = strings.get(a) or strings.get(b) or ""
                    cls = "comm" if _COMM.search(name) else "compute"
                elif table.endswith("MEMCPY"):
                    name, cls = f"Memcpy {_MEMCPY_KINDS.get(a, 'Unknown')}", "memcpy"
                    ends = None if b is None else (memory.get(b // 1000), memory.get(b % 1000))
                    if ends and None not in ends:
                        name += f" ({ends[0]} -> {ends[1]})"
                else:
                    name, cls = "Memset", "memset"
                pid = (gpid >> 24) & 0xFFFFFF
                job.ops.append(Op(f"pid{pid}/gpu{device}", None, pid, device, stream, name, cls,
                                  start + offset, end + offset))  # fmt: skip
    finally:
        con.close()
    return job


def read(paths: list[Path]) -> Job:
    """Every file of a job; Kineto/Chrome JSON ranks default to their position in ``paths``."""
    job = Job()
    for position, path in enumerate(paths):
        if str(path).endswith((".sqlite", ".db")):
            read_nsys(path, job)
        else:
            read_kineto(path, position, job)
    return job


def dedupe(ops: list[Op]) -> list[Op]:
    """The first of each (lane, stream, start, end, name)."""
    seen: set[tuple] = set()
    out = []
    for op in ops:
        key = (op.lane, op.stream, op.start, op.end, op.name)
        if key not in seen:
            seen.add(key)
            out.append(op)
    return out


# --------------------------------------------------------------------------- intervals


def union_length(intervals: list[tuple[int, int]]) -> int:
    """Length of the union: sort by start, sweep, add each merged run once."""
    total = 0
    run_start = run_end = None
    for start, end in sorted(intervals):
        if run_end is None or start > run_end:
            if run_end is not None:
                total += run_end - run_start
            run_start, run_end = start, end
        elif end > run_end:
            run_end = end
    if run_end is not None:
        total += run_end - run_start
    return total


def clipped(intervals: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def row(ops: list[Op], lo: int, hi: int) -> dict[str, int | float | None]:
    """One window's breakdown of ``ops`` (one lane's operations)."""
    by: dict[str, list[tuple[int, int]]] = {"compute": [], "comm": [], "memory": []}
    for op in ops:
        by["memory" if op.cls in ("memcpy", "memset") else op.cls].append((op.start, op.end))
    comp, comm, mem = (clipped(by[k], lo, hi) for k in ("compute", "comm", "memory"))
    compute = union_length(comp)
    busy_cc = union_length(comp + comm)
    busy = union_length(comp + comm + mem)
    comm_ns = union_length(comm)
    out = {
        "window_start_ns": lo,
        "window_ns": hi - lo,
        "compute_ns": compute,
        "comm_ns": comm_ns,
        "comm_exposed_ns": busy_cc - compute,
        "memory_ns": union_length(mem),
        "memory_exposed_ns": busy - busy_cc,
        "idle_ns": (hi - lo) - busy,
    }
    out["overlap"] = (comm_ns - out["comm_exposed_ns"]) / comm_ns if comm_ns else None
    return out


def breakdown(job: Job, ops: list[Op] | None = None) -> dict[tuple[str, int | None], dict]:
    """(lane, step) -> row: step None for the whole window, else one per ``ProfilerStep#N`` of the rank."""
    ops = job.ops if ops is None else ops
    lanes: dict[str, list[Op]] = {}
    for op in ops:
        lanes.setdefault(op.lane, []).append(op)
    out: dict[tuple[str, int | None], dict] = {}
    for lane, mine in lanes.items():
        lo, hi = min(o.start for o in mine), max(o.end for o in mine)
        out[(lane, None)] = row(mine, lo, hi)
        for step, (s_lo, s_hi) in gpu_steps(job, mine[0].rank).items():
            out[(lane, step)] = row(mine, s_lo, s_hi)
    return out


def identity_holds(r: dict) -> bool:
    return r["compute_ns"] + r["comm_exposed_ns"] + r["memory_exposed_ns"] + r["idle_ns"] == r["window_ns"]


# --------------------------------------------------------------------------- kernel summary


def kernel_summary(ops: list[Op]) -> dict[tuple[str, str], dict[str, int | float]]:
    """(name, class) -> count, total, mean, median, min, max, population std and share of all GPU time."""
    groups: dict[tuple[str, str], list[int]] = {}
    for op in ops:
        groups.setdefault((op.name, op.cls), []).append(op.end - op.start)
    everything = sum(op.end - op.start for op in ops)
    return {
        key: {
            "count": len(d),
            "total_ns": sum(d),
            "mean_ns": sum(d) / len(d),
            "median_ns": float(statistics.median(d)),
            "min_ns": min(d),
            "max_ns": max(d),
            "std_ns": statistics.pstdev(d),
            "share": sum(d) / everything if everything else 0.0,
        }
        for key, d in groups.items()
    }
