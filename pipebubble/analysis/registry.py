"""The per-file analyses (the map side of ``mapreduce``), registered under one signature.

Each is ``f(spans, options, meta=None) -> part``: ``spans`` one file's span table (any subset of a job's
spans, possibly empty), ``options`` the job's ``Options`` and ``meta`` what the file says about the job
(its ingest ``FileResult.meta``: ``world_size``, ``pg_config``; None: nothing). Pure: no I/O, no printing;
every one returns its documented empty part for a table with nothing it can use, never raises for it
(``tests/test_analyses.py`` runs them all on the empty table and on one-span tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from pipebubble.analysis.breakdown import GpuPart, gpu_part
from pipebubble.analysis.collectives import collective_part, comm_ranges
from pipebubble.analysis.interference import interference
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.lanes import lane_table
from pipebubble.analysis.p2p import p2p_part
from pipebubble.analysis.stage_part import StagePart, stage_part
from pipebubble.options import Options
from pipebubble.report import Interference, Segment

Meta = dict[str, Any] | None


def lanes_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> pl.DataFrame:
    """Busy and idle per lane (``lanes.LANE_COLUMNS``); no rows when no span is work."""
    return lane_table(spans)


def stages_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> StagePart | None:
    """The file's stages' labelled work; None when it holds no pipeline stage (or is the whole job and holds
    one stage). A file alone sees the job's size only from its metadata, so ``meta`` gives ``world_size``
    when ``options.world`` is unset and the file's process groups (``pg_config``)."""
    if not spans.height:
        return None
    meta = meta or {}
    world = options.world or meta.get("world_size")
    return stage_part(spans, options.pipeline, world, options.files == 1, meta.get("pg_config"))


def serving_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> tuple[Interference | None,
                                                                                     list[Segment]]:
    """Prefill/decode interference and per-step timeline segments; (None, []) without engine steps."""
    return interference(spans, step_regex=options.serving.step_regex, tbt_slo_ms=options.serving.tbt_slo_ms)


def comm_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> CommPart:
    """The file's collective calls per participant, its send/recv counts (``collectives``) and its
    point-to-point operations (``p2p``); no rows without communication."""
    ranges = comm_ranges(spans)  # read once for both: a regex over every CPU range of the file
    calls, facts = collective_part(spans, ranges)
    return CommPart(calls, facts, p2p_part(spans, ranges))


def breakdown_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> GpuPart:
    """Every GPU's time breakdown (whole window and per step) and the kernel and host summaries' partial
    sums (``breakdown``); no rows without GPU work."""
    return gpu_part(spans, options.serving.step_regex, alone=options.files == 1)


#: name -> analysis, in the order ``mapreduce.map_spans`` runs them.
ANALYSES: dict[str, Callable[..., Any]] = {
    "lanes": lanes_part,
    "stages": stages_part,
    "serving": serving_part,
    "comm": comm_part,
    "breakdown": breakdown_part,
}
