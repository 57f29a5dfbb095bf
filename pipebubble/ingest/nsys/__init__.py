"""Nsight Systems ingest: ``.sqlite`` exports, ``parquetdir`` exports and ``.nsys-rep`` reports.

Tables are read whole and converted with polars expressions (``spans``); nothing is filtered
on ``ANALYSIS_DETAILS`` start/stop times, because real files hold events before them. Each process's rank,
where the export names it, comes from ``ranks``; an export taken without CUDA tracing is read for its
NVTX ranges, with one warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from pipebubble.errors import TraceFormatError
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.magic import is_sqlite
from pipebubble.ingest.nsys import spans as ns
from pipebubble.ingest.nsys.memory import gpu_capacity, read_memory
from pipebubble.ingest.nsys.ranks import process_ranks, with_ranks
from pipebubble.ingest.nsys.tables import (
    ParquetTables,
    SqliteTables,
    Tables,
    has_cuda,
    looks_like_nsys,
    one_line,
)
from pipebubble.spans import TIME_LIMIT_NS, empty

REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
I64 = pl.Int64


def sniff(path: Path) -> bool:
    """Whether ``path`` is an Nsight Systems report or export this module can read."""
    path = Path(path)
    if path.suffix in REPORT_SUFFIXES:
        return True
    try:
        if path.is_dir():
            return looks_like_nsys(ParquetTables(path).names)
        if is_sqlite(path):
            tables = SqliteTables(path)
            try:
                return looks_like_nsys(tables.names)
            finally:
                tables.close()
    except (OSError, TraceFormatError):
        return False
    return False


def read(path: Path, cache_dir: Path | None = None) -> FileResult:
    """Read one Nsight Systems report into spans (see ``spans`` for the lane and kind rules)."""
    path = Path(path)
    tables = _open(path, cache_dir)
    try:
        result = _read_tables(tables, str(path))
    finally:
        tables.close()
    _check_session_shift(result)
    result.warnings = [one_line(w, 1000) for w in result.warnings]
    if result.spans.is_empty() and NO_CUDA in result.warnings:
        raise TraceFormatError(path, f"nothing to analyse: {_CUDA_OFF} and no NVTX range; {_TURN_ON}")
    if result.spans.is_empty():
        reasons = "; ".join(result.warnings) or "no CUDA or NVTX tables"
        raise TraceFormatError(path, one_line(f"nothing to analyse in this Nsight Systems export ({reasons})", 1000))
    return result


def unaligned(results: list[FileResult]) -> list[str]:
    """Warnings for the Nsight reports of a job of several that could not be put on UTC (``to_utc``): their
    times count on their own host's clock, so they do not line up with the others."""
    nsys = [r for r in results if r.format == "nsys"]
    if len(nsys) < 2:
        return []
    return [f"{r.source}: no TARGET_INFO_SESSION_START_TIME: clock not aligned with the other reports"
            for r in nsys if _utc_offset(r.meta) is None]


def to_utc(result: FileResult) -> FileResult:
    """One report on the UTC clock by itself, the one clock rule for Nsight reports.

    A report's timestamps count on its host's own clock; ``TARGET_INFO_SESSION_START_TIME`` pairs that
    clock (``systemClockNs``) with UTC epoch ns, so ``utc = t + utcEpochNs - systemClockNs``. Each report
    moves by itself, so reports read in separate processes line up without seeing each other. Unchanged
    when the session start is unknown. Results of other formats are returned as they are."""
    offset = _utc_offset(result.meta) if result.format == "nsys" else None
    if not offset:
        return result
    return _shifted(result, offset)


def _utc_offset(meta: dict[str, Any]) -> int | None:
    if meta.get("session_start_ns") is None:
        return None
    return int(meta["session_start_ns"]) - int(meta.get("session_start_clock_ns") or 0)


def _shift_fits(result: FileResult, shift: int) -> bool:
    """Whether moving every span and allocator event of ``result`` by ``shift`` keeps its times within
    +-``TIME_LIMIT_NS`` (``pipebubble.spans``)."""
    if abs(shift) >= TIME_LIMIT_NS:
        return False
    times = [result.spans["start"].min(), result.spans["end"].max()]
    if result.memory is not None:
        times += [result.memory["ts"].min(), result.memory["ts"].max()]
    return all(-TIME_LIMIT_NS < t + shift < TIME_LIMIT_NS for t in times if t is not None)


