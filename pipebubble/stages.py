"""Who is a stage, and which span is which micro-batch pass.

Stages: a folder of per-rank traces gives one stage per rank in rank order (``--pp-size`` with a rank order
covers Megatron-style layouts where only some ranks differ in pipeline rank); one file holding several GPU
processes (Nsight) gives one stage per GPU in device order; ``--stage-by`` and ``--stage NAME=REGEX`` (on lane
ids) override.

Micro-batch labels are CPU ranges: torch.distributed.pipelining ``PP:{stage}{F|B|I|W}{mb}``, GPipe's
``Forward {mb}`` / ``Backward {mb}``, zero-bubble NVTX ``F{mb}.{chunk}.{seq}``, Megatron ``forward-compute`` /
``backward-compute`` (numbered by order), or ``--microbatch-regex`` with named groups ``phase``, ``mb`` and
optionally ``chunk``. A span belongs to the innermost label whose range holds its start (CPU work) or the
start of the runtime call that launched it (GPU work, joined on the launch's correlation id).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import polars as pl

from pipebubble.errors import StageSpecError
from pipebubble.options import RANK_ORDERS, StageOptions, check_regex

#: (name, regex); groups: phase letter or word, mb, chunk (a virtual stage id or chunk index).
LABEL_PATTERNS = (
    ("torch_pipelining", r"^PP:(?P<chunk>\d+)(?P<phase>[FBIW])(?P<mb>\d+)$"),
    ("gpipe", r"^(?P<phase>Forward|Backward) (?P<mb>\d+)$"),
    ("zero_bubble", r"^(?P<phase>[FBW])(?P<mb>\d+)\.(?P<chunk>\d+)\.(?P<seq>\d+)$"),
    ("megatron", r"^(?P<phase>forward|backward)-compute$"),
)
PHASES = {
    "F": "forward",
    "B": "backward",
    "I": "backward",
    "W": "weight",
    "forward": "forward",
    "backward": "backward",
    "weight": "weight",
    "Forward": "forward",
    "Backward": "backward",
}
COMM_NAMES = r"(?i)^(gloo|nccl|mpi|ucc):|^c10d::|record_param_comms|^PP:\d+(SEND|RECV)_"
BACKWARD_NAMES = r"(?i)backward|autograd::engine"


@dataclass(frozen=True)
class StageMap:
    """``spans`` with ``stage`` filled, the stage names in order, and how they were chosen."""

    spans: pl.DataFrame
    names: list[str] = field(default_factory=list)
    method: str = ""
    order: list[tuple] = field(default_factory=list)  # sort key of each stage, to order stages across files
    pipeline: int | None = None  # lowest rank of the pipeline group the stages belong to, when one was found


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
    method = options.stage_by or _default_method(spans)
    if method == "rank" and options.pp_size:
        return _by_pipeline_rank(spans, options.pp_size, options.rank_order, world)
    keys = {
        "rank": ["rank"],
        "process": ["rank", "pid"],
        "device": ["rank", "pid", "device"],
        "stream": ["rank", "pid", "device", "stream"],
    }.get(method)
    if keys is None:
        raise StageSpecError(f"--stage-by must be one of rank, device, process, stream (not {method!r})")
    if method in ("device", "stream"):
        return _by_gpu(spans, keys, method)
    return _by_keys(spans, keys, method)


def _default_method(spans: pl.DataFrame) -> str:
    if spans["rank"].n_unique() > 1:
        return "rank"
    gpu = spans.filter(pl.col("device").is_not_null()).select("pid", "device").unique()
    return "device" if gpu.height > 1 else "rank"


def _by_keys(spans: pl.DataFrame, keys: list[str], method: str) -> StageMap:
    # Keys a format never fills (no rank in an Nsight export) do not split stages.
    keys = [k for k in keys if spans[k].null_count() < spans.height] or keys[:1]
    groups = spans.select(keys).unique().drop_nulls().sort(keys)
    groups = groups.with_row_index("stage").with_columns(pl.col("stage").cast(pl.Int32))
    rows = groups.drop("stage").rows()
    names = ["/".join(f"{k}{v}" for k, v in zip(keys, row, strict=True)) for row in rows]
    order = [tuple((v is None, v or 0) for v in row) for row in rows]
    frame = spans.drop("stage").join(groups, on=keys, how="left", nulls_equal=True)
    return StageMap(frame, names, method, order)


def _by_gpu(spans: pl.DataFrame, keys: list[str], method: str) -> StageMap:
    """GPU work goes to its device's stage; the CPU threads that launched it follow their kernels."""
    gpu = spans.filter(pl.col("device").is_not_null())
    mapped = _by_keys(gpu, keys, method)
    stage_of_thread = (
        mapped.spans.filter(pl.col("correlation").is_not_null())
        .join(
            spans.filter(pl.col("kind") == "runtime").select("source", "correlation", "lane"),
            on=["source", "correlation"],
        )
        .group_by("lane_right")
        .agg(pl.col("stage").mode().first())
        .rename({"lane_right": "lane"})
    )
    cpu = spans.filter(pl.col("device").is_null()).drop("stage").join(stage_of_thread, on="lane", how="left")
    return StageMap(pl.concat([mapped.spans, cpu.select(mapped.spans.columns)]), mapped.names, method, mapped.order)


