"""The map: one trace file, where it lies (this process, a pool worker or a Ray task), to its part.

Read the file (through the span cache), then run the registry's analyses over it (``analysis.registry``):
its lanes' busy/idle, its stages' labelled work and merged host activity, its serving steps, its collectives,
its GPU time, timeline strips, critical-path part, requests, memory and copies. Small rank files are mapped a batch
at a time (``map_together``: each analysis once over the batch, split by rank); a spilled one in windows
(``_map_spilled``). Parts mapped in another process travel as Arrow IPC tables in a msgpack envelope
(``wire``), never as Python objects; one mapped in this process is reduced as it is (``reducer``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import polars as pl

from pipebubble.analysis.breakdown import GpuPart
from pipebubble.analysis.critical import CriticalPart
from pipebubble.analysis.flops import FlopsPart
from pipebubble.analysis.intervals import ENGINE
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.launch import LaunchPart
from pipebubble.analysis.memory import MemoryPart
from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.analysis.registry import Given, parts_of, parts_together
from pipebubble.analysis.requests.part import RequestsPart
from pipebubble.ingest.base import FileResult
from pipebubble.options import Options
from pipebubble.report import Interference, Segment


@dataclass(frozen=True, kw_only=True)
class FilePart:
    """One file's contribution: its ingest account (no spans) and each registered analysis's part under its
    name (``registry.ANALYSES``; the serving analysis's pair as ``serving`` and ``segments``). None: not
    computed (a spilled file not read whole)."""

    file: FileResult
    lanes: pl.DataFrame
    stages: StagePart | None
    serving: Interference | None
    segments: list[Segment]
    comm: CommPart | None = None
    gpu: GpuPart | None = None
    strips: pl.DataFrame | None = None  # per GPU and step, binned (``breakdown.strips``)
    critical: CriticalPart | None = None
    requests: RequestsPart | None = None
    memory: MemoryPart | None = None
    memcpy: pl.DataFrame | None = None  # copies by lane, direction and host memory (``analysis/memcpy.py``)
    launch: LaunchPart | None = None  # GPU annotations, launch queues, launch delays
    flops: FlopsPart | None = None  # operators' FLOPs and the GPU time they launched (``analysis/flops``)


def map_spans(result: FileResult, options: Options) -> FilePart:
    """Map, given a file already read."""
    if result.meta.get("spill"):
        return _map_spilled(result, options)
    return _mapped(result, options)


def _mapped(result: FileResult, options: Options, known: dict | None = None) -> FilePart:
    """The part of a file in memory: every analysis's (``registry.parts_of``), those ``known`` as they are."""
    account = _account(result, {**result.meta, "spans": result.spans.height})
    return _file_part(account, parts_of(result.spans, options, _given(result), known))


def _given(result: FileResult) -> Given:
    return Given(result.meta, result.memory, result.requests, result.request_steps)


def _account(result: FileResult, meta: dict) -> FileResult:
    """What the reduce keeps of the file read: its account, without spans and tables."""
    return replace(result, spans=result.spans.clear(), meta=meta, memory=None, requests=None,
                   request_steps=None)


def _file_part(account: FileResult, parts: dict[str, Any]) -> FilePart:
    serving, segments = parts.pop("serving")
    return FilePart(file=account, serving=serving, segments=segments, **parts)


def map_together(results: list[FileResult], options: Options) -> list[FilePart]:
    """Map several files already read, each file's part as ``map_spans`` makes it. Files of one rank each,
    no two of the same rank, are mapped at once (``registry.parts_together``: lanes, collectives, breakdown,
    strips, critical-path part and stage part computed once over all their spans, which group by lane and by
    rank, so each file's rows are what it gives alone, then split by rank; the job-wide sums go with the
    first of them; serving steps and requests looked for only in the files that may hold them). Other files
    (spilled, rankless, a rank twice, a lane name another file has too) are mapped alone."""
    ranks = [_only_rank(r) for r in results]
    counts = Counter(ranks)
    together = [k for k, rank in enumerate(ranks) if rank is not None and counts[rank] == 1]
    parts: list[FilePart | None] = [None] * len(results)
    if len(together) > 1:
        spans = pl.concat([results[k].spans for k in together], how="vertical")
        shared = _sharing_lanes(spans)
        if shared:
            together = [k for k in together if ranks[k] not in shared]
            spans = spans.filter(~pl.col("rank").is_in(list(shared)))
    if len(together) > 1:
        shares = parts_together(spans, options, {ranks[k]: _given(results[k]) for k in together})
        for k in together:
            parts[k] = _mapped(results[k], options, shares[ranks[k]])
    return [part if part is not None else map_spans(r, options) for part, r in zip(parts, results, strict=True)]


def _sharing_lanes(spans: pl.DataFrame) -> set[int]:
    """The ranks with a lane name another rank has too (lane names that do not carry the rank would merge)."""
    ranks = spans.lazy().group_by("lane").agg(pl.col("rank").unique()).filter(pl.col("rank").list.len() > 1)
    return set(ranks.select(pl.col("rank").explode()).collect(engine=ENGINE)["rank"].to_list())


def _only_rank(result: FileResult) -> int | None:
    """The one rank every span of an in-memory table names (None: spilled, empty, rankless or several)."""
    spans = result.spans
    if result.meta.get("spill") or not spans.height or spans["rank"].null_count():
        return None
    return int(spans["rank"][0]) if spans["rank"].n_unique() == 1 else None


#: What a spilled table not read whole leaves out: its serving steps, strips, critical-path part, requests and
#: launch part (GPU annotations, launch queues, launch delays).
_LEAN = {"serving": (None, []), "strips": None, "critical": None, "requests": None, "launch": None,
         "flops": None}


def _map_spilled(result: FileResult, options: Options) -> FilePart:
    """A span table too big for memory, in Parquet files. Its lanes and GPU breakdown are computed first, in
    time windows of the memory budget's size (``budget.rows_per_window``, shared by the two, which run side by
    side). Then the registry's other analyses, over:

    - nothing more, for a file that is the whole job and can hold no stage (``pipeline.part.holds_stages``) nor
      engine steps: its memory part alone, from the scan;
    - its communication rows only (``registry.comm_rows``), for a rank of a job that holds no pipeline
      evidence (``pipeline.part.no_evidence``) nor sign of engine steps (``registry.serving_ranks``): a data-,
      fully sharded or expert-parallel rank: its collectives, stage part and memory;
    - the table whole, otherwise (a pipeline stage, an engine's trace), where the memory budget holds it
      (``budget.whole_read``; else a BudgetError says the least budget that does)."""
    from concurrent.futures import ThreadPoolExecutor

    from pipebubble import budget
    from pipebubble.analysis.comm.collectives import participant_windows
    from pipebubble.analysis.lanes import lane_table_windowed
    from pipebubble.analysis.memcpy import memcpy_part
    from pipebubble.analysis.pipeline.part import holds_stages, no_evidence
    from pipebubble.analysis.registry import comm_of, comm_rows, may_hold_steps, serving_part, serving_ranks

    scan = pl.scan_parquet(Path(result.meta["spill"]) / "*.parquet")
    alone = options.files == 1
    rows, groups = budget.rows_per_window(), result.meta.get("pg_config")

    def lean() -> bool:
        """Whether the parts left need no more than nothing (a file alone: no engine steps among its
        annotations, no stage) or the communication rows (several files: ``serving_ranks`` tells)."""
        if alone:
            annotations = scan.filter(pl.col("kind") == "annotation")
            if may_hold_steps(scan, options) and serving_part(annotations.collect(), options)[0] is not None:
                return False
            return not holds_stages(scan, options.pipeline, groups)
        return no_evidence(scan, options.pipeline, groups) and serving_ranks(scan, options) == set()

    with ThreadPoolExecutor(1) as thread:  # each pass alone leaves a core idle much of the time
        lanes = thread.submit(lane_table_windowed, scan, rows // 2)
        told = thread.submit(lean)  # after the lanes, beside the breakdown
        gpu, warning = _breakdown_windowed(scan, Path(result.meta["spill"]), options, rows // 2)
        lanes, lean_enough = lanes.result(), told.result()
    if warning:
        result = replace(result, warnings=[*result.warnings, warning])
    known: dict[str, Any] = {"lanes": lanes, "gpu": gpu, "memcpy": memcpy_part(scan, options)}  # a streamed sum
    if lean_enough and alone:
        spans, known = scan, {**known, **_LEAN, "stages": None, "comm": None}
    elif lean_enough:
        spans = comm_rows(scan)  # every profiler step among them too, which the memory part reads
        known = {**known, **_LEAN, "comm": comm_of(spans, participant_windows(scan))}
    else:  # within the budget, or refused saying the least budget that holds it
        budget.whole_read(int(result.meta.get("spans") or 0), f"{result.source} may hold pipeline stages or engine "
                          "steps: their analysis")
        spans = scan.collect()
    return _file_part(_account(result, result.meta), parts_of(spans, options, _given(result), known))


def _breakdown_windowed(scan: pl.LazyFrame, spill: Path, options: Options, rows: int) -> tuple[GpuPart, str | None]:
    """The GPU breakdown of the spilled table ``scan``, its narrow copies written to a private scratch folder
    beside its spill folder (removed after, or by the next read if this one dies). Where that folder cannot
    be written (a full or read-only volume), the copies are held in memory instead, with a warning: a cache
    problem never fails an analysis. A table whose GPU operations and launching calls fit one window writes
    none: one read holds them (``windows.held``)."""
    from pipebubble.analysis.breakdown.windows import gpu_part_windowed, held, narrow, narrow_rows
    from pipebubble.ingest.cache import discard, disk_error, new_spill

    if narrow_rows(scan) <= rows:
        ops, launches, gpu = held(scan)
        return gpu_part_windowed(scan, ops, launches, options.serving.step_regex, options.files == 1, rows, gpu), None
    work, scratch, warning = spill.parent.parent, None, None
    try:
        scratch = new_spill(work, None)
        tables = []
        for name, query in zip(("ops", "launches"), narrow(scan), strict=True):
            query.sink_parquet(scratch / f"{name}.parquet")
            tables.append(pl.scan_parquet(scratch / f"{name}.parquet"))
    except Exception as exc:
        reason = disk_error(exc, work)
        if reason is None:
            raise
        warning = f"{work}: {reason}; the GPU breakdown's narrow copies held in memory instead"
        tables = [query.collect().lazy() for query in narrow(scan)]
    try:
        gpu = gpu_part_windowed(scan, *tables, options.serving.step_regex, options.files == 1, rows,
                                scratch=scratch)
    finally:
        if scratch is not None:
            discard(scratch)
    return gpu, warning


def map_file(path: str, position: int, options: Options, use_cache: bool = True, workers: int = 1) -> FilePart:
    """Map one file: read ``path`` where it lies (a big JSON file on ``workers`` processes) and return its
    part. ``read_file`` puts every file on the one clock, so files mapped apart line up."""
    from pipebubble.ingest import read_file

    result = read_file(Path(path), position, use_cache, workers)
    return map_spans(result, options)


def map_files(jobs: list[tuple[str, int]], options: Options, use_cache: bool = True) -> list[FilePart]:
    """Map several small files at once (``map_together``): each file's part."""
    from pipebubble.ingest import read_files

    return map_together(read_files(jobs, use_cache), options)
