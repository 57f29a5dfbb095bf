"""The one way into an analysis: paths and Options in, a Report out.

Every command (analyze, check, diff, export) and every test enters here, so they all see the same files,
the same clock and the same numbers. ``run`` finds the traces once, answers from the report cache when
the traces and options are unchanged, and otherwise maps each file (in this process, a local pool or on
Ray: ``Scale``) and reduces the parts. A saved JSON report (``analyze --format json -o``) is read back as
the Report it was. ``with_spans`` gives the export the report and the span table from one read, on the
same clock.

The room: ``mapper`` (one file to its part, wherever it runs), ``wire`` (a part as bytes between processes),
``reducer`` (the parts to the report, here), ``alignment`` (the reduce's first step: every file on one clock)
and ``_forkserver`` (what the pool's fork server loads before it forks a worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipebubble.options import Options, Scale
from pipebubble.report import Report, is_saved_report, read_saved_report

if TYPE_CHECKING:  # the cached path never loads polars
    import polars as pl

    from pipebubble.ingest.base import FileResult

OnFile = Callable[[str], None]


def run(paths: list[Path], options: Options = Options(), scale: Scale = Scale(), on_file: OnFile | None = None
        ) -> Report:
    """The report of the traces under ``paths`` (or of one saved JSON report)."""
    from pipebubble import budget

    with budget.used(scale.memory_budget):
        return _run(paths, options, scale, on_file)


def _run(paths: list[Path], options: Options, scale: Scale, on_file: OnFile | None) -> Report:
    from pipebubble.ingest import cache, find_traces

    if len(paths) == 1 and is_saved_report(paths[0]):
        _not_mapped(scale, f"{paths[0]} is a saved report: nothing to map")
        return read_saved_report(paths[0])
    files = find_traces(paths)
    key = cache.report_key(files, options.settings()) if scale.use_cache else None
    cached = _rebuilt(cache.get_report(key))
    if cached is not None:
        _not_mapped(scale, "the report came from the cache, nothing was mapped (--no-cache maps the files again)")
        return cached
    from pipebubble import executor

    executor.one_thread_each(len(files), scale)
    report = execute(files, replace(options, files=len(files)), scale, on_file)
    if key is not None:
        cache.put_report(key, report.to_dict())
    return report


def _not_mapped(scale: Scale, why: str) -> None:
    """Where ``scale`` asks for another executor than this process's, record ``why`` none was used
    (``executor.ran_here``; the local executor is not even loaded)."""
    if scale.executor != "local":
        from pipebubble import executor

        executor.ran_here(scale, why)


def execute(files: list[Path], options: Options, scale: Scale, on_file: OnFile | None = None) -> Report:
    """Map every trace file on ``scale``'s executor, then reduce here. The parts other processes map cross
    as bytes (``wire``); those mapped here are taken as they are."""
    from pipebubble import budget, executor
    from pipebubble.ingest import cache
    from pipebubble.run import wire
    from pipebubble.run.mapper import map_file, map_files
    from pipebubble.run.reducer import reduce

    cache.clean_at_exit()  # a worker's fallback cache folder outlives the worker: this process removes it
    jobs = [(str(f), i) for i, f in enumerate(files)]
    scale, processes = _within_budget(scale, len(files))
    with budget.shared(processes):
        parts = executor.each(
            jobs, map_file, scale, on_file, batch=map_files, wire=(wire.encode, wire.decode), options=options,
            use_cache=scale.use_cache
        )
    return reduce(parts, options)


def _within_budget(scale: Scale, files: int) -> tuple[Scale, int]:
    """``scale`` with no more local processes mapping files at once than the memory budget holds
    (``budget.mappers``), and how many there are: each maps within its share. A lone file is mapped by this
    process (its blocks decoded by as many as the budget holds: ``ingest.read_file``); Ray's workers are not
    this machine's."""
    import os

    from pipebubble import budget

    if scale.executor != "local" or files < 2:
        return scale, 1
    processes = budget.mappers(min(files, scale.workers or os.cpu_count() or 1))
    return replace(scale, workers=processes), processes


def _rebuilt(cached: dict | None) -> Report | None:
    """A cached report as a Report; None when it is absent or of a shape this version cannot rebuild (it is
    then computed afresh: a cache problem never fails an analysis)."""
    if cached is None:
        return None
    try:
        return Report.from_dict(cached)
    except Exception:  # noqa: BLE001 - any damage to a cache entry means "recompute"
        return None


def of_results(results: list[FileResult], options: Options = Options()) -> Report:
    """The report of files already read (e.g. span tables built in memory): the same map and reduce, in
    this process."""
    from pipebubble.run.mapper import map_spans
    from pipebubble.run.reducer import reduce

    options = replace(options, files=len(results))
    return reduce([map_spans(r, options) for r in results], options)


def with_spans(
    paths: list[Path], options: Options = Options(), scale: Scale = Scale(), on_file: OnFile | None = None
) -> tuple[Report, pl.DataFrame]:
    """The report and every span under ``paths`` on the clock the report's times use, from one read (the
    export draws both)."""
    from pipebubble import budget
    from pipebubble.ingest import load

    _not_mapped(scale, "export reads and maps the traces in this process and a local pool (Ray reads only big traces' "
                        "arguments and flows)")
    with budget.used(scale.memory_budget):
        ingested = load(paths, use_cache=scale.use_cache, workers=scale.workers, on_file=on_file)
    report = of_results(ingested.files, options)
    return report, on_job_clock(ingested.spans, report)


def on_job_clock(spans: pl.DataFrame, report: Report) -> pl.DataFrame:
    """``spans`` moved onto the clock the report's times use (each file by its ``ingest.clock_offsets``)."""
    import polars as pl

    moved = {o.source: o.offset_ns for o in report.ingest.clock_offsets if o.aligned and o.offset_ns}
    if not moved or spans.is_empty():
        return spans
    offset = pl.col("source").replace_strict(moved, default=0, return_dtype=pl.Int64)
    return spans.with_columns(start=pl.col("start") - offset, end=pl.col("end") - offset)
