"""The map: one trace file, where it lies (this process, a pool worker or a Ray task), to its part.

Read the file (through the span cache), then reduce it to what the report needs from it: its lanes'
busy/idle, its stages' labelled work and merged host activity, its serving steps, its collectives, its GPU
time, memory, timeline strips, critical-path part and requests. Parts mapped in another process travel as
Arrow IPC tables in a msgpack envelope (``wire``), never as Python objects; one mapped in this process is
reduced as it is (``reducer``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from pipebubble.analysis.breakdown import GpuPart
from pipebubble.analysis.breakdown.part import inputs as gpu_inputs
from pipebubble.analysis.breakdown.strips import empty_bins, strip_bins
from pipebubble.analysis.critical import CriticalPart, critical_part
from pipebubble.analysis.intervals import ENGINE
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.memory import MemoryPart, memory_part
from pipebubble.analysis.pipeline.part import StagePart
from pipebubble.analysis.registry import (
    breakdown_with,
    comm_part,
    lanes_part,
    serving_part,
    serving_ranks,
    stages_part,
    stages_parts,
)
from pipebubble.analysis.requests.part import RequestsPart, has_request_events, requests_part
from pipebubble.ingest.base import FileResult
from pipebubble.options import Options
from pipebubble.report import Interference, Segment


@dataclass(frozen=True)
class FilePart:
    """One file's contribution: its ingest account (no spans), lanes, stage part and serving steps."""

    file: FileResult
    lanes: pl.DataFrame
    stages: StagePart | None
    serving: Interference | None
    segments: list[Segment]
    comm: CommPart | None = None
    gpu: GpuPart | None = None
    memory: MemoryPart | None = None
    strips: pl.DataFrame | None = None  # per GPU and step, binned (``breakdown.strips``)
    critical: CriticalPart | None = None
    requests: RequestsPart | None = None


def map_spans(result: FileResult, options: Options) -> FilePart:
    """Map, given a file already read."""
    if result.meta.get("spill"):
        return _map_spilled(result, options)
    spans = result.spans
    given = gpu_inputs(spans, options.serving.step_regex)  # read by the breakdown and the strips both
    return _part(result, options, lanes_part(spans, options), comm_part(spans, options),
                 breakdown_with(spans, options, given),
                 strips=strip_bins(spans, options.serving.step_regex, given=given),
                 critical=critical_part(spans, options.serving.step_regex, given.steps))


#: Not computed yet: ``_part`` computes it from the file's spans.
_ALONE = object()


def _part(result: FileResult, options: Options, lanes: pl.DataFrame, comm: CommPart, gpu: GpuPart,
          stages=_ALONE, serving=_ALONE, strips=_ALONE, critical=_ALONE, requests=_ALONE) -> FilePart:
    """The file's part, its lanes, collectives and breakdown given: its stages and serving steps added (those
    not given computed from its spans)."""
    spans = result.spans
    part = stages_part(spans, options, result.meta) if stages is _ALONE else stages
    steps, segments = serving_part(spans, options, result.meta) if serving is _ALONE else serving
    account = FileResult(
        result.source,
        spans.clear(),
        result.events_read,
        result.skipped,
        result.warnings,
        {**result.meta, "spans": spans.height},
        result.format,
    )
    regex = options.serving.step_regex
    strips = strip_bins(spans, regex) if strips is _ALONE else strips
    critical = critical_part(spans, regex) if critical is _ALONE else critical
    requests = requests_part(result.requests, spans, regex) if requests is _ALONE else requests
    return FilePart(account, lanes, part, steps, segments, comm, gpu, _memory(result, spans, part), strips, critical,
                    requests)


def _memory(result: FileResult, spans: pl.DataFrame | pl.LazyFrame, stages: StagePart | None) -> MemoryPart | None:
    """The file's memory part (``analysis.memory``): its allocator events with its profiler steps and its
    stages' passes; None without allocator events."""
    if result.memory is None:
        return None
    steps = spans.filter(pl.col("kind") == "step").select("lane", "name", "start", "end")
    steps = steps.collect() if isinstance(steps, pl.LazyFrame) else steps
    return memory_part(result.memory, steps, None if stages is None else stages.work)