def _by_pipeline_rank(spans: pl.DataFrame, pp: int, order: str, world: int | None) -> StageMap:
    """Megatron orders ranks tp fastest, pp slowest (``tp-cp-ep-dp-pp``): pp rank = rank // (world / pp).
    ``pp-dp-tp`` puts pp fastest: pp rank = rank % pp. The pipeline analysed is the one holding rank 0."""
    if order not in RANK_ORDERS:
        raise StageSpecError(f"--rank-order must be one of {', '.join(RANK_ORDERS)} (not {order!r})")
    world = world or int(spans["rank"].max()) + 1
    if world % pp:
        raise StageSpecError(f"--pp-size {pp} does not divide the {world} ranks found")
    rank = pl.col("rank")
    stage = rank % pp if order == "pp-dp-tp" else rank // (world // pp)
    peer = rank // pp if order == "pp-dp-tp" else rank % (world // pp)
    frame = spans.with_columns(stage=pl.when(peer == 0).then(stage).cast(pl.Int32))
    return StageMap(frame, [f"pp{s}" for s in range(pp)], f"rank (pp={pp}, {order})", [(s,) for s in range(pp)])


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


def labels(spans: pl.DataFrame, microbatch_regex: str | None = None) -> tuple[pl.DataFrame, str | None]:
    """Micro-batch labels among annotation spans: rank, pid, tid, lane, start, end, phase, microbatch, chunk;
    and which pattern matched (the first that matches any span wins)."""
    notes = spans.filter(pl.col("kind") == "annotation")
    patterns = ((("custom", microbatch_regex),) if microbatch_regex else ()) + LABEL_PATTERNS
    for name, regex in patterns:
        check_regex(regex)
        found = notes.filter(pl.col("name").str.contains(regex))
        if found.height:
            return _label_frame(found, regex, name), name
    return notes.clear().with_columns(chunk=pl.lit(None, pl.Int32)).select(*_LABEL_COLUMNS), None


_LABEL_COLUMNS = ["rank", "pid", "tid", "lane", "start", "end", "phase", "microbatch", "chunk"]


def _label_frame(found: pl.DataFrame, regex: str, pattern: str) -> pl.DataFrame:
    groups = re.compile(regex).groupindex
    parts = pl.col("name").str.extract_groups(regex)
    frame = found.drop("phase", "microbatch").with_columns(parts=parts).unnest("parts")
    phase = pl.col("phase").replace_strict(PHASES, default=None) if "phase" in groups else pl.lit("forward")
    frame = frame.with_columns(
        phase=phase,
        microbatch=pl.col("mb").cast(pl.Int32, strict=False) if "mb" in groups else pl.lit(None, pl.Int32),
        chunk=pl.col("chunk").cast(pl.Int32, strict=False) if "chunk" in groups else pl.lit(None, pl.Int32),
    )
    if "mb" not in groups:  # Megatron: the n-th forward (backward) range on a thread is micro-batch n
        frame = frame.sort("start").with_columns(microbatch=pl.int_range(pl.len()).over("lane", "phase").cast(pl.Int32))
    return frame.filter(pl.col("phase").is_not_null()).select(_LABEL_COLUMNS).sort("lane", "start")


def attribute(work: pl.DataFrame, spans: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
    """Give each work span the (phase, microbatch, chunk) of the label holding its start (CPU work) or its
    launch call's start (GPU work). Spans under no label get null phase. ``context`` names the top-level CPU
    operator that launched GPU work (the span's own name for CPU work), for inferring passes without labels."""
    launches = spans.filter(pl.col("kind") == "runtime").select(
        "source", "correlation", launch_lane="lane", launch_pid="pid", launch_start="start"
    )
    keyed = (
        work.join(launches, on=["source", "correlation"], how="left")
        .filter(pl.col("pid").is_null() | pl.col("launch_pid").is_null() | (pl.col("pid") == pl.col("launch_pid")))
        .unique(["source", "lane", "stream", "start", "end", "name"], keep="first", maintain_order=True)
    )
    keyed = keyed.with_columns(
        at=pl.when(pl.col("device").is_not_null()).then("launch_start").otherwise("start"),
        at_lane=pl.when(pl.col("device").is_not_null()).then("launch_lane").otherwise("lane"),
    )
    marks = found.select(
        at_lane="lane", at="start", label_end="end", label_phase="phase", label_mb="microbatch", label_chunk="chunk"
    ).sort("at_lane", "at")
    joined = keyed.sort("at_lane", "at").join_asof(
        marks, on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    inside = pl.col("at") < pl.col("label_end")
    joined = _launch_context(joined, spans)
    return joined.with_columns(
        phase=pl.when(inside).then("label_phase"),
        microbatch=pl.when(inside).then("label_mb"),
        chunk=pl.when(inside).then("label_chunk"),
    ).drop(
        "launch_lane",
        "launch_pid",
        "launch_start",
        "at",
        "at_lane",
        "label_end",
        "label_phase",
        "label_mb",
        "label_chunk",
    )


def _launch_context(keyed: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``context``: the top-level CPU operator holding each GPU span's launch (autograd's for backward)."""
    ops = spans.filter(pl.col("kind") == "cpu_op").sort("lane", "start", pl.col("end"), descending=[False, False, True])
    reach = pl.col("end").cum_max().shift(1).over("lane")
    top = ops.filter((pl.col("start") >= reach).fill_null(True)).select(
        at_lane="lane", at="start", op_end="end", op_name="name"
    )
    joined = keyed.sort("at_lane", "at").join_asof(
        top.sort("at_lane", "at"), on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    launched = pl.col("device").is_not_null() & (pl.col("at") < pl.col("op_end"))
    return joined.with_columns(
        context=pl.when(pl.col("device").is_null()).then("name").when(launched).then("op_name")
    ).drop("op_end", "op_name")
