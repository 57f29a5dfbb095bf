"""Each process's rank as the job names it, from what an Nsight Systems export holds.

Two sources, in order of trust:

1. NCCL's NVTX payloads. NCCL attaches a payload to its communicator calls (``ncclCommInitRank`` and its
   ``Config``/``Scalable`` forms, ``ncclCommSplit``, ``ncclCommShrink``, ``ncclCommDestroy``, ``ncclCommAbort``)
   whose schema has the entries ``Rank`` and ``No. of ranks`` (NCCL ``src/include/nvtx_payload_schemas.h``).
   Nsight lists each schema's entries (name, type, byte offset) in ``NVTX_PAYLOAD_SCHEMA_ENTRIES``; exported with
   ``--include-blobs=true`` an event's payload is in ``NVTX_EVENTS.binaryData`` after a 32-byte header whose
   second little-endian 8-byte word is the schema id; exported with ``--include-json=true`` it is in
   ``jsonText``, an object keyed by the entries' names. A process joins several communicators (a tensor-parallel
   group, a pipeline pair): its rank in the job is the one in the job's largest communicator (torch's default
   group spans the world), or in one of the launch's ``WORLD_SIZE`` where that is known.
2. The launch environment: ``META_DATA_CAPTURE`` rows ``PROCESS_{n}:ENVIRONMENT_VARIABLE`` (``NAME="value"``) of
   each process nsys launched, or attached to (``PROCESS_{n}:PID``, 0 for a launch). ``RANK`` (torchrun and
   torch's ``env://``), else ``OMPI_COMM_WORLD_RANK`` or ``PMIX_RANK`` (mpirun); ``WORLD_SIZE`` or
   ``OMPI_COMM_WORLD_SIZE`` for the size. ``LOCAL_RANK`` is never read as a rank: it counts within one node, so
   every node has a rank 0. The processes a launch starts inherit its environment, so one launch's ``RANK``
   (``torchrun ... nsys profile python train.py``) names the rank of the process it traced; when it traced
   several (``nsys profile torchrun ...``: the workers set their own ``RANK``, which nsys does not record) they
   would all claim that one rank, and are left unknown.

Where the export holds neither, ranks stay null: a pid is never a rank. A rank must be unique within the export
and fit Int32: claims that do not are dropped with a warning rather than guessed between.
"""

from __future__ import annotations

import json
import re
from typing import Any

import polars as pl

from pipebubble.ingest.nsys.tables import Tables, one_line
from pipebubble.spans import INT32

I64 = pl.Int64
INT32_MAX = INT32 - 1  # the largest rank, world size or device number a span's Int32 column holds
RANK_ENTRY, SIZE_ENTRY = "Rank", "No. of ranks"
HEADER_BYTES = 32
#: NVTX_PAYLOAD_ENTRY_TYPE_* integer types (nvToolsExtPayload.h) -> their polars type, C types as on LP64 Linux.
INT_TYPES = {
    1: pl.Int8, 2: pl.UInt8, 3: pl.Int16, 4: pl.UInt16, 5: pl.Int32, 6: pl.UInt32, 7: pl.Int64, 8: pl.UInt64,
    9: pl.Int64, 10: pl.UInt64, 11: pl.Int8, 12: pl.UInt8, 13: pl.Int16, 14: pl.UInt16, 15: pl.Int32,
    16: pl.UInt32, 17: pl.Int64, 18: pl.UInt64,
}  # fmt: skip
ENTRY_COLS = {"domainId": I64, "schemaId": I64, "idx": I64, "type": I64, "name": pl.String, "offset": I64}
CAPTURE_COLS = {"name": pl.String, "value": pl.String}
RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE")
_LAUNCH_ROW = re.compile(r"^PROCESS_(\d+):(ENVIRONMENT_VARIABLE|PID)$")
_INTEGER = re.compile(r"^[+-]?\d{1,19}$")
CLAIMS = {"pid": I64, "rank": I64, "nranks": I64}


def process_ranks(tables: Tables, nvtx: pl.DataFrame, pids: list[int], warnings: list[str]) -> dict[str, Any]:
    """``{"ranks": {pid: rank}, "world_size": n}`` for the traced ``pids``, each key only where the export tells
    it; ``warnings`` gets one line per claim dropped."""
    launches = _launches(tables)
    env_world = _env_world(launches, warnings)
    nccl, nccl_world = _nccl_ranks(_nccl_claims(tables, nvtx), env_world, warnings)
    env = _env_ranks(launches, pids, warnings)
    for pid in sorted(set(nccl) & set(env)):
        if nccl[pid] != env[pid]:
            warnings.append(f"process {pid}: NCCL says rank {nccl[pid]}, its environment RANK {env[pid]}: NCCL's kept")
    ranks = _unique({pid: rank for pid, rank in (env | nccl).items() if pid in set(pids)}, warnings)
    out: dict[str, Any] = {"ranks": ranks} if ranks else {}
    world = _checked_world(nccl_world or env_world, ranks, warnings)
    if world is not None:
        out["world_size"] = world
    return out


