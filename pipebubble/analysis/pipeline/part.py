"""The map side of the pipeline analysis: what one trace file contributes (its stages' labelled work and
host activity), computed where the file lies and reduced with the other files' by ``report``."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.idle.activity import host_kind
from pipebubble.analysis.intervals import ENGINE, engine_for, merge
from pipebubble.analysis.pipeline.labels import label_choices, label_names
from pipebubble.analysis.pipeline.stages import Worker, assign, pipeline_group
from pipebubble.analysis.pipeline.work import WORK_SCHEMA, labelled_work, stage_work
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
    workers: list[Worker] | None = None  # per name, its stage and replica, when the file holds several replicas


def stage_part(
    spans: pl.DataFrame,
    options: PipelineOptions,
    world: int | None = None,
    alone: bool = False,
    groups: list | None = None,
) -> StagePart | None:
    """Map: one file's (or any subset's) stage work. None when no span belongs to a stage, or when the file
    is ``alone`` (the whole job) and holds a single stage that is not known to be one stage of a pipeline
    (by micro-batch labels or its pipeline process group): no pipeline, so no work to label. Those checks
    read the distinct names, taken once."""
    explicit = _explicit(options)
    names = None if explicit else _distinct(spans)
    labelled = explicit or _one_stage_of_many(names, options, groups)
    if alone and not explicit and one_stage(names) and not labelled:
        return None
    if not labelled and not _ranks_sending(names):
        return _unlabelled(spans, options, world, groups)
    mapped = assign(spans, options.stages, world, groups)
    stages = mapped.spans["stage"].drop_nulls()
    if stages.is_empty():
        return None
    work, facts = stage_work(mapped.spans, options.stages.microbatch_regex)
    facts["ranks"] = _ranks_of(mapped.spans)
    cpu = mapped.spans.filter(
        pl.col("stage").is_not_null() & pl.col("device").is_null() & pl.col("kind").is_in(HOST_WORK)
    )
    return StagePart(mapped.names, mapped.order, work, merge(_as_blocking(cpu), ["stage", "kind"]), facts,
                     mapped.pipeline, mapped.workers)


def stage_parts(spans: pl.DataFrame, options: PipelineOptions, groups: dict[int, list | None]) -> dict[int, StagePart]:
    """Map, over the spans of several files of one rank each (no two of one rank; ``groups``: each rank's
    process groups): each file's ``stage_part`` (not ``alone``), computed once over all of them. Each file
    is one stage (its rank, or its place in its pipeline group), so its work is labelled with its rank as
    the stage, grouped by rank wherever a file alone would be (files whose labels follow different patterns
    apart), and split by rank. Files that are not one stage each (explicit stage options, several GPUs in
    one rank) are left out: the caller maps them alone. The distinct names, with the labels each pattern
    finds among them, are read once: for each rank's choice of pattern, sends and GPUs, and each group's
    labels."""
    if _explicit(options):
        return {}
    regex = options.stages.microbatch_regex
    names = label_names(spans, _DISTINCT, regex)
    choices, sends, gpus = label_choices(names, regex, names), _ranks_sending(names), _gpus(names)
    out: dict[int, StagePart] = {}
    together: dict[str | None, list[int]] = defaultdict(list)
    for rank, choice in choices.items():
        members = pipeline_group(groups.get(rank) or [], rank)
        if members is None and gpus.get(rank, 0) > 1:
            continue  # one stage per GPU: stages.assign's device rule, on the file alone
        if choice is None and members is None and rank not in sends:
            out[rank] = _unlabelled_rank(rank, spans.schema["kind"])
        else:
            together[choice].append(rank)
    for ranks in together.values():
        out |= _labelled_ranks(spans, ranks, regex, groups, names)
    return out


def _own_stage(rank: int, groups: list | None) -> tuple[list[str], list[tuple], int, int | None]:
    """A file of one rank as ``stages.assign`` names it alone: (names, order, its stage, pipeline)."""
    members = pipeline_group(groups or [], rank)
    if members is None:
        return [f"rank{rank}"], [((False, rank),)], 0, None
    return [f"pp{i}" for i in range(len(members))], [(i,) for i in range(len(members))], members.index(rank), \
        members[0]


def _unlabelled_rank(rank: int, kind: pl.DataType) -> StagePart:
    """``_unlabelled`` of a file of one rank on one GPU at most: its one stage's name, no work."""
    names, order, _, pipeline = _own_stage(rank, None)
    return StagePart(names, order, pl.DataFrame(schema=WORK_SCHEMA), _empty_host(kind), dict(_NO_EVIDENCE), pipeline)


