"""Who is a stage.

A folder of per-rank traces gives one stage per rank in rank order (``--pp-size`` with a rank order covers
Megatron-style layouts where only some ranks differ in pipeline rank); one file holding several GPU
processes (Nsight) gives one stage per GPU in device order; ``--stage-by`` and ``--stage NAME=REGEX`` (on lane
ids) override; a rank's pipeline process group (Kineto ``distributedInfo.pg_config``) gives its stage
directly; one file of several CPU processes that each hold micro-batch labels (MegaScan's merged trace) gives
one stage per process in pid order; threads named for their pipeline rank (Megatron's step timers) are that
stage. ``--stage-by thread`` makes each CPU thread that runs a stage's work a stage (one thread per stage,
in one process or several), and GPU work follows the thread that launched it. Labels that name their stage
(PiPPy's ``F_{stage},{mb}``) make each thread holding them that stage with no flag. Which span is which
micro-batch pass is ``labels.py``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from pipebubble.analysis.launches import with_launch
from pipebubble.analysis.pipeline.labels import STAGE_PATTERNS, label_spans
from pipebubble.errors import StageSpecError
from pipebubble.options import RANK_ORDERS, STAGE_BY, StageOptions, check_regex
from pipebubble.spans import CPU_WORK


@dataclass(frozen=True)
class Worker:
    """Where one of a data-parallel job's workers stands: the pipeline stage it runs (its name and sort key),
    its replica and the ranks the trace names for it (global, tensor-parallel; None where unnamed)."""

    stage: str
    order: tuple
    replica: int
    rank: int | None = None
    tp: int | None = None


@dataclass(frozen=True)
class StageMap:
    """``spans`` with ``stage`` filled, the stage names in order, and how they were chosen. In a DP × PP job
    whose replicas one file holds, ``stage`` indexes workers: ``names`` are theirs and ``workers`` says which
    stage and replica each is."""

    spans: pl.DataFrame
    names: list[str] = field(default_factory=list)
    method: str = ""
    order: list[tuple] = field(default_factory=list)  # sort key of each stage, to order stages across files
    pipeline: int | None = None  # lowest rank of the pipeline group the stages belong to, when one was found
    workers: list[Worker] | None = None  # per name, in a job of several replicas


def assign(
    spans: pl.DataFrame, options: StageOptions = StageOptions(), world: int | None = None, groups: list | None = None
) -> StageMap:
    """Fill the ``stage`` column (null for spans that belong to no stage). ``world``: the job's number of
    ranks, when ``spans`` hold only some of them (one file of many); ``groups``: the file's process groups
    (Kineto ``distributedInfo.pg_config``), where a pipeline group gives each rank its stage."""
    if options.rules:
        return _by_rules(spans, options.rules)
    if not options.stage_by and not options.pp_size:
        by_group = _by_pipeline_group(spans, groups or [])
        if by_group is not None:
            return by_group
        by_name = _by_named_rank(spans)
        if by_name is not None:
            return by_name
    method = options.stage_by or _default_method(spans, options.microbatch_regex)
    if method == "rank" and options.pp_size:
        return _by_pipeline_rank(spans, options.pp_size, options.rank_order, world)
    if method == "thread":
        return _by_thread(spans, options.microbatch_regex)
    if not options.stage_by and not options.pp_size and spans["rank"].n_unique() == 1:
        by_label = _by_label_stage(spans, options.microbatch_regex)
        if by_label is not None:
            return by_label
    keys = {
        "rank": ["rank"],
        "process": ["rank", "pid"],
        "device": ["rank", "pid", "device"],
        "stream": ["rank", "pid", "device", "stream"],
    }.get(method)
    if keys is None:
        raise StageSpecError(f"--stage-by must be one of {', '.join(STAGE_BY)} (not {method!r})")
    if method in ("device", "stream"):
        return _by_gpu(spans, keys, method)
    return _by_keys(spans, keys, method)


def _by_named_rank(spans: pl.DataFrame) -> StageMap | None:
    """Threads named for their pipeline rank (ingest fills ``stage`` from Megatron's step-timer thread names,
    ``PP rank {p}, TP rank {t}, ...``): stage p. A job's trace holds every data-parallel replica (a process
    each, ``pid`` = the DP rank): each (replica, stage) is a worker, named ``pp{p}/dp{d}``; replicas are
    numbered in process order. None where no span names its stage."""
    if spans["stage"].null_count() == spans.height:
        return None
    named = spans.filter(pl.col("stage").is_not_null())
    stages = sorted(named["stage"].unique().to_list())
    owners = named.select("rank", "pid").unique().sort("rank", "pid", nulls_last=True).rows()
    if len(owners) == 1:  # one replica: stages numbered from 0 in pipeline order
        frame = spans.with_columns(pl.col("stage").replace_strict(stages, range(len(stages)), default=None,
                                                                  return_dtype=pl.Int32))
        return StageMap(frame, [f"pp{s}" for s in stages], "thread names (PP rank)", [(s,) for s in stages])
    keys = pl.DataFrame(
        [(r, pid, s, d * len(stages) + i) for d, (r, pid) in enumerate(owners) for i, s in enumerate(stages)],
        schema={"rank": pl.Int32, "pid": pl.Int64, "stage": pl.Int32, "_worker": pl.Int32}, orient="row",
    )
    frame = spans.join(keys, on=["rank", "pid", "stage"], how="left", nulls_equal=True, maintain_order="left")
    frame = frame.with_columns(stage=pl.col("_worker")).drop("_worker")
    # Megatron's step timers record TP rank 0 of each worker (lanes name another, ``pp1/tp1/dp0``)
    workers = [Worker(f"pp{s}", (s,), d, None, 0) for d in range(len(owners)) for s in stages]
    names = [f"pp{s}/dp{pid}" for _, pid in owners for s in stages]
    order = [(d, s) for d in range(len(owners)) for s in stages]
    return StageMap(frame, names, "thread names (PP rank, DP rank)", order, workers=workers)


def _default_method(spans: pl.DataFrame, microbatch_regex: str | None = None) -> str:
    if spans["rank"].n_unique() > 1:
        return "rank"
    gpu = spans.filter(pl.col("device").is_not_null()).select("pid", "device").unique()
    if gpu.height > 1:
        return "device"
    if not gpu.height and _labelled_processes(spans, microbatch_regex) > 1:
        return "process"
    return "rank"


def _labelled_processes(spans: pl.DataFrame, microbatch_regex: str | None) -> int:
    """How many processes of a file without GPU work hold micro-batch labels: several are one stage each
    (MegaScan merges a job's pipeline ranks into one trace, ``pid`` = PP rank), in pid order."""
    if spans["pid"].n_unique() < 2:
        return 0
    found, _, _ = label_spans(spans, microbatch_regex)
    return found["pid"].n_unique()


def _by_keys(spans: pl.DataFrame, keys: list[str], method: str, by: list[str] | None = None) -> StageMap:
    """One stage per distinct ``keys``, numbered in the order of the columns ``by`` (``keys`` by default)."""
    # Keys a format never fills (no rank in an Nsight export) do not split stages.
    keys = [k for k in keys if spans[k].null_count() < spans.height] or keys[:1]
    by = [k for k in by or keys if k in keys]
    groups = spans.select(keys).unique().drop_nulls().sort(by)
    groups = groups.with_row_index("stage").with_columns(pl.col("stage").cast(pl.Int32))
    rows = groups.drop("stage").rows()
    names = ["/".join(f"{k}{v}" for k, v in zip(keys, row, strict=True)) for row in rows]
    order = [tuple((v is None, v or 0) for v in row) for row in groups.select(by).rows()]
    frame = spans.drop("stage").join(groups, on=keys, how="left", nulls_equal=True)
    return StageMap(frame, names, method, order)


def _by_gpu(spans: pl.DataFrame, keys: list[str], method: str) -> StageMap:
    """GPU work goes to its device's stage, stages in device order (a process's id says nothing of where it
    stands in the pipeline: one started per GPU, their ids fall in any order); the CPU threads that launched
    it follow their kernels."""
    gpu = spans.filter(pl.col("device").is_not_null())
    by = ["rank", "device", *(k for k in keys if k not in ("rank", "device"))]
    mapped = _by_keys(gpu, keys, method, by)
    # Joined as every launch is (Nsight's correlation ids recur in each process of one export).
    stage_of_thread = (
        with_launch(mapped.spans.filter(pl.col("correlation").is_not_null()), spans, how="inner")
        .group_by("at_lane")
        .agg(pl.col("stage").mode().first())
        .rename({"at_lane": "lane"})
    )
    cpu = spans.filter(pl.col("device").is_null()).drop("stage").join(stage_of_thread, on="lane", how="left")
    return StageMap(pl.concat([mapped.spans, cpu.select(mapped.spans.columns)]), mapped.names, method, mapped.order)


def _by_thread(spans: pl.DataFrame, microbatch_regex: str | None = None) -> StageMap:
    """One stage per CPU thread (rank, pid, tid) that runs a stage's work (``_stage_threads``). GPU work goes
    to the stage of the thread whose runtime call launched it (joined on the correlation id, as
    ``labels.attribute`` joins it): the converse of ``--stage-by device``, where threads follow their kernels."""
    launched = _launching_threads(spans)
    threads = _stage_threads(spans, launched, microbatch_regex)
    rows = threads.select("rank", "first", "pid", "tid").rows()
    names = [_thread_name(r, p, t) for r, _, p, t in rows]
    order = [((r is None, r or 0), first, p or 0, t or 0) for r, first, p, t in rows]
    return StageMap(_follow_threads(spans, launched, threads.select("lane", "stage")), names, "thread", order)


def _thread_name(rank: int | None, pid: int | None, tid: int | None) -> str:
    return (f"rank{rank}/" if rank is not None else "") + f"pid{pid}/tid{tid}"


def _follow_threads(spans: pl.DataFrame, launched: pl.DataFrame, stage_of: pl.DataFrame) -> pl.DataFrame:
    """``spans`` with each CPU thread's ``stage`` from ``stage_of`` (lane, stage) and GPU work the stage of the
    thread that launched it (``launched``: ``_launching_threads``)."""
    on_cpu = pl.col("device").is_null() & pl.col("tid").is_not_null()
    host = spans.filter(on_cpu).drop("stage").join(stage_of, on="lane", how="left")
    kernels = launched.join(stage_of, on="lane").select(*_GPU_ID, "stage")
    gpu = spans.filter(~on_cpu).drop("stage").join(kernels, on=_GPU_ID, how="left", nulls_equal=True)
    return pl.concat([host.select(spans.columns), gpu.select(spans.columns)])


def _by_label_stage(spans: pl.DataFrame, microbatch_regex: str | None = None) -> StageMap | None:
    """Labels that name their stage (``labels.STAGE_PATTERNS``: PiPPy's ``F_{stage},{mb}``): each thread
    holding such labels (or launching labelled kernels) is the stage its labels name (the most common, where
    they differ), stages in the labels' order and named by their threads; GPU work follows the thread that
    launched it, as under ``--stage-by thread``. None where the labels found name no stage."""
    found, pattern, regex = label_spans(spans, microbatch_regex)
    if pattern not in STAGE_PATTERNS:
        return None
    launched = _launching_threads(spans)
    named = found.with_columns(
        label_stage=pl.col("name").str.extract(regex, re.compile(regex).groupindex["stage"]).cast(pl.Int32)
    )
    kernels = named.filter(pl.col("device").is_not_null()).select(*_GPU_ID, "label_stage")
    marks = pl.concat([
        named.filter(pl.col("device").is_null()).select("lane", "label_stage", "start"),
        launched.join(kernels, on=_GPU_ID, nulls_equal=True).select("lane", "label_stage", start="launch_start"),
    ])
    cpu = spans.filter(pl.col("device").is_null() & pl.col("tid").is_not_null())
    threads = (
        marks.group_by("lane").agg(pl.col("label_stage").mode().min(), first=pl.col("start").min())
        .join(cpu.group_by("lane").agg(pl.col("rank", "pid", "tid").first()), on="lane")
        .with_columns(stage=pl.col("label_stage").rank("dense").cast(pl.Int32) - 1)
        .sort("stage", "first")
    )
    if threads.is_empty():
        return None
    names, order = [], []
    for _, rows in threads.group_by("stage", maintain_order=True):
        names.append(",".join(_thread_name(r, p, t) for r, p, t in rows.select("rank", "pid", "tid").rows()))
        order.append((rows["label_stage"][0],))
    mapped = _follow_threads(spans, launched, threads.select("lane", "stage"))
    return StageMap(mapped, names, f"labels ({pattern})", order)


def _stage_threads(spans: pl.DataFrame, launched: pl.DataFrame, microbatch_regex: str | None) -> pl.DataFrame:
    """The threads that are stages, numbered: those holding micro-batch labels (or launching labelled kernels)
    when there are labels, else those that launched GPU work, else (no GPU work) every thread with CPU work.
    Ordered by rank, then by when the thread's first label (else launch or work) starts, so a pipeline's
    stage 0, which runs first, comes first whatever the thread ids are."""
    cpu = spans.filter(pl.col("device").is_null() & pl.col("tid").is_not_null())
    found, pattern, _ = label_spans(spans, microbatch_regex)
    if pattern is not None:
        kernels = found.filter(pl.col("device").is_not_null()).select(*_GPU_ID)
        marks = pl.concat([
            found.filter(pl.col("device").is_null()).select("lane", "start"),
            launched.join(kernels, on=_GPU_ID, nulls_equal=True).select("lane", start="launch_start"),
        ])
    elif launched.height:
        marks = launched.select("lane", start="launch_start")
    else:
        marks = cpu.filter(pl.col("kind").is_in(CPU_WORK)).select("lane", "start")
    return (
        marks.group_by("lane").agg(first=pl.col("start").min())
        .join(cpu.group_by("lane").agg(pl.col("rank", "pid", "tid").first()), on="lane")
        .sort(pl.col("rank").is_null(), "rank", "first", "pid", "tid", nulls_last=True)
        .with_row_index("stage")
        .with_columns(pl.col("stage").cast(pl.Int32))
    )


_GPU_ID = ["source", "correlation", "start", "end", "stream"]


def _launching_threads(spans: pl.DataFrame) -> pl.DataFrame:
    """GPU spans (source, correlation, start, end, stream) with the ``lane`` and ``launch_start`` of the
    runtime call that launched them (same process where the format records it; Nsight's ids are unique per
    process only)."""
    gpu = spans.filter(pl.col("device").is_not_null() & pl.col("correlation").is_not_null())
    launched = with_launch(gpu.select(*_GPU_ID, "pid"), spans, how="inner", key=_GPU_ID)
    return launched.select(*_GPU_ID, lane="at_lane", launch_start="at")


def _by_pipeline_rank(spans: pl.DataFrame, pp: int, order: str, world: int | None) -> StageMap:
    """Megatron orders ranks tp fastest, pp slowest (``tp-cp-ep-dp-pp``): pp rank = rank // (world / pp).
    ``pp-dp-tp`` puts pp fastest: pp rank = rank % pp. Each rank is a worker: stage and replica (the index
    among the ranks of its stage, in rank order); one replica alone gives stages ``pp{s}``."""
    if order not in RANK_ORDERS:
        raise StageSpecError(f"--rank-order must be one of {', '.join(RANK_ORDERS)} (not {order!r})")
    world = world or int(spans["rank"].max()) + 1
    if world % pp:
        raise StageSpecError(f"--pp-size {pp} does not divide the {world} ranks found")
    ranks = sorted(spans["rank"].drop_nulls().unique().to_list())
    stage_of = {r: (r % pp if order == "pp-dp-tp" else r // (world // pp)) for r in ranks}
    method = f"rank (pp={pp}, {order})"
    if world == pp:
        frame = spans.with_columns(stage=pl.col("rank").replace_strict(stage_of, default=None, return_dtype=pl.Int32))
        return StageMap(frame, [f"pp{s}" for s in range(pp)], method, [(s,) for s in range(pp)])
    # Several ranks per stage: each rank is a worker, its replica the index among its stage's ranks (a file
    # of one rank of many says its own); names and order over the replicas present.
    peer_of = {r: (r // pp if order == "pp-dp-tp" else r % (world // pp)) for r in ranks}
    present = sorted({(peer_of[r], stage_of[r], r) for r in ranks})
    worker = {r: i for i, (_, _, r) in enumerate(present)}
    frame = spans.with_columns(stage=pl.col("rank").replace_strict(worker, default=None, return_dtype=pl.Int32))
    workers = [Worker(f"pp{s}", (s,), d, r) for d, s, r in present]
    names = [f"pp{s}/dp{d}" for d, s, _ in present]
    return StageMap(frame, names, method, [(d, s) for d, s, _ in present], workers=workers)


PIPELINE_GROUP = re.compile(r"(?i)pipe|(^|[_:\s-])pp($|[_:\s-])")


def pipeline_group(groups: list, rank: int) -> list[int] | None:
    """The ranks of ``rank``'s pipeline group: a process group whose description names it (Megatron's
    ``PIPELINE_MODEL_PARALLEL_GROUP``, a device mesh's ``pp`` dimension ...)."""
    for group in groups:
        if not isinstance(group, dict):
            continue
        ranks, desc = group.get("ranks"), f"{group.get('pg_desc', '')} {group.get('pg_name', '')}"
        if isinstance(ranks, list) and rank in ranks and len(ranks) > 1 and PIPELINE_GROUP.search(desc):
            return sorted(int(r) for r in ranks)
    return None


def _by_pipeline_group(spans: pl.DataFrame, groups: list) -> StageMap | None:
    """One file of one rank in a pipeline group: its stage is the rank's place in the group."""
    ranks = spans["rank"].drop_nulls().unique().to_list()
    members = pipeline_group(groups, ranks[0]) if len(ranks) == 1 else None
    if members is None:
        return None
    index = members.index(ranks[0])
    names = [f"pp{i}" for i in range(len(members))]
    order = [(i,) for i in range(len(members))]
    frame = spans.with_columns(stage=pl.lit(index, pl.Int32))
    return StageMap(frame, names, "pipeline group", order, pipeline=members[0])


def _by_rules(spans: pl.DataFrame, rules: tuple[tuple[str, str], ...]) -> StageMap:
    expr = pl.lit(None, pl.Int32)
    for index, (_, regex) in reversed(list(enumerate(rules))):
        check_regex(regex)
        expr = pl.when(pl.col("lane").str.contains(regex)).then(pl.lit(index, pl.Int32)).otherwise(expr)
    names = [name for name, _ in rules]
    return StageMap(spans.with_columns(stage=expr), names, "rules", [(i,) for i in range(len(rules))])