def with_ranks(spans: pl.DataFrame, ranks: dict[int, int]) -> pl.DataFrame:
    """Every span of a ranked process with its ``rank``, and its lane named by the rank (``rank1/gpu0``,
    ``rank1/cpu/77``) as other formats name them; other processes' spans as they are."""
    if not ranks:
        return spans
    rank = pl.col("pid").replace_strict(list(ranks), list(ranks.values()), default=None, return_dtype=pl.Int32)
    lane = pl.format("rank{}{}", pl.col("rank"), pl.col("lane").str.replace(r"^pid\d+", ""))
    return spans.with_columns(rank=rank).with_columns(
        lane=pl.when(pl.col("rank").is_not_null()).then(lane).otherwise(pl.col("lane"))
    )


# --- NCCL payloads ---


def _rank_fields(tables: Tables) -> list[dict[str, int]]:
    """Each payload schema with a ``Rank`` and a ``No. of ranks`` integer entry: its domain and id, and each
    entry's byte offset and type. The first entry's offset may be left unset: it is 0."""
    entries = tables.load("NVTX_PAYLOAD_SCHEMA_ENTRIES", ENTRY_COLS).unique(["domainId", "schemaId", "idx"])
    entries = entries.with_columns(
        offset=pl.when(pl.col("offset").is_null() & (pl.col("idx") == 0)).then(0).otherwise(pl.col("offset"))
    ).filter(pl.col("type").is_in(list(INT_TYPES)) & (pl.col("offset") >= 0) & pl.col("domainId").is_not_null())
    keys = ["domainId", "schemaId"]
    rank = entries.filter(pl.col("name") == RANK_ENTRY).select(*keys, rank_off="offset", rank_type="type")
    size = entries.filter(pl.col("name") == SIZE_ENTRY).select(*keys, size_off="offset", size_type="type")
    both = rank.unique(keys, keep="none").join(size.unique(keys, keep="none"), on=keys)
    return both.to_dicts()


def _int_at(offset: int, type_id: int) -> pl.Expr:
    """The integer of NVTX type ``type_id`` at ``offset`` of the payload; null where the blob is shorter."""
    dtype = INT_TYPES[type_id]
    width = {pl.Int8: 1, pl.UInt8: 1, pl.Int16: 2, pl.UInt16: 2, pl.Int32: 4, pl.UInt32: 4}.get(dtype, 8)
    raw = pl.col("binaryData").bin.slice(HEADER_BYTES + offset, width)
    return raw.bin.reinterpret(dtype=dtype, endianness="little").cast(I64, strict=False)


def _from_blobs(nvtx: pl.DataFrame, fields: list[dict[str, int]]) -> pl.DataFrame:
    if not fields or "binaryData" not in nvtx.columns:
        return pl.DataFrame(schema=CLAIMS)
    schema_id = pl.col("binaryData").bin.slice(8, 8).bin.reinterpret(dtype=pl.UInt64, endianness="little")
    blobs = nvtx.filter(pl.col("binaryData").bin.size() >= HEADER_BYTES).with_columns(
        schemaId=schema_id.cast(I64, strict=False)
    )
    parts = [
        blobs.filter((pl.col("domainId") == f["domainId"]) & (pl.col("schemaId") == f["schemaId"])).select(
            _pid(), rank=_int_at(f["rank_off"], f["rank_type"]), nranks=_int_at(f["size_off"], f["size_type"])
        )
        for f in fields
    ]
    return pl.concat(parts) if parts else pl.DataFrame(schema=CLAIMS)