def map_together(results: list[FileResult], options: Options) -> list[FilePart]:
    """Map several files already read, each file's part as ``map_spans`` makes it. Files of one rank each,
    no two of the same rank, have their lanes, collectives, breakdown and stage part computed once over all
    their spans (those group by lane and by rank, so each file's rows are what it gives alone) and split by
    rank; the job-wide sums (kernel and host summaries, point-to-point counts, step lengths) go with the
    first of them. Their serving steps are looked for only in the files that show a sign of an engine.
    Other files (spilled, rankless, a rank twice, a lane name another file has too) are mapped alone."""
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
        given = gpu_inputs(spans, options.serving.step_regex)  # read by the breakdown and the strips both
        lanes, comm = lanes_part(spans, options), comm_part(spans, options)
        gpu = breakdown_with(spans, options, given)
        stages = stages_parts(spans, options, {ranks[k]: results[k].meta for k in together})
        engines = serving_ranks(spans, options)
        lane_rows, calls, p2p = _by(lanes, "rank"), _by(comm.calls, "who"), _by(comm.p2p, "who")
        windows, idle = _by(comm.windows, "who"), _by(gpu.idle, "rank")
        strips, critical = _by(strip_bins(spans, options.serving.step_regex, given=given), "rank"), critical_part(
            spans, options.serving.step_regex, given.steps)
        critical_of = critical.by_participant()
        served = has_request_events(spans)  # looked for once over the batch, not once a file
        no_bins = empty_bins()
        for n, k in enumerate(together):
            rank, first = ranks[k], n == 0
            parts[k] = _part(
                results[k], options, lane_rows.get(rank, lanes.clear()),
                CommPart(calls.get(rank, comm.calls.clear()),
                         comm.facts if first else {"p2p_send": 0, "p2p_recv": 0, "step_ns": []},
                         p2p.get(rank, comm.p2p.clear()), windows.get(rank, comm.windows.clear())),
                _gpu_share(gpu, rank, first, idle.get(rank)), stages.get(rank, _ALONE),
                _ALONE if engines is None or rank in engines else (None, []),
                strips.get(rank, no_bins),
                critical_of.get(rank, critical.cleared()),
                _ALONE if served or results[k].requests is not None else None,
            )
    return [part if part is not None else map_spans(r, options) for part, r in zip(parts, results, strict=True)]


def _sharing_lanes(spans: pl.DataFrame) -> set[int]:
    """The ranks with a lane name another rank has too (lane names that do not carry the rank would merge)."""
    ranks = spans.lazy().group_by("lane").agg(pl.col("rank").unique()).filter(pl.col("rank").list.len() > 1)
    return set(ranks.select(pl.col("rank").explode()).collect(engine=ENGINE)["rank"].to_list())


def _by(frame: pl.DataFrame, column: str) -> dict:
    """``frame``'s rows by the value of ``column``, in their order (one pass, not a filter per value)."""
    if column not in frame.columns:
        return {}
    return {rows[column][0]: rows for rows in frame.partition_by(column, maintain_order=True)}


def _only_rank(result: FileResult) -> int | None:
    """The one rank every span of an in-memory table names (None: spilled, empty, rankless or several)."""
    spans = result.spans
    if result.meta.get("spill") or not spans.height or spans["rank"].null_count():
        return None
    return int(spans["rank"][0]) if spans["rank"].n_unique() == 1 else None


def _gpu_share(gpu: GpuPart, rank: int, first: bool, idle: pl.DataFrame | None) -> GpuPart:
    """One rank's breakdown rows and idle account (``idle``: its rows of the batch's); the summaries' partial
    sums with the first file, empty with the others."""
    rows = [row for row in gpu.rows if row.rank == rank]
    idle = gpu.idle.clear() if idle is None else idle
    if first:
        return replace(gpu, rows=rows, idle=idle)
    frames = {k: getattr(gpu, k).clear() for k in GpuPart.FRAMES}
    return GpuPart(rows, delay={"count": 0, "total": 0, "max": None, "median": None}, short=0,
                   **{**frames, "idle": idle})


def _map_spilled(result: FileResult, options: Options) -> FilePart:
    """A span table too big for memory, in Parquet files. Its lanes and GPU breakdown are computed first, in
    time windows of the memory budget's size (``budget.rows_per_window``, shared by the two, which run side by
    side). Then what its stage, collective and serving parts need:

    - nothing more, for a file that is the whole job and can hold no stage (``pipeline.part.holds_stages``) nor
      engine steps;
    - its communication rows only (``registry.comm_rows``), for a rank of a job that holds no pipeline
      evidence (``pipeline.part.no_evidence``) nor sign of engine steps (``registry.serving_ranks``): a data-,
      fully sharded or expert-parallel rank;
    - the table whole, otherwise (a pipeline stage, an engine's trace)."""
    from concurrent.futures import ThreadPoolExecutor

    from pipebubble import budget
    from pipebubble.analysis.comm.collectives import participant_windows
    from pipebubble.analysis.lanes import lane_table_windowed
    from pipebubble.analysis.pipeline.part import holds_stages, no_evidence
    from pipebubble.analysis.registry import comm_of, comm_rows, may_hold_steps, serving_ranks

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
    account = replace(result, spans=result.spans.clear(), memory=None, requests=None)
    if alone and lean_enough:
        return FilePart(account, lanes, None, None, [], None, gpu, _memory(result, scan, None))
    if not alone and lean_enough:
        spans = comm_rows(scan)
        comm = comm_of(spans, participant_windows(scan))
        part = stages_part(spans, options, result.meta)
        return FilePart(account, lanes, part, None, [], comm, gpu, _memory(result, scan, part))
    spans = scan.collect()
    part = _part(replace(result, spans=spans, meta={**result.meta, "spill": None}), options, lanes,
                 comm_part(spans, options), gpu)
    return replace(part, file=replace(part.file, meta=result.meta))


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
        gpu = gpu_part_windowed(scan, *tables, options.serving.step_regex, options.files == 1, rows)
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
