"""GPU annotations, the launch queue per stream and operators' launch delays (``report.launches``' definitions):
the map's part of one file (``launch_part``: ``annotations``, ``queue``, ``delays``) and the reduce of every
file's (``summary``).

All three follow GPU work back to the host call that launched it, through the breakdown's launch join
(``breakdown.part.GpuInputs``: each operation's earliest launching call); the annotations read the span table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipebubble.analysis.breakdown.part import GpuInputs
from pipebubble.analysis.breakdown.part import inputs as gpu_inputs
from pipebubble.analysis.launch import annotated, delays, queue


def _empty(schema: dict) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


@dataclass(frozen=True)
class LaunchPart:
    """One file's part: its GPU annotations by name (``annotated.NAMES``) and the operations within them
    by name (``annotated.KERNELS``), each GPU stream's launch queue summarised (``queue.SUMMARY``), and the
    launch delays per operator (``delays.SUMS``, with their value counts, ``delays.COUNTS``, when files are
    combined). No instants: nothing to move onto the job's clock."""

    annotations: pl.DataFrame = field(default_factory=lambda: _empty(annotated.NAMES))
    kernels: pl.DataFrame = field(default_factory=lambda: _empty(annotated.KERNELS))
    queue: pl.DataFrame = field(default_factory=lambda: _empty(queue.SUMMARY))
    delays: pl.DataFrame = field(default_factory=lambda: _empty(delays.SUMS))
    delay_counts: pl.DataFrame = field(default_factory=lambda: _empty(delays.COUNTS))

    FRAMES = ("annotations", "kernels", "queue", "delays", "delay_counts")


def launch_part(spans: pl.DataFrame, step_regex: str | None = None, alone: bool = False,
                given: GpuInputs | None = None) -> LaunchPart:
    """The ``LaunchPart`` of ``spans`` (``given``: its ``GpuInputs``, where the caller has them); ``alone``: the
    file is the whole job (no value counts)."""
    names, kernels = annotated.annotations(spans)
    given = given or gpu_inputs(spans, step_regex)
    if not given.launch.height:
        return LaunchPart(names, kernels)
    ops = launched_ops(given)
    sums, counts = delays.sums(delays.launched(ops, given.cpu.lazy()), counted=not alone)
    found = pl.collect_all([queue.summary(ops), sums, counts])
    return LaunchPart(names, kernels, *found)


def launched_ops(given: GpuInputs) -> pl.LazyFrame:
    """Every launched GPU operation: lane, rank, stream, start, end and its call's at_lane, at."""
    ops = given.gpu.lazy().select("row", "lane", "rank", "stream", "start", "end")
    return ops.join(given.launch.lazy().select("row", "at_lane", "at"), on="row")


def queue_series(spans: pl.DataFrame) -> pl.DataFrame:
    """Each GPU stream's launch queue as it changes (``queue.SERIES``: one row per change), for a notebook."""
    return queue.series(launched_ops(gpu_inputs(spans))).collect()