def _labelled_ranks(spans: pl.DataFrame, ranks: list[int], regex: str | None, groups: dict,
                    labelled: pl.DataFrame) -> dict[int, StagePart]:
    """The stage parts of files whose labels follow one pattern: their work labelled at once, the rank as
    each one's stage, then split by rank and numbered as each file alone numbers its one stage (``labelled``:
    ``labels.label_names`` of ``spans`` by rank)."""
    own = {r: _own_stage(r, groups.get(r)) for r in ranks}
    if len(ranks) != len(spans["rank"].unique()):
        mine = pl.col("rank").is_in(ranks)
        spans, labelled = spans.filter(mine), labelled.filter(mine)
    staged = spans.with_columns(stage=pl.col("rank").cast(pl.Int32))
    work, pattern, gpu_stages = labelled_work(staged, regex, apart=True, names=labelled)
    cpu = staged.filter(pl.col("device").is_null() & pl.col("kind").is_in(HOST_WORK))
    local = {r: own[r][2] for r in ranks}
    works = _by_rank(work, local)
    hosts = _by_rank(merge(_as_blocking(cpu), ["stage", "kind"]), local)
    no_work, no_host = work.clear(), _empty_host(spans.schema["kind"])
    return {
        r: StagePart(names, order, works.get(r, no_work), hosts.get(r, no_host),
                     {"pattern": pattern, "inferred": pattern is None, "mode": "gpu" if r in gpu_stages else "cpu",
                      "ranks": {own[r][2]: r}},
                     pipeline)
        for r, (names, order, _, pipeline) in own.items()
    }


def _ranks_of(spans: pl.DataFrame) -> dict[int, int]:
    """Each stage's rank, where all its spans are of one and the ranks tell the stages apart (a file of
    several processes, one rank to the file, names no stage's rank)."""
    per = spans.lazy().filter(pl.col("stage").is_not_null() & pl.col("rank").is_not_null()).group_by("stage").agg(
        pl.col("rank").min().alias("rank"), pl.col("rank").n_unique().alias("n")).collect(engine=ENGINE)
    if per.height > 1 and per["rank"].n_unique() < per.height:
        return {}
    return {s: r for s, r, n in per.iter_rows() if n == 1}


def _by_rank(frame: pl.DataFrame, local: dict[int, int]) -> dict[int, pl.DataFrame]:
    """``frame``'s rows by the rank its ``stage`` holds, the stage renumbered to the file's own."""
    frame = frame.with_columns(
        stage=pl.col("stage").replace_strict(local, return_dtype=pl.Int32), _rank=pl.col("stage")
    )
    parts = frame.partition_by("_rank", maintain_order=True)
    return {part.drop_in_place("_rank")[0]: part for part in parts}


def _ranks_sending(spans: pl.DataFrame | pl.LazyFrame) -> set[int]:
    """The ranks whose CPU ranges name a send or receive (a rank of None where the trace names none)."""
    ranges = spans.lazy().filter(pl.col("device").is_null() & pl.col("kind").is_in(["cpu_op", "annotation", "comm"]))
    names = ranges.select("rank", "name").unique().filter(pl.col("name").str.contains(P2P_NAMES))
    return set(names.select(pl.col("rank").unique()).collect(engine=engine_for(spans))["rank"].to_list())


def _gpus(spans: pl.DataFrame) -> dict[int, int]:
    """GPUs (process, device) per rank."""
    gpu = spans.lazy().filter(pl.col("device").is_not_null())
    return dict(gpu.group_by("rank").agg(pl.struct("pid", "device").n_unique()).collect(engine=ENGINE).iter_rows())


def _as_blocking(cpu: pl.DataFrame) -> pl.DataFrame:
    """``cpu`` with the idle account's kinds (``idle.activity.host_kind``: a call that blocks on the GPU is a
    ``sync``, whatever its trace named it), so a stage's waits say sync where the breakdown does."""
    return cpu.with_columns(kind=host_kind().cast(cpu.schema["kind"]))


def _empty_host(kind: pl.DataType) -> pl.DataFrame:
    return pl.DataFrame(schema={"stage": pl.Int32, "kind": kind, "start": pl.Int64, "end": pl.Int64})


