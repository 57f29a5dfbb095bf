"""Each stage's work, labelled: which spans are compute or communication, which micro-batch pass and which
step each belongs to.

GPU stages: kernels, memcpy and memset are compute; NCCL/RCCL, DeepEP and NVSHMEM kernels are communication
(a SendRecv kernel spinning while it waits for its peer is waiting, not working; DualPipe's ``dispatch``/
``combine`` parts are the MoE all-to-all). CPU stages (gloo pipelines, one thread per stage): top-level
operators of the thread that carries the micro-batch labels (else the busiest thread), which may be the
labels themselves (passes that are operators); ``gloo:``/``c10d::`` ranges are communication.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE, merge, top_level
from pipebubble.analysis.pipeline.labels import attribute, labels
from pipebubble.spans import BACKWARD_NAMES, CPU_WORK, GPU_WORK, is_comm

WORK_SCHEMA = {"stage": pl.Int32, "lane": pl.String, "role": pl.String, "start": pl.Int64, "end": pl.Int64,
               "phase": pl.String, "microbatch": pl.Int32, "chunk": pl.Int32, "step": pl.Int32}
WORK_COLUMNS = list(WORK_SCHEMA)
LABEL_KEYS = ["stage", "lane", "role", "phase", "microbatch", "chunk", "step"]
#: torch.distributed.pipelining's actions that move data rather than compute (torchtitan's traces):
#: ``PP:{stage}SEND_F{mb}``, ``RECV_F``, ``SEND_B``, ``RECV_B`` (the hand-offs between stages) and FSDP's
#: ``PP:{stage}UNSHARD`` / ``RESHARD`` (parameters gathered before a stage's passes and freed after them).
COMM_ACTIONS = r"^PP:\d+(?:SEND_|RECV_|UNSHARD|RESHARD)"
OTHER_RANGES = r"^Optimizer\.|zero_grad|^ProfilerStep#"


def stage_work(spans: pl.DataFrame, microbatch_regex: str | None = None) -> tuple[pl.DataFrame, dict]:
    """Work spans of every stage (``WORK_COLUMNS``) and facts about how they were labelled."""
    work, pattern, gpu_stages = labelled_work(spans, microbatch_regex)
    return work, {"pattern": pattern, "inferred": pattern is None, "mode": "gpu" if gpu_stages else "cpu"}


def labelled_work(
    spans: pl.DataFrame, microbatch_regex: str | None = None, apart: bool = False, names: pl.DataFrame | None = None
) -> tuple[pl.DataFrame, str | None, set[int]]:
    """Work spans of every stage (``WORK_COLUMNS``), the label pattern found and the stages that are GPUs.
    ``apart``: each stage is a file of its own (several files' spans at once, one stage each), so whether a
    stage's steps come from its passes or its ProfilerSteps is decided stage by stage, as for each file
    alone; otherwise once over all of them, as for one file of several stages. ``names``: the
    ``labels.label_names`` of the staged spans, where the caller has them."""
    staged = spans.filter(pl.col("stage").is_not_null()) if spans["stage"].null_count() else spans
    found, pattern = labels(staged, microbatch_regex, names)
    on_gpu = pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)
    gpu_stages = set(staged.lazy().filter(on_gpu).select(pl.col("stage").unique()).collect(engine=ENGINE)["stage"])
    gpu = staged.lazy().filter(pl.col("stage").is_in(list(gpu_stages)) & on_gpu)
    cpu = _cpu_work(staged.filter(~pl.col("stage").is_in(list(gpu_stages))), found)
    work = pl.concat([gpu, cpu.lazy()], how="vertical").with_columns(
        role=pl.when(is_comm())
        .then(pl.lit("comm"))
        .otherwise(pl.lit("compute"))
    )
    work = _in_comm_actions(attribute(work, spans, found), spans)
    work = infer_microbatches(work, spans) if pattern is None else _steps_of(work, spans, apart)
    # Spans of one pass that overlap or touch become one interval: every union taken later is unchanged.
    merged = merge(work, LABEL_KEYS).lazy().select(WORK_COLUMNS).sort("stage", "start").collect(engine=ENGINE)
    return merged, pattern, gpu_stages


def _in_comm_actions(work: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """GPU work launched inside a ``COMM_ACTIONS`` range on its thread is communication, whatever it is named
    (FSDP's copy-out after its all-gather, a send's staging copy). CPU stages keep the rule by name: their
    ``c10d::``/``gloo:`` calls in such ranges are communication already, and the operators beside them
    (``aten::detach`` of a received tensor) stay as they were."""
    ranges = spans.lazy().filter((pl.col("kind") == "annotation") & pl.col("name").str.contains(COMM_ACTIONS))
    ranges = ranges.select(launch_lane="lane", launched="start", _end="end").collect(engine=ENGINE)
    if ranges.is_empty():
        return work
    inside = (
        work.lazy().with_row_index("_row")
        .filter(pl.col("device").is_not_null() & pl.col("launched").is_not_null())
        .sort("launch_lane", "launched")
        .join_asof(ranges.lazy().sort("launch_lane", "launched"), on="launched", by="launch_lane",
                   strategy="backward", check_sortedness=False)
        .filter(pl.col("launched") < pl.col("_end")).select("_row")
    )
    rows = work.lazy().with_row_index("_row").join(inside.with_columns(_comm=pl.lit(True)), on="_row", how="left")
    role = pl.when(pl.col("_comm").fill_null(False)).then(pl.lit("comm")).otherwise("role")
    return rows.with_columns(role=role).drop("_row", "_comm").collect(engine=ENGINE)


def _steps_of(work: pl.DataFrame, spans: pl.DataFrame, apart: bool) -> pl.DataFrame:
    """``_steps``, where passes exist (over all stages, or ``apart``, stage by stage), else the steps of
    ``_steps_from_markers``."""
    if not apart:
        return _steps(work, spans)
    stages = work.lazy().group_by("stage").agg(passes=_PASS.any()).collect(engine=ENGINE)
    with_passes = stages["stage"].filter(stages["passes"])
    if with_passes.is_empty() or with_passes.len() == stages.height:
        return _steps(work, spans)
    mine = pl.col("stage").is_in(pl.lit(with_passes).implode())
    steps = _steps(work.filter(mine), spans)
    return pl.concat([steps, _steps_from_markers(work.filter(~mine), spans).drop("launched", strict=False)],
                     how="vertical")


#: Work of a micro-batch pass.
_PASS = pl.col("phase").is_in(["forward", "backward", "weight"])


def _cpu_work(staged: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
    """Top-level work of each stage's main thread."""
    ops = staged.filter(pl.col("device").is_null() & pl.col("kind").is_in(CPU_WORK))
    if ops.is_empty():
        return ops
    labelled = found.group_by("lane").len().rename({"len": "labels"})
    load = ops.group_by("stage", "lane").agg(busy=(pl.col("end") - pl.col("start")).sum())
    main = (
        load.join(labelled, on="lane", how="left")
        .with_columns(pl.col("labels").fill_null(0))
        .sort("labels", "busy", descending=True)
        .unique("stage", keep="first")
    )
    ops = ops.join(main.select("lane"), on="lane")
    # Top level among compute only: communication ranges (gloo's are asynchronous) overlap compute freely.
    top = top_level(ops.filter(~is_comm()), keep_overhanging=True)
    return pl.concat([top, ops.filter(is_comm())])


def infer_microbatches(work: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Without labels (torch 2.13's 1F1B emits none): steps come from each rank's k-th ProfilerStep; a run of
    compute between two communications is a burst; a burst's operators from its first autograd one on are a
    backward pass, those before it a forward pass (the last stage runs F and B of a micro-batch back to back).
    The n-th forward (backward) pass of a stage in a step is micro-batch n."""
    stepped = _steps_from_markers(work, spans)
    ordered = stepped.with_columns(other=_inside_other_ranges(stepped, spans)).sort("stage", "start")
    breaks = (pl.col("role") == "comm") | pl.col("other") | (pl.col("step") != pl.col("step").shift(1))
    ordered = ordered.with_columns(burst=breaks.fill_null(True).cast(pl.Int32).cum_sum().over("stage"))
    is_pass = (pl.col("role") == "compute") & ~pl.col("other")
    back = pl.col("context").fill_null(pl.col("name")).str.contains(BACKWARD_NAMES) & is_pass
    first_back = pl.col("start").filter(back).min().over("stage", "burst")
    guess = (
        pl.when(~is_pass)
        .then(pl.lit(None, pl.String))
        .when(first_back.is_not_null() & (pl.col("start") >= first_back))
        .then(pl.lit("backward"))
        .otherwise(pl.lit("forward"))
    )
    ordered = ordered.with_columns(phase=guess)
    run = pl.struct("burst", "phase").rle_id().over("stage")
    ordered = ordered.with_columns(run=run)
    # Slivers (input creation, gradient scaling) are not passes: under half the stage's median pass.
    length = (pl.col("end").max() - pl.col("start").min()).over("stage", "run")
    sliver = length < 0.5 * length.filter(pl.col("phase").is_not_null()).median().over("stage", "phase")
    ordered = ordered.with_columns(
        phase=pl.when(pl.col("other") & (pl.col("role") == "compute"))
        .then(pl.lit("other"))
        .when(sliver & pl.col("phase").is_not_null())
        .then(pl.lit("other"))
        .otherwise("phase")
    )
    number = pl.col("run").rank("dense").over("stage", "step", "phase") - 1
    passes = pl.col("phase").is_in(["forward", "backward"])
    return ordered.with_columns(microbatch=pl.when(passes).then(number).cast(pl.Int32)).drop("other", "burst", "run")


def _inside_other_ranges(work: pl.DataFrame, spans: pl.DataFrame) -> pl.Series:
    """Work under an optimizer or zero_grad range is not a micro-batch pass."""
    ranges = spans.filter((pl.col("kind") == "annotation") & pl.col("name").str.contains(r"^Optimizer\.|zero_grad"))
    marks = ranges.select(lane=pl.col("lane"), start=pl.col("start"), range_end=pl.col("end")).sort("lane", "start")
    probe = work.with_row_index("row").sort("lane", "start")
    hit = probe.join_asof(marks, on="start", by="lane", strategy="backward", check_sortedness=False)
    hit = hit.with_columns(inside=(pl.col("start") < pl.col("range_end")).fill_null(False)).sort("row")
    return hit["inside"]


def _steps(work: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Step index of every work span, aligned by the schedule: a stage's step k starts where its first pass (forward,
    lowest micro-batch and chunk) begins for the (k+1)-th time. "Begins" follows forward passes only: a first pass
    whose parts interleave with a backward one (DualPipe overlaps a forward and a backward chunk part by part) is
    one pass, not one per part; and where a stage runs one forward pass a step, the ProfilerStep its launches fall
    in tells the steps apart. Ranks' ProfilerStep markers disagree in time, so they never align steps across stages.
    Other work takes the step of the nearest pass boundary before it on the same stage (the first step, for work
    before the first pass)."""
    forward = pl.col("phase") == "forward"
    if not work.select(_PASS.any()).item():
        return _steps_from_markers(work, spans).drop("launched", strict=False)
    ordered = _marker_of(work.lazy().sort("stage", "start").with_row_index("row"), spans)
    first = (
        forward
        & (pl.col("microbatch") == pl.col("microbatch").filter(forward).min().over("stage"))
        & pl.col("chunk").eq_missing(pl.col("chunk").filter(forward).min().over("stage"))
    )
    fwd = ordered.filter(forward).with_columns(
        pass_id=pl.struct("microbatch", "chunk", "marker").rle_id().over("stage"), first=first
    )
    new = (pl.col("pass_id") != pl.col("pass_id").shift(1).over("stage")).fill_null(True)
    starts = fwd.select("row", begins=(new & pl.col("first")).cast(pl.Int32))
    ordered = ordered.join(starts, on="row", how="left").sort("row")
    step = (pl.col("begins").fill_null(0).cum_sum().over("stage") - 1).clip(0)
    steps = ordered.with_columns(step=step.cast(pl.Int32)).drop("row", "begins", "marker", "launched", strict=False)
    return steps.collect(engine=ENGINE)


def _marker_of(work: pl.LazyFrame, spans: pl.DataFrame) -> pl.LazyFrame:
    """``marker``: the index of the ProfilerStep of the span's stage that holds its launch (its own start on
    the CPU); 0 without markers."""
    marks = (
        spans.lazy().filter((pl.col("kind") == "step") & pl.col("stage").is_not_null())
        .sort("start")
        .select("stage", marker_at="start", marker=pl.int_range(pl.len()).over("stage").cast(pl.Int32))
    )
    launched = "launched" in work.collect_schema().names()
    at = pl.coalesce(pl.col("launched"), pl.col("start")) if launched else pl.col("start")
    probe = work.with_columns(marker_at=at).sort("marker_at")
    joined = probe.join_asof(marks.sort("marker_at"), on="marker_at", by="stage", strategy="backward",
                             check_sortedness=False)
    return joined.with_columns(pl.col("marker").fill_null(0)).drop("marker_at").sort("row")


def _steps_from_markers(work: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """No passes at all: the k-th ProfilerStep of each stage's rank is its step k."""
    if not (spans["kind"] == "step").any():
        return work.lazy().with_columns(step=pl.lit(0, pl.Int32)).collect(engine=ENGINE)
    marks = (
        spans.lazy().filter(pl.col("kind") == "step")
        .sort("start")
        .with_columns(k=pl.int_range(pl.len()).over("stage").cast(pl.Int32))
        .select("stage", "start", "k")
    )
    joined = work.lazy().sort("start").join_asof(
        marks.sort("start"), on="start", by="stage", strategy="backward", check_sortedness=False
    )
    return joined.with_columns(step=pl.col("k").fill_null(0)).drop("k").collect(engine=ENGINE)
