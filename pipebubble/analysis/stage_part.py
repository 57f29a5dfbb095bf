"""The map side of the pipeline analysis: what one trace file contributes (its stages' labelled work and
host activity), computed where the file lies and reduced with the other files' by ``pipeline_report``."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.intervals import merge
from pipebubble.analysis.labels import labels
from pipebubble.analysis.stages import assign, pipeline_group
from pipebubble.analysis.work import WORK_SCHEMA, stage_work
from pipebubble.options import PipelineOptions
from pipebubble.spans import HOST_WORK


@dataclass(frozen=True)
class StagePart:
    """What one trace file contributes to the pipeline analysis (the map side): its stages' labelled work,
    their host activity (merged), the stages' names with sort keys, and how passes were labelled."""

    names: list[str]
    order: list[tuple]
    work: pl.DataFrame  # WORK_COLUMNS; ``stage`` indexes ``names``
    host: pl.DataFrame  # stage, kind, start, end: merged CPU activity per stage and kind
    facts: dict
    pipeline: int | None = None  # the pipeline group (its lowest rank), when stages came from one


def stage_part(
    spans: pl.DataFrame,
    options: PipelineOptions,
    world: int | None = None,
    alone: bool = False,
    groups: list | None = None,
) -> StagePart | None:
    """Map: one file's (or any subset's) stage work. None when no span belongs to a stage, or when the file
    is ``alone`` (the whole job) and holds a single stage that is not known to be one stage of a pipeline
    (by micro-batch labels or its pipeline process group): no pipeline, so no work to label."""
    explicit = options.stages.rules or options.stages.stage_by or options.stages.pp_size
    labelled = explicit or _one_stage_of_many(spans, options, groups)
    if alone and not explicit and one_stage(spans) and not labelled:
        return None
    if not labelled and not _sends_or_receives(spans):
        return _unlabelled(spans, options, world, groups)
    mapped = assign(spans, options.stages, world, groups)
    stages = mapped.spans["stage"].drop_nulls()
    if stages.is_empty():
        return None
    work, facts = stage_work(mapped.spans, options.stages.microbatch_regex)
    cpu = mapped.spans.filter(
        pl.col("stage").is_not_null() & pl.col("device").is_null() & pl.col("kind").is_in(HOST_WORK)
    )
    return StagePart(mapped.names, mapped.order, work, merge(cpu, ["stage", "kind"]), facts, mapped.pipeline)


#: Point-to-point calls by name (a superset of the evidence ``collectives`` counts: there, those inside a
#: collective do not count).
P2P_NAMES = r"(?i)(^|[:_])i?(send|recv)\b|^(c10d::)?(send|recv_)|ncclSend|ncclRecv|^PP:\d+(SEND|RECV)_"


def _sends_or_receives(spans: pl.DataFrame) -> bool:
    ranges = spans.filter(pl.col("device").is_null() & pl.col("kind").is_in(["cpu_op", "annotation", "comm"]))
    return bool(ranges.select(pl.col("name").str.contains(P2P_NAMES).any()).item())


def _unlabelled(spans: pl.DataFrame, options: PipelineOptions, world: int | None, groups: list | None) -> StagePart:
    """A file that holds no pipeline evidence of its own (no labels, no pipeline group, no send or receive):
    its stages' names only, so the reduce can say how many ranks are not a pipeline, without the cost of
    labelling work no pipeline will use."""
    mapped = assign(_keys_frame(spans), options.stages, world, groups)
    work = pl.DataFrame(schema=WORK_SCHEMA)
    host = pl.DataFrame(schema={"stage": pl.Int32, "kind": spans.schema["kind"], "start": pl.Int64, "end": pl.Int64})
    facts = {"pattern": None, "inferred": False, "mode": "cpu", "no_evidence": True}
    return StagePart(mapped.names, mapped.order, work, host, facts, mapped.pipeline)


def _keys_frame(spans: pl.DataFrame) -> pl.DataFrame:
    """One span per distinct (rank, process, device, stream, lane): enough to name the stages."""
    return spans.unique(["rank", "pid", "device", "stream", "lane"], keep="first")


def _one_stage_of_many(spans: pl.DataFrame, options: PipelineOptions, groups: list | None) -> bool:
    """One rank that says it is a pipeline stage: its passes carry micro-batch labels, or it is in a
    pipeline process group."""
    ranks = spans["rank"].drop_nulls().unique().to_list()
    if len(ranks) == 1 and pipeline_group(groups or [], ranks[0]) is not None:
        return True
    return labels(spans, options.stages.microbatch_regex)[1] is not None


def one_stage(spans: pl.DataFrame | pl.LazyFrame) -> bool:
    """One rank and at most one GPU: whatever the stage rule, a single stage (cheap to tell, unlike assigning)."""
    lazy = spans.lazy()
    ranks = lazy.select(pl.col("rank").n_unique()).collect().item()
    gpus = lazy.filter(pl.col("device").is_not_null()).select(pl.struct("pid", "device").n_unique()).collect().item()
    return ranks <= 1 and gpus <= 1