_NO_EVIDENCE = {"pattern": None, "inferred": False, "mode": "cpu", "no_evidence": True}


#: Point-to-point calls by name (a superset of the evidence ``collectives`` counts: there, those inside a
#: collective do not count).
P2P_NAMES = r"(?i)(^|[:_])i?(send|recv)\b|^(c10d::)?(send|recv_)|ncclSend|ncclRecv|^PP:\d+(SEND|RECV)_"


def _unlabelled(spans: pl.DataFrame, options: PipelineOptions, world: int | None, groups: list | None) -> StagePart:
    """A file that holds no pipeline evidence of its own (no labels, no pipeline group, no send or receive):
    its stages' names only, so the reduce can say how many ranks are not a pipeline, without the cost of
    labelling work no pipeline will use."""
    mapped = assign(_keys_frame(spans), options.stages, world, groups)
    work = pl.DataFrame(schema=WORK_SCHEMA)
    return StagePart(mapped.names, mapped.order, work, _empty_host(spans.schema["kind"]), dict(_NO_EVIDENCE),
                     mapped.pipeline, mapped.workers)


def _keys_frame(spans: pl.DataFrame) -> pl.DataFrame:
    """One span per distinct (rank, process, device, stream, lane): enough to name the stages."""
    return spans.unique(["rank", "pid", "device", "stream", "lane"], keep="first")


def holds_stages(spans: pl.DataFrame | pl.LazyFrame, options: PipelineOptions, groups: list | None) -> bool:
    """Whether a file that is the whole job can give a stage part (``stage_part`` with ``alone``): stage
    options, several ranks or GPUs, a pipeline process group, or micro-batch labels. Told from the distinct
    names, so a spilled table's scan is not read whole to tell."""
    if _explicit(options):
        return True
    names = _distinct(spans)
    return not one_stage(names) or _one_stage_of_many(names, options, groups)


def no_evidence(spans: pl.DataFrame | pl.LazyFrame, options: PipelineOptions, groups: list | None) -> bool:
    """Whether ``stage_part`` names the stages of this file (one of several) from its lanes alone: no stage
    options, micro-batch labels, pipeline group, send or receive. Told from the distinct names."""
    if _explicit(options):
        return False
    names = _distinct(spans)
    return not _one_stage_of_many(names, options, groups) and not _ranks_sending(names)


def _distinct(spans: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """The distinct ranks, kinds and names of ``spans`` with the GPU (pid, device) of GPU spans: all that
    ``one_stage``, ``_one_stage_of_many`` and ``_ranks_sending`` read, so a spilled table is read once for
    the three (a row per distinct name and rank: each query after runs on those)."""
    return spans.lazy().select(_DISTINCT).unique().collect(engine=engine_for(spans))


#: What ``_distinct`` keeps of each span.
_DISTINCT = ["rank", "kind", "name", "device", pl.when(pl.col("device").is_not_null()).then(pl.col("pid")).alias("pid")]


def _explicit(options: PipelineOptions) -> bool:
    """Stages the user gave (rules, ``--stage-by``, ``--pp-size``) rather than ones the trace must show."""
    return bool(options.stages.rules or options.stages.stage_by or options.stages.pp_size)


def _one_stage_of_many(spans: pl.DataFrame | pl.LazyFrame, options: PipelineOptions, groups: list | None) -> bool:
    """One rank that says it is a pipeline stage: it is in a pipeline process group, or its passes carry
    micro-batch labels. Told from the distinct ranks and names, so a spilled table's scan is not read whole."""
    ranks = spans.lazy().select(pl.col("rank").drop_nulls().unique()).collect()["rank"].to_list()
    if len(ranks) == 1 and pipeline_group(groups or [], ranks[0]) is not None:
        return True
    return any(label_choices(spans, options.stages.microbatch_regex).values())


def one_stage(spans: pl.DataFrame | pl.LazyFrame) -> bool:
    """One rank and at most one GPU: whatever the stage rule, a single stage (cheap to tell, unlike assigning)."""
    lazy = spans.lazy()
    ranks = lazy.select(pl.col("rank").n_unique()).collect().item()
    gpus = lazy.filter(pl.col("device").is_not_null()).select(pl.struct("pid", "device").n_unique()).collect().item()
    return ranks <= 1 and gpus <= 1
