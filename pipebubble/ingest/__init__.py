"""Find trace files, sniff their format, read them (in parallel, through the cache) into one span table."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import cache, readers
from pipebubble.ingest.base import FileResult

if TYPE_CHECKING:  # polars loads only when traces are read, so a cached report comes back fast
    import polars as pl

    from pipebubble.ingest.json.chrome import Pending

#: What `pipebubble capture` writes beside its traces (command, versions, devices; the profiler's messages).
CAPTURE_METADATA = "capture.json"
CAPTURE_LOG = "capture.log"
#: Name endings of files in a trace folder that are not traces (yet): capture's status and partial files.
NOT_TRACES = (".tmp", ".partial.json.gz", ".status.json")


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


def find_traces(paths: Iterable[Path], notes: list[str] | None = None) -> list[Path]:
    """Expand folders into the trace files they hold (sorted), checking every path exists. A file named
    itself is read whatever its name, but for capture's own files and, among other paths, a saved report
    (`analyze out/*`), which are skipped with a line in ``notes``; in a folder, hidden and unfinished files
    and capture.json are passed over, and saved reports skipped with a note. An Nsight report whose SQLite
    export sits beside it is read from the export (``readers.paired``)."""
    paths, notes = list(paths), notes if notes is not None else []
    found: list[Path] = []
    skipped: list[str] = []
    for path in paths:
        if not path.exists():
            raise TraceFormatError(path, "no such file or directory")
        if path.is_dir() and not readers.is_trace_dir(path):
            found.extend(_folder(path, notes))
        elif why := _not_a_trace(path, alone=len(paths) == 1):
            skipped.append(f"{path}: skipped, {why}")
        else:
            found.append(path)
    notes.extend(skipped)
    if skipped and not found:
        if len(paths) == 1:
            raise TraceFormatError(paths[0], _not_a_trace(paths[0], alone=True) or "not a trace")
        raise TraceFormatError("the paths given", f"none is a trace: {'; '.join(skipped)}")
    return readers.paired(found, notes)


def _folder(path: Path, notes: list[str]) -> list[Path]:
    inside, skipped = [], []
    for p in sorted(path.iterdir()):
        if readers.is_trace_dir(p) and not _is_unfinished(p):
            inside.append(p)
        elif _is_trace_name(p) and (why := _not_a_trace(p)):
            skipped.append(f"{p}: skipped, {why}")
        elif _is_trace_name(p):
            inside.append(p)
    notes.extend(skipped)
    if not inside:
        besides = f"; {'; '.join(skipped)}" if skipped else ""
        raise TraceFormatError(
            path, f"folder holds no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep, *.qdrep){besides}"
        )
    return inside


def _not_a_trace(path: Path, alone: bool = False) -> str | None:
    """Why a file with a trace's name is not one (None when it may be). A saved report given alone is read
    as the report it is (``run``), so it is no reason then."""
    if path.name == CAPTURE_METADATA:
        return "capture's record of the run, not a trace"
    if path.name == CAPTURE_LOG:
        return "capture's log of the profiler's messages, not a trace"
    if not alone and readers.saved_report(path):
        return f"a saved pipebubble report, not a trace (read it alone: pipebubble analyze {path})"
    return None


def load(
    paths: Iterable[Path],
    *,
    use_cache: bool = True,
    workers: int | None = None,
    on_file: Callable[[Path], None] | None = None,
) -> Ingested:
    """Read all traces under ``paths`` into one span table. ``on_file`` is called as each file is done."""
    import polars as pl

    from pipebubble import executor, spans
    from pipebubble.options import Scale

    cache.clean_at_exit()  # a worker's fallback cache folder outlives the worker: this process removes it
    jobs = [(str(f), i) for i, f in enumerate(find_traces(paths))]
    done = executor.each(jobs, read_file, Scale(workers=workers), on_file, use_cache=use_cache)
    table = pl.concat([spans_of(r) for r in done], how="vertical") if done else spans.empty()
    return Ingested(table, done)


def read_file(path: Path | str, position: int = 0, use_cache: bool = True, workers: int = 1) -> FileResult:
    """One file through the cache; a big JSON file is decoded on ``workers`` cores (this process and a pool
    of the others). Warnings about the cache raised meanwhile come back among the file's warnings (never
    stored with it)."""
    path = Path(path)
    seen = len(cache.warnings())
    result, entry_key, reader = _cached(path, use_cache)
    if result is None:
        split = workers > 1 and reader.splits(path)  # the blocks of one big file, on a pool
        workers = _decoders(workers) if split else workers
        with _pool(workers - 1) if split and workers > 1 else nullcontext() as pool:
            result = _read_somewhere(reader, path, position, pool, entry_key)
        _store(path, result, entry_key, use_cache)
    return _with_warnings(result, cache.warnings()[seen:])


def _decoders(cores: int) -> int:
    """How many processes decode a big JSON file's blocks at once: as many as the memory budget holds
    (``budget.decoders``), at most ``cores``."""
    from pipebubble import budget
    from pipebubble.ingest.json import trace

    return budget.decoders(cores, budget.block_bytes(trace.BLOCK_BYTES))


def read_files(jobs: list[tuple[str, int]], use_cache: bool = True) -> list[FileResult]:
    """Several small files (``(path, position)`` each), each file's result as ``read_file`` gives it.
    Those the cache holds come from the cache; the other Chrome JSON traces are decoded one by one and
    their spans made by one plan for all (``chrome.read_batch``: a small file's fixed cost is its
    queries); any other file is read alone. A file that cannot be read fails the batch where
    ``read_file`` would: the files before it are read (and cached) first."""
    from pipebubble.ingest.json import chrome

    results: list[FileResult | None] = [None] * len(jobs)
    pending: list[tuple[int, str | None, list[str], Pending]] = []
    try:
        for k, (name, position) in enumerate(jobs):
            path, seen = Path(name), len(cache.warnings())
            result, entry_key, reader = _cached(path, use_cache)
            if result is None and not _batched(reader, path):
                result = _read_somewhere(reader, path, position, None, entry_key)
                _store(path, result, entry_key, use_cache)
            if result is not None:
                results[k] = _with_warnings(result, cache.warnings()[seen:])
                continue
            decoded = _decoded_alone(path, position)
            pending.append((k, entry_key, cache.warnings()[seen:], decoded))
    finally:
        for (k, entry_key, fresh, _), result in zip(pending, chrome.read_batch([p[-1] for p in pending]),
                                                    strict=True):
            seen = len(cache.warnings())
            _store(Path(jobs[k][0]), result, entry_key, use_cache)
            results[k] = _with_warnings(result, [*fresh, *cache.warnings()[seen:]])
    return [r for r in results if r is not None]


def _cached(path: Path, use_cache: bool) -> tuple[FileResult | None, str | None, readers.Reader]:
    """The file's valid cache entry (None: none, or not to be used), its cache key and its reader."""
    entry_key = cache.key(path)
    reader = readers.reader_for(path)
    result = cache.get(path, entry_key) if use_cache else None
    if result is not None and not result.meta.get("spill") and reader.spills(path):
        result = None  # held in memory under a bigger budget: read again within this one
    return result, entry_key, reader