def _pid() -> pl.Expr:
    return (pl.coalesce("globalTid", "endGlobalTid") // (1 << 24) % (1 << 24)).alias("pid")


def _json_value(obj: dict, key: str) -> int | None:
    value = obj.get(key)
    if isinstance(value, str):  # shown with digit grouping ("1,024") by some exports
        value = value.replace(",", "").strip()
        value = int(value) if _INTEGER.match(value) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_json(nvtx: pl.DataFrame) -> pl.DataFrame:
    """Ranks from payloads exported as JSON objects keyed by the schema's entry names."""
    if "jsonText" not in nvtx.columns:
        return pl.DataFrame(schema=CLAIMS)
    rows = nvtx.filter(pl.col("jsonText").str.contains(f'"{RANK_ENTRY}"', literal=True)).select(_pid(), "jsonText")
    claims = []
    for pid, text in rows.iter_rows():  # a decoder: one row per communicator call, not per event of the trace
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            claims.append((pid, _json_value(obj, RANK_ENTRY), _json_value(obj, SIZE_ENTRY)))
    return pl.DataFrame(claims, schema=CLAIMS, orient="row")


def _nccl_claims(tables: Tables, nvtx: pl.DataFrame) -> pl.DataFrame:
    """One row per NCCL communicator call that carries a rank: the calling process, its rank and the size."""
    if nvtx.is_empty():
        return pl.DataFrame(schema=CLAIMS)
    claims = pl.concat([_from_blobs(nvtx, _rank_fields(tables)), _from_json(nvtx)])
    return claims.drop_nulls().filter(pl.col("nranks") > 0)


def _nccl_ranks(claims: pl.DataFrame, world: int | None, warnings: list[str]) -> tuple[dict[int, int], int | None]:
    """Each process's rank in the job's communicator: the one of size ``world`` (the launch's) or else the
    largest; a process with two ranks in communicators of that size is left unknown, with a warning."""
    if claims.is_empty():
        return {}, None
    size = world if world is not None else int(claims["nranks"].max())
    per_pid = claims.filter(pl.col("nranks") == size).group_by("pid").agg(pl.col("rank").unique().sort())
    ranks = {}
    for pid, found in per_pid.sort("pid").iter_rows():
        if len(found) == 1:
            ranks[pid] = found[0]
        else:
            warnings.append(f"process {pid}: NCCL names ranks {found} in communicators of {size}: rank left unknown")
    return ranks, (size if ranks else None)


# --- the launch environment ---


def _launches(tables: Tables) -> dict[int, dict[str, str]]:
    """Launch number -> its environment (and ``:PID``) from ``META_DATA_CAPTURE``."""
    rows = tables.load("META_DATA_CAPTURE", CAPTURE_COLS).drop_nulls()
    launches: dict[int, dict[str, str]] = {}
    for name, value in rows.filter(pl.col("name").str.starts_with("PROCESS_")).iter_rows():
        match = _LAUNCH_ROW.match(name)
        if not match:
            continue
        env = launches.setdefault(int(match[1]), {})
        if match[2] == "PID":
            env[":PID"] = value
        elif "=" in value:
            key, _, val = value.partition("=")
            env[key.strip()] = val.strip().removeprefix('"').removesuffix('"')
    return launches


def _int_var(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if _INTEGER.match(value):
            return int(value)
    return None


def _env_world(launches: dict[int, dict[str, str]], warnings: list[str]) -> int | None:
    sizes = {n for env in launches.values() if (n := _int_var(env, SIZE_VARS)) is not None}
    if len(sizes) > 1:
        warnings.append(f"launches name world sizes {sorted(sizes)}: world size left unknown")
        return None
    return sizes.pop() if sizes else None


def _env_ranks(launches: dict[int, dict[str, str]], pids: list[int], warnings: list[str]) -> dict[int, int]:
    """Rank claims of the launch environments: an attached process's by its pid; a launched one's (pid 0) for
    every traced process when the export holds that one launch only."""
    claims: dict[int, list[int]] = {}
    for number, env in sorted(launches.items()):
        rank = _int_var(env, RANK_VARS)
        if rank is None:
            continue
        pid = _int_var(env, (":PID",)) or 0
        if pid:
            claims.setdefault(pid, []).append(rank)
        elif len(launches) == 1:
            for p in pids:
                claims.setdefault(p, []).append(rank)
        else:
            warnings.append(f"PROCESS_{number}: its environment names rank {rank} but not its process: ignored")
    return {pid: ranks[0] for pid, ranks in claims.items() if len(ranks) == 1}


# --- checks ---


def _unique(ranks: dict[int, int], warnings: list[str]) -> dict[int, int]:
    """``ranks`` less those out of Int32 range and those two processes claim (both dropped), with warnings."""
    kept = {}
    for pid, rank in sorted(ranks.items()):
        if 0 <= rank <= INT32_MAX:
            kept[pid] = rank
        else:
            warnings.append(f"process {pid}: rank {rank} out of range (0 to 2**31-1): rank left unknown")
    owners: dict[int, list[int]] = {}
    for pid, rank in kept.items():
        owners.setdefault(rank, []).append(pid)
    for rank, claimed in sorted(owners.items()):
        if len(claimed) > 1:
            who = ", ".join(map(str, claimed))
            warnings.append(one_line(f"rank {rank} claimed by processes {who}: their ranks left unknown", 1000))
    return {pid: rank for pid, rank in kept.items() if len(owners[rank]) == 1}


def _checked_world(world: int | None, ranks: dict[int, int], warnings: list[str]) -> int | None:
    if world is None:
        return None
    if not 1 <= world <= INT32_MAX or (ranks and max(ranks.values()) >= world):
        warnings.append(f"world size {world} out of range or not above every rank: world size left unknown")
        return None
    return world