def _shifted(result: FileResult, shift: int) -> FileResult:
    """``result`` with its spans and allocator events moved by ``shift`` ns; unmoved, with a warning, when
    that would leave the span table's time range (the session start is then not a usable clock)."""
    if not _shift_fits(result, shift):
        note = f"clock offset {shift} ns would move spans out of range: clock not aligned"
        return dataclasses.replace(result, warnings=[*result.warnings, note])
    spans = result.spans.with_columns(pl.col("start") + shift, pl.col("end") + shift)
    memory = None if result.memory is None else result.memory.with_columns(pl.col("ts") + shift)
    return dataclasses.replace(result, spans=spans, memory=memory, meta={**result.meta, "clock_offset_ns": shift})


def _check_session_shift(result: FileResult) -> None:
    """Drop a session start whose UTC shift would move this report's spans or allocator events out of range,
    with a warning."""
    offset = _utc_offset(result.meta)
    if offset is None or _shift_fits(result, offset):
        return
    result.meta.pop("session_start_ns", None)
    result.meta.pop("session_start_clock_ns", None)
    result.warnings.append(
        f"TARGET_INFO_SESSION_START_TIME ignored: its UTC offset ({offset} ns) moves spans out of range"
    )


def _open(path: Path, cache_dir: Path | None) -> Tables:
    if path.suffix in REPORT_SUFFIXES:
        path = _export_report(path, cache_dir)
    if path.is_dir():
        tables: Tables = ParquetTables(path)
    elif not path.exists():
        raise TraceFormatError(path, "no such file")
    elif is_sqlite(path):
        tables = SqliteTables(path)
    else:
        raise TraceFormatError(path, "expected an Nsight Systems SQLite export, parquetdir folder or .nsys-rep")
    if not looks_like_nsys(tables.names):
        tables.close()
        raise TraceFormatError(
            path, "not an Nsight Systems export: no StringIds with CUPTI_*, NVTX_EVENTS or TARGET_INFO_* tables"
        )
    return tables


def export_command(report: Path, out: Path) -> list[str]:
    """The ``nsys`` command line that exports ``report`` (``.nsys-rep`` or the older ``.qdrep``) to ``out``."""
    return ["nsys", "export", "--type", "sqlite", "--force-overwrite", "true", "-o", str(out), str(report)]


