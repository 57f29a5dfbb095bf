"""The reduce: the whole report from the files' parts (pure, in this process). Put the files on one clock
(``alignment``), number the stages across files, then the pipeline metrics, waits, collectives, timeline,
GPU time, memory, critical path, requests and, last, the findings over them.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import polars as pl

from pipebubble.analysis import breakdown as bd
from pipebubble.analysis.breakdown.strips import empty_bins, job_strips
from pipebubble.analysis.critical import median_path
from pipebubble.analysis.idle import top_rows
from pipebubble.analysis.job import reduce_job
from pipebubble.analysis.lanes import sort_lanes
from pipebubble.analysis.memory import memory_report
from pipebubble.analysis.requests import summarize as summarize_requests
from pipebubble.analysis.requests.part import RequestsPart
from pipebubble.options import Options
from pipebubble.report import CriticalPath, IngestSummary, Lane, Report, Requests, Strips
from pipebubble.run.mapper import FilePart


def reduce(parts: list[FilePart], options: Options) -> Report:
    """Reduce: the whole report from the files' parts (pure), with the cycle collector paused
    (``_collector_paused``)."""
    with _collector_paused():
        return _reduced(parts, options)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while the reduce runs, on again after if it was on. The reduce makes
    some 10^5 small objects that hold no cycles (schedule actions, segments, rows: freed as they are
    dropped), and each collection it set off walked them and every part held, an eighth of the reduce's
    time at 64 stages."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _reduced(parts: list[FilePart], options: Options) -> Report:
    """The whole report from the files' parts (``reduce``)."""
    from pipebubble.analysis.findings import findings  # the reduce's alone: not loaded by a worker
    from pipebubble.analysis.memory.fit import with_memory
    from pipebubble.errors import TraceFormatError
    from pipebubble.run.alignment import aligned

    summary = summarize(parts)
    if not summary.spans and not any(p.requests is not None for p in parts):
        text = ", ".join(f"{k} {v}" for k, v in summary.skipped.items()) or "none"
        raise TraceFormatError(
            ", ".join(summary.files), f"nothing to analyse: no event became a span (not spans: {text})"
        )
    parts, clocks, clock_notes = aligned(parts, options)
    summary = replace(summary, clock_offsets=clocks)
    lanes = sort_lanes(pl.concat([p.lanes for p in parts], how="vertical_relaxed"))
    job = reduce_job(
        [p.stages for p in parts if p.stages is not None],
        [p.comm for p in parts if p.comm is not None],
        [p.file.meta for p in parts],
        options.pipeline,
        [p.critical for p in parts if p.critical is not None],
    )
    section = job.section
    serving = max(parts, key=lambda p: (p.serving.steps or 0) if p.serving else 0)
    memory = memory_report([(p.memory, p.stages.names if p.stages else None, p.file.meta) for p in parts],
                           [s.name for s in sorted(section.stages, key=lambda s: s.stage)], section.pipeline)
    pipeline = section.pipeline
    if pipeline is not None:
        pipeline = with_memory(pipeline, memory, options.pipeline.memory_limit)
    unbinned = _unbinned(parts)
    report = Report(
        ingest=replace(summary, memory_events=memory.events if memory else 0),
        lanes=[Lane(**row) for row in lanes.iter_rows(named=True)],
        stages=section.stages,
        pipeline=pipeline,
        waits=job.waits,
        interference=serving.serving,
        timeline=section.timeline + serving.segments,
        collectives=job.collectives,
        notes=clock_notes + job.notes + unbinned,
        breakdown=[row for p in parts if p.gpu is not None for row in p.gpu.rows],
        kernels=bd.kernels([p.gpu for p in parts if p.gpu is not None]),
        host=bd.host([p.gpu for p in parts if p.gpu is not None]),
        memory=memory,
        strips=_strips([p.strips for p in parts if p.strips is not None]),
        critical_path=_with_median_segments(job.critical),
        requests=_requests([p.requests for p in parts if p.requests is not None]),
        idle=top_rows([p.gpu.idle for p in parts if p.gpu is not None]),
    )
    late = None if unbinned else job.late  # a spilled rank not read whole has no arrivals' windows
    return replace(report, findings=findings(report, options.pipeline.gpu_cost, late=late))


#: The note of a report some of whose traces were spilled and not read whole (``_map_spilled``).
UNBINNED = ("per-GPU timeline, critical path and why a rank is late: not computed for {} trace(s) spilled to disk "
            "(bigger than the memory budget; a late rank is named from the collectives alone)")


def _unbinned(parts: list[FilePart]) -> list[str]:
    """A note when spilled traces have no strips nor critical-path part (not read whole)."""
    count = sum(1 for p in parts if p.file.meta.get("spill") and p.strips is None)
    return [UNBINNED.format(count)] if count else []


def _strips(frames: list[pl.DataFrame]) -> Strips | None:
    """The job's timeline strips (one step per GPU), None without a GPU."""
    bins = pl.concat(frames, how="vertical_relaxed") if frames else empty_bins()
    return job_strips(bins) if bins.height else None


def _requests(parts: list[RequestsPart]) -> Requests | None:
    """The served requests of every file (OTLP, Jaeger or an engine's own events) with the engine steps and
    KV-cache events found beside them, on the job's clock."""
    if not parts:
        return None
    frames = {k: pl.concat([getattr(p, k) for p in parts], how="vertical_relaxed") for k in RequestsPart.FRAMES}
    return summarize_requests(frames["requests"], frames["steps"], frames["kv"])


def _with_median_segments(paths: list[CriticalPath]) -> list[CriticalPath]:
    """Every step's path, the segments kept on the median step's only (the others' shares stay whole)."""
    median = median_path(paths)
    return [p if p is median else replace(p, segments=[]) for p in paths]


def summarize(parts: list[FilePart]) -> IngestSummary:
    skipped: Counter[str] = Counter()
    for p in parts:
        skipped.update(p.file.skipped)
    return IngestSummary(
        files=[p.file.source for p in parts],
        events_read=sum(p.file.events_read for p in parts),
        spans=sum(p.file.meta.get("spans", 0) for p in parts),
        skipped=dict(sorted(skipped.items())),
        # A warning every file repeats (the cache's, raised once in each worker) is reported once.
        warnings=list(dict.fromkeys([w for p in parts for w in p.file.warnings] + _unaligned(parts))),
        formats={p.file.source: p.file.format for p in parts},
        unread_bytes=sum(p.file.meta.get("unread_bytes", 0) for p in parts),
    )


def _unaligned(parts: list[FilePart]) -> list[str]:
    """Nsight reports of several that could not be put on UTC (``nsys.unaligned``; the Nsight reader is
    loaded only for a job that has Nsight reports)."""
    if not any(p.file.format == "nsys" for p in parts):
        return []
    from pipebubble.ingest.nsys import unaligned

    return unaligned([p.file for p in parts])
