"""The what-if rows with memory: each row's predicted peak (its largest stage's, ``predict``) and whether it
fits the stages' devices (``--memory-limit``, else each GPU's capacity from the trace; unknown without
either), and the largest micro-batch count that fits at today's micro-batch size."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from pipebubble.analysis.memory.predict import inflight_max, predicted_peak
from pipebubble.analysis.schedule.schedules import SCHEDULES
from pipebubble.errors import StageSpecError
from pipebubble.report import Pipeline, Recommendation
from pipebubble.report.memory import Memory, MemoryStage

#: Micro-batch counts searched for the largest that fits.
MAX_MICROBATCHES = 4096

Peaks = list[tuple[MemoryStage, int]]


def with_memory(pipeline: Pipeline, memory: Memory | None, limit: int | None) -> Pipeline:
    """``pipeline`` with every recommendation's ``peak_memory_bytes`` and ``fits`` (null where memory was
    not measured, or the schedule measured is unknown, or no limit is known) and, where a limit is known, a
    note on the largest m that fits."""
    stages = [s for s in (memory.stages if memory else []) if s.per_microbatch_bytes is not None]
    if not stages or not pipeline.microbatches or pipeline.schedule not in SCHEDULES \
            or any(s.stage >= pipeline.stages for s in stages):
        return pipeline
    recs = [_row(r, stages, pipeline, limit) for r in pipeline.recommendations]
    return replace(pipeline, recommendations=recs, notes=[*pipeline.notes, *_largest(stages, pipeline, limit)])


def _fits(peaks: Peaks, limit: int | None) -> bool | None:
    limits = [limit if limit is not None else s.capacity_bytes for s, _ in peaks]
    if any(x is None for x in limits):
        return None
    return all(peak <= x for (_, peak), x in zip(peaks, limits, strict=True))


def _row(rec: Recommendation, stages: list[MemoryStage], pipeline: Pipeline, limit: int | None) -> Recommendation:
    """A row at the same global batch: the current one keeps the measured peaks; a rebalanced one (layers
    moved between stages) is predicted as the current schedule, its stages' memory as measured."""
    if rec.label.startswith(("current", "rebalanced")):
        peaks: Peaks | None = [(s, max(s.peak_bytes, s.outside_bytes or 0)) for s in stages]
    else:
        peaks = _predicted(stages, pipeline, rec.schedule, rec.microbatches, rec.chunks)
    if peaks is None:
        return rec
    return replace(rec, peak_memory_bytes=max(p for _, p in peaks), fits=_fits(peaks, limit))


def _predicted(stages: list[MemoryStage], pipeline: Pipeline, schedule: str, m: int, v: int,
               scale: Fraction | None = None) -> Peaks | None:
    """Each measured stage's predicted peak at (schedule, m, v): at the same global batch, or with
    ``scale``, at that ratio of a measured micro-batch's size; None where the schedule cannot run that
    shape."""
    measured = (pipeline.schedule, pipeline.microbatches, pipeline.chunks)
    try:
        return [(s, predicted_peak(s.static_bytes, s.peak_bytes, s.per_microbatch_bytes,
                                   s.kept_per_microbatch_bytes or 0, s.outside_bytes, s.stage, pipeline.stages,
                                   measured, (schedule, m, v), scale)) for s in stages]
    except StageSpecError:
        return None


def _largest(stages: list[MemoryStage], pipeline: Pipeline, limit: int | None) -> list[str]:
    """The largest m that fits with today's micro-batch size (the global batch grows with m), for the
    current schedule; said only where a limit is known for every stage."""
    if any((limit if limit is not None else s.capacity_bytes) is None for s in stages):
        return []
    name, m, v = pipeline.schedule, pipeline.microbatches, pipeline.chunks

    def fits(count: int) -> bool:
        peaks = _predicted(stages, pipeline, name, count, v, scale=Fraction(1))
        return peaks is not None and _fits(peaks, limit) is True

    if not fits(1):
        return [f"memory: even m=1 at today's micro-batch size is predicted not to fit ({name})"]
    if fits(MAX_MICROBATCHES):
        most = max(inflight_max(name, pipeline.stages, m, v))
        return [f"memory: every m up to {MAX_MICROBATCHES:,} fits at today's micro-batch size ({name} holds at "
                f"most {most} micro-batches a stage)"]
    low, high = 1, MAX_MICROBATCHES
    while high - low > 1:  # fits(low), not fits(high): at a fixed micro-batch size the peak grows with m
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return [f"memory: the largest m that fits at today's micro-batch size is {low:,} ({name}; m={m} measured)"]
