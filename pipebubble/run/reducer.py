"""The reduce, in this process: the run's side of it, then the job's. What was read (each file's account,
``summarize``), refused when nothing became a span; every file put on the job's one clock (``alignment``);
then ``analysis.job.reduce_job``, pure: each analysis's parts across files to the Report.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, replace

from pipebubble.analysis.job import reduce_job
from pipebubble.options import Options
from pipebubble.report import IngestSummary, Report
from pipebubble.report.ingest import completeness
from pipebubble.run.mapper import FilePart

#: What the job's reduce takes of each part: every analysis's field, not the file's account.
PARTS = tuple(f.name for f in fields(FilePart) if f.name != "file")


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
    from pipebubble.errors import TraceFormatError
    from pipebubble.run.alignment import aligned

    summary = summarize(parts)
    if not summary.spans and not any(p.requests is not None for p in parts):
        text = ", ".join(f"{k} {v}" for k, v in summary.skipped.items()) or "none"
        raise TraceFormatError(
            ", ".join(summary.files), f"nothing to analyse: no event became a span (not spans: {text})"
        )
    parts, clocks, clock_notes = aligned(parts, options)
    return reduce_job({name: [getattr(p, name) for p in parts] for name in PARTS}, [p.file.meta for p in parts],
                      options, replace(summary, clock_offsets=clocks), clock_notes)


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
        completeness=completeness([(p.file.source, p.file.meta) for p in parts], dict(skipped)),
    )


def _unaligned(parts: list[FilePart]) -> list[str]:
    """Nsight reports of several that could not be put on UTC (``nsys.unaligned``; the Nsight reader is
    loaded only for a job that has Nsight reports)."""
    if not any(p.file.format == "nsys" for p in parts):
        return []
    from pipebubble.ingest.nsys import unaligned

    return unaligned([p.file for p in parts])
