"""Find trace files, sniff their format, read them (in parallel, through the cache) into one span table."""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
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
NSYS_SUFFIXES = (".sqlite", ".nsys-rep")
#: What `pipebubble capture` writes beside its traces (command, versions, devices): not a trace.
CAPTURE_METADATA = "capture.json"
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
        return [w for f in self.files for w in f.warnings]


def find_traces(paths: Iterable[Path]) -> list[Path]:
    """Expand folders into the trace files they hold (sorted), checking every path exists."""
    found: list[Path] = []
    for path in paths:
        if not path.exists():
            raise TraceFormatError(path, "no such file or directory")
        if path.is_dir() and not _is_parquetdir(path):
            inside = sorted(p for p in path.iterdir() if _is_trace_name(p) or _is_parquetdir(p))
            if not inside:
                raise TraceFormatError(path, "folder holds no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep)")
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
    if len(done) > 1 and any(r.format == "nsys" for r in done):
        from pipebubble.ingest import nsys

        done = nsys.align_clocks(done)
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
    """One file through the cache; a big JSON file is decoded on ``workers`` processes."""
    path = Path(path)
    result = cache.get(path) if use_cache else None
    if result is None:
        pool = _pool(workers) if workers > 1 and _worth_splitting(path) else None
        try:
            result = read_one(path, position, pool, spill=_spill_folder(path))
        finally:
            if pool is not None:
                pool.shutdown()
        if use_cache:
            cache.put(path, result)
    return result


def read_one(path: Path, position: int = 0, pool: Executor | None = None, spill: Path | None = None) -> FileResult:
    """Read one trace file (or Nsight parquet folder), whatever its format; ``pool`` decodes the blocks of
    one big JSON file in parallel; ``spill`` sends a JSON file's spans to Parquet files there."""
    try:
        if _is_parquetdir(path) or path.name.endswith(NSYS_SUFFIXES) or _has_sqlite_magic(path):
            from pipebubble.ingest import nsys

            return nsys.read(path, cache.directory())
        from pipebubble.ingest import chrome

        return chrome.read(path, position, pool, cache.directory() / "scratch", spill)
    except OSError as exc:
        raise TraceFormatError(path, exc.strerror or str(exc)) from None


def _spill_folder(path: Path) -> Path | None:
    """Where a JSON trace too big for memory (``PIPEBUBBLE_SPILL_BYTES`` of text, default 256 MB; gzip counted
    tenfold) puts its span table: a fresh folder in the cache, keyed like the file's cache entry."""
    if not path.is_file() or path.name.endswith(NSYS_SUFFIXES):
        return None
    limit = int(os.environ.get("PIPEBUBBLE_SPILL_BYTES", 256 << 20))
    size = path.stat().st_size * (10 if path.name.endswith(".gz") else 1)
    if size < limit:
        return None
    folder = cache.spill_folder(path)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def spans_of(result: FileResult):
    """A file's whole span table, read back from its spill folder when it has one."""
    import polars as pl

    spill = result.meta.get("spill")
    return pl.read_parquet(Path(spill) / "*.parquet") if spill else result.spans


def _pool(workers: int) -> ProcessPoolExecutor:
    from pipebubble import _worker

    return ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker.init)


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir()) if path.is_dir() else path.stat().st_size


def _worth_splitting(path: Path) -> bool:
    """A JSON file of several decode blocks (gzip shrinks Kineto JSON about tenfold)."""
    from pipebubble.ingest.jsontrace import BLOCK_BYTES

    size = path.stat().st_size * (10 if path.name.endswith(".gz") else 1)
    return path.is_file() and not path.name.endswith(NSYS_SUFFIXES) and size > 2 * BLOCK_BYTES


def _is_trace_name(path: Path) -> bool:
    return path.is_file() and path.name.endswith(JSON_SUFFIXES + NSYS_SUFFIXES) and path.name != CAPTURE_METADATA


def _is_parquetdir(path: Path) -> bool:
    return path.is_dir() and (any(path.glob("*KERNEL*.parquet")) or (path / "StringIds.parquet").exists())


def _has_sqlite_magic(path: Path) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"
