"""Find trace files, sniff their format, read them (in parallel, through the cache) into one span table."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import cache
from pipebubble.ingest.base import FileResult

if TYPE_CHECKING:  # polars loads only when traces are read, so a cached report comes back fast
    import polars as pl

JSON_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
#: What `pipebubble capture` writes beside its traces (command, versions, devices): not a trace.
CAPTURE_METADATA = "capture.json"
#: Name endings of files in a trace folder that are not traces (yet): capture's status and partial files.
NOT_TRACES = (".tmp", ".partial.json.gz", ".status.json")
#: Below this many bytes in all, starting worker processes costs more than it saves.
PARALLEL_BYTES = 16 << 20


@dataclass
class Ingested:
    """Every file's result and the span table of them all."""

    spans: pl.DataFrame
    files: list[FileResult] = field(default_factory=list)

    @property
    def skipped(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for f in self.files:
            total.update(f.skipped)
        return total

    @property
    def warnings(self) -> list[str]:
        """Every file's warnings; one about the cache, which each file may repeat, only once."""
        return list(dict.fromkeys(w for f in self.files for w in f.warnings))


def find_traces(paths: Iterable[Path]) -> list[Path]:
    """Expand folders into the trace files they hold (sorted), checking every path exists. A file named
    itself is read whatever its name; in a folder, hidden and unfinished files are passed over."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise TraceFormatError(path, "no such file or directory")
        if path.is_dir() and not _is_parquetdir(path):
            inside = sorted(
                p for p in path.iterdir() if _is_trace_name(p) or (_is_parquetdir(p) and not _is_unfinished(p))
            )
            if not inside:
                raise TraceFormatError(
                    path, "folder holds no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep, *.qdrep)"
                )
            found.extend(inside)
        else:
            found.append(path)
    return found


def load(
    paths: Iterable[Path],
    *,
    use_cache: bool = True,
    workers: int | None = None,
    on_file: Callable[[Path], None] | None = None,
) -> Ingested:
    """Read all traces under ``paths`` into one span table. ``on_file`` is called as each file is done."""
    import polars as pl

    from pipebubble import spans

    files = find_traces(paths)
    jobs = [(f, i) for i, f in enumerate(files)]
    done = each_file(jobs, partial(read_file, use_cache=use_cache), workers, on_file)
    table = pl.concat([spans_of(r) for r in done], how="vertical") if done else spans.empty()
    return Ingested(table, done)


def each_file(jobs: list[tuple], fn: Callable, workers: int | None, on_done: Callable | None = None) -> list:
    """``fn(path, position, workers=n)`` for every (path, position) job, in order: in this process one file at
    a time (a lone big file gets all cores for its blocks), or one file per process in a pool when there
    are several files and enough bytes to be worth the processes' start-up."""
    cores = workers or os.cpu_count() or 1
    if len(jobs) == 1 or cores <= 1 or sum(_size(Path(p)) for p, _ in jobs) < PARALLEL_BYTES:
        out = []
        for path, i in jobs:
            out.append(fn(path, i, workers=cores if len(jobs) == 1 else 1))
            if on_done:
                on_done(path)
        return out
    with _pool(min(cores, len(jobs))) as pool:
        futures = [pool.submit(fn, path, i) for path, i in jobs]
        out = []
        for (path, _), future in zip(jobs, futures, strict=True):
            out.append(future.result())
            if on_done:
                on_done(path)
        return out


def read_file(path: Path | str, position: int = 0, use_cache: bool = True, workers: int = 1) -> FileResult:
    """One file through the cache; a big JSON file is decoded on ``workers`` processes. Warnings about the
    cache raised meanwhile come back among the file's warnings (never stored with it)."""
    path = Path(path)
    seen = len(cache.warnings())
    entry_key = cache.key(path)
    result = cache.get(path, entry_key) if use_cache else None
    if result is None:
        pool = _pool(workers) if workers > 1 and _worth_splitting(path) else None
        try:
            result = _read_somewhere(path, position, pool, entry_key)
        finally:
            if pool is not None:
                pool.shutdown()
        if use_cache and entry_key is not None and cache.key(path) == entry_key:  # unchanged while read
            cache.put(path, result, entry_key)
    fresh = cache.warnings()[seen:]
    return _on_clock(replace(result, warnings=[*result.warnings, *fresh]) if fresh else result)


def _on_clock(result: FileResult) -> FileResult:
    """The one clock rule, applied wherever a file is read: Nsight reports move onto UTC by themselves
    (Kineto and Chrome traces already count on the epoch or their own base)."""
    if result.format != "nsys":
        return result
    from pipebubble.ingest import nsys

    return nsys.to_utc(result)


def read_one(path: Path, position: int = 0, pool: Executor | None = None, spill: Path | None = None) -> FileResult:
    """Read one trace file (or Nsight parquet folder), whatever its format; ``pool`` decodes the blocks of
    one big JSON file in parallel; ``spill`` sends a JSON file's spans to Parquet files there."""
    try:
        return _read(path, position, pool, cache.work_dir(), spill)
    except OSError as exc:
        raise TraceFormatError(path, exc.strerror or str(exc)) from None


def _read_somewhere(path: Path, position: int, pool: Executor | None, entry_key: str | None) -> FileResult:
    """Read ``path`` with its spill and scratch in the cache; when writing there fails (a full or
    read-only volume), again in a temporary folder, then in memory. Only the trace's own errors are
    the trace's: a cache problem is a warning, never a TraceFormatError."""
    spills = _spills(path)
    writes = spills or _writes_files(path)
    tried: list[Path] = []
    while True:
        work = cache.work_dir() if writes else None
        if work in tried:  # never the same folder twice: memory is the last resort
            work = None
        tried.append(work)
        spill = None
        try:
            spill = cache.new_spill(work, entry_key) if spills and work is not None else None
            result = _read(path, position, pool, work, spill)
        except Exception as exc:
            cache.discard(spill)
            reason = cache.disk_error(exc, work)
            if reason is None:
                if isinstance(exc, OSError):
                    raise TraceFormatError(path, exc.strerror or str(exc)) from None
                raise
            cache.unusable(work, reason)
            continue
        return cache.commit_spill(result, spill, entry_key) if spill is not None else result


def _read(path: Path, position: int, pool: Executor | None, work: Path | None, spill: Path | None) -> FileResult:
    """Read one trace with the reader its format needs; ``work`` holds exports and gunzipped scratch."""
    if _is_parquetdir(path) or path.name.endswith(NSYS_SUFFIXES) or _has_sqlite_magic(path):
        from pipebubble.ingest import nsys

        return nsys.read(path, work)
    from pipebubble.ingest import chrome

    return chrome.read(path, position, pool, work / "scratch" if work is not None else None, spill)


def _writes_files(path: Path) -> bool:
    """Whether reading ``path`` needs a folder (besides a spill): a big gzipped trace is gunzipped to disk,
    an Nsight report is exported to SQLite. Other reads never touch the cache folder."""
    if path.name.endswith((".nsys-rep", ".qdrep")):
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return False
    from pipebubble.ingest.jsontrace import GUNZIP_TO_DISK

    return path.stat().st_size >= GUNZIP_TO_DISK


def _spills(path: Path) -> bool:
    """Whether a JSON trace is too big for memory (``PIPEBUBBLE_SPILL_BYTES`` of text, default 256 MB; gzip
    counted tenfold), so its span table goes to Parquet files in a spill folder."""
    if not path.is_file() or path.name.endswith(NSYS_SUFFIXES):
        return False
    limit = int(os.environ.get("PIPEBUBBLE_SPILL_BYTES", 256 << 20))
    return path.stat().st_size * (10 if path.name.endswith(".gz") else 1) >= limit


def spans_of(result: FileResult):
    """A file's whole span table, read back from its spill folder when it has one."""
    import polars as pl

    spill = result.meta.get("spill")
    if spill and cache.parts(Path(spill)):
        return pl.read_parquet(Path(spill) / "*.parquet")
    return result.spans


def _pool(workers: int) -> ProcessPoolExecutor:
    from pipebubble import _worker

    cache.clean_at_exit()  # a worker's fallback folder outlives the worker: this process removes it
    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker.init)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


def _worth_splitting(path: Path) -> bool:
    """A JSON file of several decode blocks (gzip shrinks Kineto JSON about tenfold)."""
    from pipebubble.ingest.jsontrace import BLOCK_BYTES

    size = path.stat().st_size * (10 if path.name.endswith(".gz") else 1)
    return path.is_file() and not path.name.endswith(NSYS_SUFFIXES) and size > 2 * BLOCK_BYTES


def _is_trace_name(path: Path) -> bool:
    return (
        path.is_file()
        and path.name.endswith(JSON_SUFFIXES + NSYS_SUFFIXES)
        and path.name != CAPTURE_METADATA
        and not _is_unfinished(path)
    )


def _is_unfinished(path: Path) -> bool:
    """Hidden files and what `pipebubble capture` writes while it runs (a status file, a partial trace):
    a killed capture leaves them beside its traces, and they are not traces."""
    return path.name.startswith(".") or path.name.endswith(NOT_TRACES)


def _is_parquetdir(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("*KERNEL*.parquet")) or (path / "StringIds.parquet").exists())


def _has_sqlite_magic(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"
