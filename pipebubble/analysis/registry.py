"""The per-file analyses (the map side of ``run.mapper``), registered under one signature.

Each is ``f(spans, options, meta=None) -> part``: ``spans`` one file's span table (any subset of a job's
spans, possibly empty), ``options`` the job's ``Options`` and ``meta`` what the file says about the job
(its ingest ``FileResult.meta``: ``world_size``, ``pg_config``; None: nothing). Pure: no I/O, no printing;
every one returns its documented empty part for a table with nothing it can use, never raises for it
(``tests/analysis/test_analyses.py`` runs them all on the empty table and on one-span tables).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from pipebubble.analysis.breakdown import GpuPart, gpu_part
from pipebubble.analysis.breakdown.part import GpuInputs
from pipebubble.analysis.comm.collectives import NCCL_NVTX, collective_part, comm_ranges
from pipebubble.analysis.comm.p2p import p2p_part
from pipebubble.analysis.intervals import engine_for
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.lanes import lane_table
from pipebubble.analysis.pipeline.part import StagePart, stage_part, stage_parts
from pipebubble.analysis.rootcause.part import windows as arrival_windows
from pipebubble.analysis.serving.interference import interference
from pipebubble.analysis.serving.steps_inferred import DECODE_KERNELS, GRAPH_LAUNCH, STEP_FRAMES, TRAINING_KERNELS
from pipebubble.analysis.serving.steps_llm import LABEL_PATTERNS as STEP_LABELS
from pipebubble.options import Options
from pipebubble.report import Interference, Segment
from pipebubble.spans import COMM_NAMES, GPU_WORK

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


def stages_parts(spans: pl.DataFrame, options: Options, metas: dict[int, dict]) -> dict[int, StagePart | None]:
    """``stages_part`` of several files of one rank each at once (``spans``: theirs, concatenated; ``metas``:
    each rank's file's meta), by rank; the files it cannot map together (``pipeline.part.stage_parts``) are
    left out, to be mapped alone."""
    if options.files == 1:
        return {}
    groups = {rank: (meta or {}).get("pg_config") for rank, meta in metas.items()}
    return dict(stage_parts(spans, options.pipeline, groups))


def serving_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> tuple[Interference | None,
                                                                                     list[Segment]]:
    """Prefill/decode interference and per-step timeline segments; (None, []) without engine steps."""
    return interference(spans, step_regex=options.serving.step_regex, tbt_slo_ms=options.serving.tbt_slo_ms)


def serving_ranks(spans: pl.DataFrame, options: Options) -> set[int] | None:
    """Of several files of one rank each (``spans``: theirs, concatenated), the ranks whose spans show a sign
    of engine steps (``serving_part`` finds none in the others): a step label, or, where steps would be
    inferred (``steps_inferred``: no training kernel), an engine's step frame, a decode kernel or a graph
    launch. None with a custom step regex (every file is then looked at)."""
    if options.serving.step_regex:
        return None
    names = spans.lazy().select("rank", "kind", gpu=pl.col("device").is_not_null(), name="name").unique()
    cpu_range = (pl.col("kind") == "annotation") & ~pl.col("gpu")
    signs = names.group_by("rank").agg(
        label=(cpu_range & _named_like(regex for _, regex in STEP_LABELS)).any(),
        training=((pl.col("kind") == "kernel") & pl.col("name").str.contains(TRAINING_KERNELS)).any(),
        frame=(cpu_range & pl.col("name").str.contains(STEP_FRAMES)).any(),
        decode=((pl.col("kind").is_in(GPU_WORK) & pl.col("gpu") & pl.col("name").str.contains(DECODE_KERNELS))
                | ((pl.col("kind") == "runtime") & pl.col("name").str.contains(GRAPH_LAUNCH))).any(),
    )
    engine = pl.col("label") | (~pl.col("training") & (pl.col("frame") | pl.col("decode")))
    return set(signs.filter(engine).select("rank").collect(engine=engine_for(spans))["rank"].to_list())


def may_hold_steps(spans: pl.LazyFrame, options: Options) -> bool:
    """Whether ``serving_part`` of a table's annotations alone can find engine steps: some annotation's
    name is a step label (``--step-regex``'s, else the built-in ones) or an engine's step frame. Told from
    the distinct names, so a big table's annotations are read only when they may hold steps."""
    names = spans.filter(pl.col("kind") == "annotation").select(pl.col("name").unique())
    regexes = [options.serving.step_regex] if options.serving.step_regex else [
        *(regex for _, regex in STEP_LABELS), STEP_FRAMES]
    return bool(names.select(_named_like(regexes).any()).collect(engine=engine_for(spans)).item())


def _named_like(regexes) -> pl.Expr:
    """A span whose name any of ``regexes`` matches."""
    return pl.any_horizontal(pl.col("name").str.contains(regex) for regex in regexes)


def comm_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> CommPart:
    """The file's collective calls per participant, its send/recv counts (``collectives``), its
    point-to-point operations (``p2p``) and each arrival's window (``rootcause.part``); no rows without
    communication."""
    return comm_of(spans, step_regex=options.serving.step_regex)


def comm_of(spans: pl.DataFrame, windows: pl.DataFrame | None = None, step_regex: str | None = None) -> CommPart:
    """``comm_part`` of ``spans``; ``windows``: the participants' traced windows
    (``collectives.participant_windows``), when ``spans`` holds only a bigger table's ``comm_rows``: the
    arrivals' windows are then left empty (what a rank did before an arrival is not among those rows)."""
    ranges = comm_ranges(spans)  # read once for both: a regex over every CPU range of the file
    calls, facts = collective_part(spans, ranges, windows)
    p2p = p2p_part(spans, ranges)
    if windows is not None:
        return CommPart(calls, facts, p2p)
    return CommPart(calls, facts, p2p, arrival_windows(spans, calls, p2p, step_regex))


def comm_rows(spans: pl.LazyFrame) -> pl.DataFrame:
    """The rows of a big table that ``comm_part`` reads, and that ``stages_part`` reads of a file with no
    pipeline evidence (``pipeline.part.no_evidence``), in the table's order: ranges named like communication,
    annotations (labels), profiler steps, communication kernels and the calls that launched them, and the
    first row of each lane (what names the stages)."""
    kernels = (pl.col("kind") == "comm") & pl.col("device").is_not_null()
    ids = spans.filter(kernels & pl.col("correlation").is_not_null()).select(pl.col("correlation").unique())
    indexed = spans.with_row_index("_row")
    firsts = indexed.group_by("rank", "pid", "device", "stream", "lane").agg(pl.col("_row").min())
    ids, firsts = pl.collect_all([ids, firsts])
    ranges = pl.col("device").is_null() & pl.col("kind").is_in(["annotation", "cpu_op", "comm"])
    wanted = (
        kernels
        | pl.col("kind").is_in(["annotation", "step"])
        | (ranges & (pl.col("name").str.contains(COMM_NAMES) | pl.col("name").str.contains(NCCL_NVTX)))
        | ((pl.col("kind") == "runtime") & pl.col("correlation").is_in(ids["correlation"].implode()))
        | pl.col("_row").is_in(firsts["_row"].implode())
    )
    return indexed.filter(wanted).drop("_row").collect()


def breakdown_part(spans: pl.DataFrame, options: Options, meta: Meta = None) -> GpuPart:
    """Every GPU's time breakdown (whole window and per step) and the kernel and host summaries' partial
    sums (``breakdown``); no rows without GPU work."""
    return breakdown_with(spans, options, None)


def breakdown_with(spans: pl.DataFrame, options: Options, given: GpuInputs | None) -> GpuPart:
    """``breakdown_part``, given the table's ``breakdown.part.inputs`` (which the timeline strips read too)."""
    return gpu_part(spans, options.serving.step_regex, alone=options.files == 1, given=given)


#: name -> analysis, in the order ``run.mapper.map_spans`` runs them.
ANALYSES: dict[str, Callable[..., Any]] = {
    "lanes": lanes_part,
    "stages": stages_part,
    "serving": serving_part,
    "comm": comm_part,
    "breakdown": breakdown_part,
}