def _export_report(report: Path, cache_dir: Path | None) -> Path:
    """Export a ``.nsys-rep`` or ``.qdrep`` to SQLite in the cache (never beside the input, which may be read-only)."""
    if not report.is_file():
        raise TraceFormatError(report, "no such file")
    if shutil.which("nsys") is None:
        hint = shlex.join(["nsys", "export", "--type", "sqlite", "-o", str(report.with_suffix(".sqlite")), str(report)])
        raise TraceFormatError(report, one_line(f"reading a report needs nsys on PATH; export it first: {hint}", 1000))
    stat = report.stat()
    key = hashlib.sha256(f"{report.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = Path(cache_dir) if cache_dir else Path(tempfile.gettempdir()) / "pipebubble-nsys"
    out = folder / f"{report.stem}-{key}.sqlite"
    if not out.exists():
        folder.mkdir(parents=True, exist_ok=True)
        try:
            done = subprocess.run(
                export_command(report, out), capture_output=True, text=True, errors="replace", check=False
            )
        except OSError as exc:
            raise TraceFormatError(report, one_line(f"cannot run nsys export ({exc})")) from None
        if done.returncode != 0 or not out.exists():
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise TraceFormatError(report, one_line(f"nsys export failed (exit {done.returncode}): {last[0]}"))
    return out


def _read_tables(tables: Tables, source: str) -> FileResult:
    result = FileResult(source=source, spans=empty(), format="nsys")
    strings = tables.load("StringIds", {"id": I64, "value": pl.String}).drop_nulls("id").unique("id")
    loaded = {t: _load(tables, t, result) for t in ns.COLUMNS}
    skipped = result.skipped
    runtime = ns.runtime_calls(loaded[ns.RUNTIME], strings, skipped)
    parts = [
        ns.kernels(loaded[ns.KERNEL], strings, skipped),
        ns.memcpys(loaded[ns.MEMCPY], skipped, tables.load(ns.MEM_KINDS, {"id": I64, "label": pl.String})),
        ns.memsets(loaded[ns.MEMSET], skipped),
        ns.graph_launches(loaded[ns.GRAPH], skipped),
        runtime,
        ns.syncs(loaded[ns.SYNC], runtime, skipped),
        ns.nvtx_ranges(loaded[ns.NVTX], strings, skipped),
    ]
    spans = pl.concat(parts).with_columns(source=pl.lit(source))  # each part is on the span schema
    found = process_ranks(tables, loaded[ns.NVTX], spans["pid"].unique().drop_nulls().to_list(), result.warnings)
    result.spans = with_ranks(spans, found.get("ranks", {}))
    read_memory(tables, result, found.get("ranks", {}))
    result.meta.update(_meta(tables, loaded, strings, result.warnings))
    result.meta.update(found)
    if len(found.get("ranks", {})) == 1 and result.spans["pid"].n_unique() == 1:  # the export is one rank
        result.meta["rank"] = next(iter(found["ranks"].values()))
    result.warnings.extend(tables.warnings)
    result.warnings.extend(_coerced_notes(tables))
    return result


def _coerced_notes(tables: Tables) -> list[str]:
    """One warning per column whose values could not all be read as its type (they were read as nulls)."""
    return [
        f"{one_line(col, 120)}: {n} value{'s' if n > 1 else ''} of the wrong type read as null"
        for col, n in sorted(tables.coerced.items())
    ]


# Tables whose absence changes what the analysis can say; the others are simply empty when absent.
_EXPECTED = {
    ns.KERNEL: "no kernel ran or CUDA tracing was off (nsys profile --trace=cuda)",
    ns.RUNTIME: "kernels cannot be joined to their launch calls",
}
_CUDA_OFF = "no CUDA tables: CUDA tracing was off (or no CUDA call was made)"
_TURN_ON = "profile with nsys profile --trace=cuda,nvtx,osrt to record GPU activity"
#: The one warning of an export without any CUDA table, instead of one per table it lacks.
NO_CUDA = f"{_CUDA_OFF}, so there is no GPU activity; {_TURN_ON}"


def _load(tables: Tables, table: str, result: FileResult) -> pl.DataFrame:
    if not has_cuda(tables.names):
        if NO_CUDA not in result.warnings:
            result.warnings.append(NO_CUDA)
    elif table not in tables.names and table in _EXPECTED:
        result.warnings.append(f"no {table} table: {_EXPECTED[table]}")
    frame = tables.load(table, ns.COLUMNS[table])
    result.events_read += frame.height
    return frame


def _meta(
    tables: Tables, loaded: dict[str, pl.DataFrame], strings: pl.DataFrame, warnings: list[str]
) -> dict[str, Any]:
    meta: dict[str, Any] = {"nvtx_domains": ns.nvtx_domains(loaded[ns.NVTX], strings)}
    meta.update(_session_start(tables, warnings))
    meta["process_names"] = _process_names(tables)
    meta["thread_names"] = _thread_names(tables, strings)
    meta.update(gpu_capacity(tables, warnings))
    version = _export_info(tables).get("EXPORT_PRODUCT_VERSION")
    if version:
        meta["nsys_version"] = version
    return meta


def _session_start(tables: Tables, warnings: list[str]) -> dict[str, int]:
    """UTC epoch ns of the session start, and the same instant on the events' own clock.

    Either value beyond the span table's time range (``pipebubble.spans.TIME_LIMIT_NS``; UTC must also be after 1970)
    cannot be a real clock reading: both are dropped with a warning, and the report is left unaligned.
    """
    name = next((n for n in sorted(tables.names) if n.startswith("TARGET_INFO_SESSION_START")), None)
    row = tables.load(name, {"utcEpochNs": I64, "systemClockNs": I64}) if name else pl.DataFrame()
    if row.is_empty() or row["utcEpochNs"][0] is None:
        return {}
    utc, clock = int(row["utcEpochNs"][0]), row["systemClockNs"][0]
    if clock is None:  # older exports: fall back to the analysis start on the event clock
        details = tables.load("ANALYSIS_DETAILS", {"startTime": I64})
        clock = details["startTime"][0] if details.height else 0
    clock = int(clock or 0)
    if not (0 <= utc < TIME_LIMIT_NS and -TIME_LIMIT_NS < clock < TIME_LIMIT_NS):
        warnings.append(f"{name} ignored: utcEpochNs {utc} or clock {clock} out of range: clock not aligned")
        return {}
    return {"session_start_ns": utc, "session_start_clock_ns": clock}


def _process_names(tables: Tables) -> dict[int, str]:
    procs = tables.load("PROCESSES", {"pid": I64, "name": pl.String}).drop_nulls()
    return dict(procs.iter_rows())


def _thread_names(tables: Tables, strings: pl.DataFrame) -> dict[str, str]:
    names = tables.load("ThreadNames", {"nameId": I64, "globalTid": I64}).select(
        pl.format("{}/{}", ns.pid_of("globalTid"), ns.tid_of("globalTid")).alias("thread"),
        ns.lookup("nameId", strings).alias("name"),
    )
    return dict(names.drop_nulls().iter_rows())


def _export_info(tables: Tables) -> dict[str, str]:
    # Older exports call it EXPORT_META_DATA; some have neither.
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if table in tables.names:
            rows = tables.load(table, {"name": pl.String, "value": pl.String}).drop_nulls("name")
            return dict(rows.iter_rows())
    return {}