def _store(path: Path, result: FileResult, entry_key: str | None, use_cache: bool) -> None:
    """A file just read into the cache, unless it changed while it was read."""
    if use_cache and entry_key is not None and cache.key(path) == entry_key:
        cache.put(path, result, entry_key)


def _with_warnings(result: FileResult, fresh: list[str]) -> FileResult:
    """The file's result on the one clock, with the cache's warnings raised while it was read."""
    return _on_clock(replace(result, warnings=[*result.warnings, *fresh]) if fresh else result)


def _batched(reader: readers.Reader, path: Path) -> bool:
    """Whether a file not in the cache is read with others (``read_files``): a Chrome JSON trace read in
    memory, without a work folder or a spill."""
    return reader.name == "json" and not reader.writes_files(path) and not reader.spills(path)


def _decoded_alone(path: Path, position: int) -> Pending:
    """A small Chrome JSON trace decoded (``chrome.decode_pending``), with ``read_one``'s errors."""
    from pipebubble.ingest.json import chrome

    try:
        return chrome.decode_pending(path, position)
    except OSError as exc:
        raise TraceFormatError(path, exc.strerror or str(exc)) from None


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
        return readers.reader_for(path).read(path, readers.Where(position, pool, cache.work_dir(), spill))
    except OSError as exc:
        raise TraceFormatError(path, exc.strerror or str(exc)) from None


def _read_somewhere(
    reader: readers.Reader, path: Path, position: int, pool: Executor | None, entry_key: str | None
) -> FileResult:
    """Read ``path`` with its spill and scratch in the cache; when writing there fails (a full or
    read-only volume), again in a temporary folder, then in memory. Only the trace's own errors are
    the trace's: a cache problem is a warning, never a TraceFormatError."""
    spills = reader.spills(path)
    writes = spills or reader.writes_files(path)
    tried: list[Path] = []
    while True:
        work = cache.work_dir() if writes else None
        if work in tried:  # never the same folder twice: memory is the last resort
            work = None
        tried.append(work)
        spill = None
        try:
            spill = cache.new_spill(work, entry_key) if spills and work is not None else None
            result = reader.read(path, readers.Where(position, pool, work, spill))
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


def spans_of(result: FileResult):
    """A file's whole span table, read back from its spill folder when it has one."""
    import polars as pl

    spill = result.meta.get("spill")
    return pl.read_parquet(Path(spill) / "*.parquet") if spill else result.spans


def _pool(workers: int) -> AbstractContextManager[Executor]:
    from pipebubble import executor

    cache.clean_at_exit()  # a worker's fallback cache folder outlives the worker: this process removes it
    return executor.pool(workers)


def may_need_a_pool(name: str) -> bool:
    """Whether a path given on the command line looks like work for a pool of processes: a folder of two
    trace files or more, or a file that might be decoded in blocks (``readers.may_split``). Asked first
    thing, before polars is loaded: a stat or two, and a guess (a wrong one costs an idle process)."""
    path = Path(name)
    try:
        if path.is_dir():
            with os.scandir(path) as entries:
                return len(list(islice((e for e in entries if _is_trace_name(Path(e.path))), 2))) == 2
        return readers.may_split(path)
    except OSError:
        return False


def _is_trace_name(path: Path) -> bool:
    # capture.json lies beside every capture's traces: passed over without a word.
    return (path.is_file() and path.name.endswith(readers.TRACE_SUFFIXES) and path.name != CAPTURE_METADATA
            and not _is_unfinished(path))


def _is_unfinished(path: Path) -> bool:
    """Hidden files and what `pipebubble capture` writes while it runs (a status file, a partial trace):
    a killed capture leaves them beside its traces, and they are not traces."""
    return path.name.startswith(".") or path.name.endswith(NOT_TRACES)
