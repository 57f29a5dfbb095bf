"""Which span is which micro-batch pass.

Micro-batch labels are CPU ranges (or work spans, below): torch.distributed.pipelining
``PP:{stage}{F|B|I|W}{mb}``, GPipe's ``Forward {mb}`` / ``Backward {mb}`` (torch's and PiPPy's ScheduleGPipe
and Schedule1F1B, torchtitan's), zero-bubble NVTX ``F{mb}``, ``F{mb}.{chunk}`` and ``F{mb}.{chunk}.{seq}``
(and ``B``, ``W``: sail-sg's ZeroBubbleScheduler, its V schedule and its runtime, whole names only), the
common spellings of a pass and its micro-batch (``PHASE_MB``: ``forward-mb3``, ``forward_microbatch_3``,
``backward_weight_mb3``, ``fwd_3``, ``wgrad_3`` ...; full words need a micro-batch word, as ``forward_3`` is as
often a loop's iteration), Megatron ``forward-compute`` / ``backward-compute`` (numbered by order in each
ProfilerStep; where their args give ``mb_id``, as ingest names them below), passes whose args name their
micro-batch and model chunk (``trace_args``: ingest names them ``forward (microbatch 3, model_chunk 1)``, from
MegaScan's B/E pairs or Megatron's step timers; of any kind), DualPipe's per-layer parts (below), or
``--microbatch-regex`` with named groups ``phase``, ``mb`` and optionally ``chunk``. DeepSpeed's ranges
(``DeepSpeedEngine.forward``) are the same with or without a pipeline, so they are no labels. Where no range
matches it, a custom regex matches work spans (CPU operators, kernels) that are passes themselves: such a span
is its own label. PiPPy's pipeline visualiser writes its passes so, ``F_{stage},{mb}`` / ``B_{stage},{mb}`` /
``W_{stage},{mb}`` on one thread per stage: that built-in pattern (``WORK_PATTERNS``) reads ranges and work
spans alike, and its label names the stage (``STAGE_PATTERNS``: ``stages.assign`` makes each thread the stage
its labels name). torch.distributed.pipelining's other actions (torchtitan's ``PP:{stage}SEND_F{mb}``,
``RECV_B{mb}``, ``UNSHARD`` ...) are no passes: ``work.COMM_ACTIONS``. A span belongs to the innermost label
whose range holds its start (CPU work) or the start of the runtime call that launched it (GPU work, joined on
the launch's correlation id); a kernel that is a label labels itself (and whatever else its stream runs inside
it).

DualPipe (DeepSeek-V3; deepseek-ai/profile-data's training trace, Megatron-core's overlapped MoE schedule)
labels each layer's part of a pass, ``attn(F)``, ``mlp(B)``, ``mlp(W)``, ``dispatch(F)``, ``combine(B)`` ... in
lower or upper case: ``attn``/``mlp`` are compute, ``dispatch``/``combine`` the two directions of the MoE
all-to-all (their kernels are DeepEP's, communication by ``spans.COMM_KERNELS``); F is forward, B backward for
inputs, W backward for weights. The labels carry no micro-batch: a pass is the labels of one direction (F; or B
with its W) under one enclosing range on their thread (DeepSeek's ``1F1B`` holds one overlapped forward and
backward chunk), labels outside any range grouped by the run they form, and the n-th pass of a direction on a
thread in a ProfilerStep is micro-batch n (as Megatron's are numbered by order). A custom regex with a ``part``
group and no ``mb`` is numbered the same way.
"""

from __future__ import annotations

import re

import polars as pl

from pipebubble.analysis.intervals import ENGINE, engine_for, top_level
from pipebubble.analysis.launches import EVENT_KEY, with_launch
from pipebubble.options import check_regex
from pipebubble.spans import ARGS_LABEL, CPU_WORK, GPU_WORK

_SEP = r"[-_ ]?"
#: A pass word, an optional ``step``, a micro-batch word and the number (``forward-mb3``, ``forward_step_mb3``,
#: ``forward microbatch 3``, ``fwd-mb-3``, ``backward_weight_mb3``); the short words alone also take the bare
#: number (``fwd_3``, ``bwd3``, ``wgrad_3``): group ``short``, the phase where ``phase`` took no part.
PHASE_MB = (
    r"^(?:(?P<phase>(?i:forward|backward(?:[-_ ](?:weight|input))?|fwd|bwd|wgrad))(?i:[-_ ]step)?"
    rf"{_SEP}(?i:mb|microbatch|micro[-_ ]batch){_SEP}|(?P<short>(?i:fwd|bwd|wgrad)){_SEP})(?P<mb>\d+)$"
)
#: (name, regex); groups: phase letter or word, mb, chunk (a virtual stage id or chunk index), part (the part
#: of a pass a label names, when labels name parts).
LABEL_PATTERNS = (
    ("trace_args", ARGS_LABEL),
    ("torch_pipelining", r"^PP:(?P<chunk>\d+)(?P<phase>[FBIW])(?P<mb>\d+)$"),
    ("pippy", r"^(?P<phase>[FBW])_(?P<stage>\d+),(?P<mb>\d+)$"),
    ("gpipe", r"^(?P<phase>Forward|Backward) (?P<mb>\d+)$"),
    ("zero_bubble", r"^(?P<phase>[FBW])(?P<mb>\d+)(?:\.(?P<chunk>\d+)(?:\.(?P<seq>\d+))?)?$"),
    ("phase_mb", PHASE_MB),
    ("megatron", r"^(?P<phase>forward|backward)-compute$"),
    ("dualpipe", r"^(?P<part>(?i:attn|mlp|dispatch|combine|mtp_post_process))\((?P<phase>[FBW])\)$"),
)
#: A phase as labels name it (lower case, ``-`` and spaces as ``_``) -> forward, backward or weight.
PHASES = {
    "f": "forward",
    "b": "backward",
    "i": "backward",  # torch's BACKWARD_INPUT: the input-gradient half of a split backward
    "w": "weight",
    "forward": "forward",
    "backward": "backward",
    "weight": "weight",
    "fwd": "forward",
    "bwd": "backward",
    "wgrad": "weight",
    "backward_input": "backward",
    "backward_weight": "weight",
    "forward_compute": "forward",  # Megatron's step timers
    "backward_compute": "backward",
}
#: Kinds a custom regex finds passes among where no annotation matches it: work spans that are passes.
PASS_KINDS = tuple(dict.fromkeys(CPU_WORK + GPU_WORK))
#: Built-in patterns whose names are passes themselves wherever they appear: PiPPy's visualiser writes
#: ``F_{stage},{mb}`` as the work spans of one thread per stage, and no other code spells a span so.
#: ``trace_args``: a B/E pair whose arguments name its micro-batch (MegaScan's ``forward``/``backward``) is named
#: so at ingest (``spans.args_label``), whatever its kind.
WORK_PATTERNS = ("pippy", "trace_args")
#: Built-in patterns that name the stage a pass runs on (group ``stage``): the stage is the label's.
STAGE_PATTERNS = ("pippy",)
#: ``key``: the thread lane of a CPU label, ``lane#stream`` of a GPU one (a kernel labels its own stream).
LABEL_COLUMNS = ["rank", "pid", "tid", "lane", "key", "device", "stream", "start", "end", "phase", "microbatch",
                 "chunk"]


def label_spans(spans: pl.DataFrame, microbatch_regex: str | None = None) -> tuple[pl.DataFrame, str | None, str]:
    """The spans that are micro-batch labels (rows of ``spans``), the name of the pattern that found them
    (the first that matches any span wins; None when none does) and its regex. A custom regex looks among
    annotations first and, where none matches, among work spans (``PASS_KINDS``); built-in patterns name
    ranges only."""
    found, pattern, regex = _chosen(spans, microbatch_regex)
    return found.collect(engine=ENGINE), pattern, regex


def _chosen(spans: pl.DataFrame, microbatch_regex: str | None,
            names: pl.DataFrame | None = None) -> tuple[pl.LazyFrame, str | None, str]:
    """``label_spans``, its labels as a query: which pattern wins is told in one pass over the distinct
    (kind, name) pairs, each pattern's regex run once per pair (``names``: ``label_names`` of those pairs,
    where the caller has them)."""
    if names is None:
        names = label_names(spans, ["kind", "name"], microbatch_regex)
    for k, (name, regex, among) in enumerate(_candidates(microbatch_regex)):
        hits = names["name"].filter(names[str(k)])
        if hits.len():
            found = spans.lazy().filter(among & pl.col("name").is_in(pl.lit(hits).implode()))
            return found, name.removesuffix(":work"), regex
    return spans.lazy().clear(), None, ""


def _candidates(microbatch_regex: str | None) -> list[tuple[str, str, pl.Expr]]:
    """(name, regex, the spans it looks among) of each label pattern, in the order they are tried: a custom
    regex first, among annotations (``custom``) then among work spans (``custom:work``)."""
    candidates = [(name, regex, _among(name)) for name, regex in LABEL_PATTERNS]
    if microbatch_regex:
        check_regex(microbatch_regex)
        candidates[:0] = [("custom", microbatch_regex, pl.col("kind") == "annotation"),
                          ("custom:work", microbatch_regex, pl.col("kind").is_in(PASS_KINDS))]
    return candidates


def _among(pattern: str) -> pl.Expr:
    """The spans a built-in pattern looks among: ranges, and for ``WORK_PATTERNS`` work spans too."""
    if pattern in WORK_PATTERNS:
        return pl.col("kind").is_in(("annotation", *PASS_KINDS))
    return pl.col("kind") == "annotation"


def label_names(spans: pl.DataFrame | pl.LazyFrame, columns: list[str | pl.Expr],
                microbatch_regex: str | None = None) -> pl.DataFrame:
    """The distinct ``columns`` of ``spans`` (``kind``, ``name`` and any others, such as ``rank``), each row
    with whether each pattern of ``_candidates`` finds its name a label (columns ``0``, ``1`` ... in their
    order): what ``label_choices`` and ``labels`` choose a pattern from, so one frame's names serve both."""
    return spans.lazy().select(columns).unique().with_columns(
        (among & pl.col("name").str.contains(regex)).alias(str(k))
        for k, (_, regex, among) in enumerate(_candidates(microbatch_regex))
    ).collect(engine=engine_for(spans))


def label_choices(spans: pl.DataFrame | pl.LazyFrame, microbatch_regex: str | None = None,
                  names: pl.DataFrame | None = None) -> dict[int, str | None]:
    """Per rank, the pattern ``label_spans`` would choose on that rank's spans alone, in one pass over the
    distinct names (``names``: their ``label_names``, with ``rank``, where the caller has them): ``custom`` (a
    custom regex found among annotations), ``custom:work`` (among work spans), a built-in pattern's name, or
    None. A spilled table's scan is read in a stream, never whole."""
    candidates = _candidates(microbatch_regex)
    if names is None:
        names = label_names(spans, ["rank", "kind", "name"], microbatch_regex)
    found = names.group_by("rank").agg(pl.col(str(k)).any() for k in range(len(candidates)))
    return {row[0]: next((name for (name, _, _), hit in zip(candidates, row[1:], strict=True) if hit), None)
            for row in found.iter_rows()}


def labels(spans: pl.DataFrame, microbatch_regex: str | None = None,
           names: pl.DataFrame | None = None) -> tuple[pl.DataFrame, str | None]:
    """Micro-batch labels (``LABEL_COLUMNS``) and which pattern matched (``names``: ``label_names`` of the
    distinct names of ``spans``, where the caller has them)."""
    found, pattern, regex = _chosen(spans, microbatch_regex, names)
    if pattern is None:
        empty = _with_key(found).with_columns(chunk=pl.lit(None, pl.Int32)).select(LABEL_COLUMNS)
        return empty.collect(engine=ENGINE), None
    return _label_frame(found, regex, spans), pattern


def _with_key(frame: pl.LazyFrame) -> pl.LazyFrame:
    own = pl.format("{}#{}", "lane", pl.col("stream").fill_null(-1))
    return frame.with_columns(key=pl.when(pl.col("device").is_null()).then("lane").otherwise(own))


def _label_frame(found: pl.LazyFrame, regex: str, spans: pl.DataFrame) -> pl.DataFrame:
    """The labels ``found`` (a query over ``spans``) as ``LABEL_COLUMNS``, in one query where their names
    give the micro-batch."""
    groups = re.compile(regex).groupindex
    frame = _with_key(found).with_columns(parts=pl.col("name").str.extract_groups(regex))

    def group(name: str) -> pl.Expr:
        return pl.col("parts").struct.field(name)

    short = group("short") if "short" in groups else None
    phase = _phase(group("phase"), short) if "phase" in groups else pl.lit("forward")
    frame = frame.with_columns(
        phase=phase,
        microbatch=group("mb").cast(pl.Int32, strict=False) if "mb" in groups else pl.lit(None, pl.Int32),
        chunk=group("chunk").cast(pl.Int32, strict=False) if "chunk" in groups else pl.lit(None, pl.Int32),
    ).filter(pl.col("phase").is_not_null())
    if "mb" in groups:
        pass
    elif "part" in groups:
        frame = _number_passes(_with_step(frame, spans).collect(engine=ENGINE), spans, regex).lazy()
    else:  # Megatron: the n-th forward (backward) range on a thread in a step is micro-batch n
        number = pl.int_range(pl.len()).over("key", "step", "phase").cast(pl.Int32)
        frame = _with_step(frame, spans).sort("start").with_columns(microbatch=number)
    return frame.select(LABEL_COLUMNS).sort("key", "start").collect(engine=ENGINE)


def _phase(word: pl.Expr, short: pl.Expr | None) -> pl.Expr:
    """forward, backward or weight from the label's phase word (``short`` where the label is spelled short);
    null for a word that names none."""
    if short is not None:
        word = pl.coalesce(word, short)
    word = word.str.to_lowercase().str.replace_all(r"[- ]", "_")
    return word.replace_strict(PHASES, default=None, return_dtype=pl.String)


def _with_step(frame: pl.LazyFrame, spans: pl.DataFrame) -> pl.LazyFrame:
    """``step``: which ProfilerStep on the label's thread it starts in (0 before the first, or without any),
    so labels numbered by order count afresh each step."""
    marks = spans.lazy().filter(pl.col("kind") == "step").select(key="lane", at="start").sort("key", "at")
    marks = marks.with_columns(step=pl.int_range(pl.len()).over("key").cast(pl.Int32))
    joined = frame.with_columns(at=pl.col("start")).sort("key", "at").join_asof(
        marks, on="at", by="key", strategy="backward", check_sortedness=False
    )
    return joined.with_columns(pl.col("step").fill_null(0)).drop("at")


def _number_passes(frame: pl.DataFrame, spans: pl.DataFrame, regex: str) -> pl.DataFrame:
    """Labels of parts of passes: a pass is the labels of one direction (forward; backward and weight) in one
    group (the enclosing range, or the run of labels outside any), the n-th of a direction on a thread in a
    step is micro-batch n."""
    held = frame.with_columns(container=_enclosing(frame, spans, regex)).sort("key", "start")
    direction = pl.when(pl.col("phase") == "forward").then(pl.lit("F")).otherwise(pl.lit("B"))
    held = held.with_columns(group=pl.col("container").rle_id().over("key"), direction=direction)
    number = pl.col("group").rank("dense").over("key", "step", "direction") - 1
    return held.with_columns(microbatch=number.cast(pl.Int32))


def _enclosing(frame: pl.DataFrame, spans: pl.DataFrame, regex: str) -> pl.Series:
    """Start of the innermost annotation range (not itself a label) holding each label on its thread, in
    ``frame``'s order; null for labels under none. Ranges that hold a label are looked up as of the label's
    start; when the nearest one closed before the label (a range of its own further in), the top-level one
    holding it is taken."""
    ranges = spans.filter(
        (pl.col("kind") == "annotation")
        & pl.col("lane").is_in(frame["key"].unique().implode())
        & ~pl.col("name").str.contains(regex)
    ).select(key="lane", start="start", end="end")
    firsts = frame.select("key", first="start", first_end="end").sort("key", "first")
    holders = (
        ranges.sort("key", "start")
        .join_asof(firsts, left_on="start", right_on="first", by="key", strategy="forward", check_sortedness=False)
        .filter(pl.col("first_end") <= pl.col("end"))
        .select("key", "start", "end")
    )
    probe = frame.select("key", "start", "end").with_row_index("row").sort("key", "start")
    for name, table in (("inner", holders), ("outer", top_level(holders, by="key"))):
        marks = table.select("key", pl.col("start").alias(f"{name}_start"), pl.col("end").alias(f"{name}_end"))
        probe = probe.join_asof(
            marks.sort("key", f"{name}_start"), left_on="start", right_on=f"{name}_start", by="key",
            strategy="backward", check_sortedness=False,
        )
    container = (
        pl.when(pl.col("inner_end") >= pl.col("end"))
        .then("inner_start")
        .when(pl.col("outer_end") >= pl.col("end"))
        .then("outer_start")
    )
    return probe.sort("row").select(container=container)["container"]


def attribute(work: pl.DataFrame, spans: pl.DataFrame, found: pl.DataFrame) -> pl.DataFrame:
    """Give each work span the (phase, microbatch, chunk) of the label holding its start (CPU work) or its
    launch call's start (GPU work); a kernel on a labelled stretch of its own stream (a kernel label) takes
    that label first. Spans under no label get null phase. ``launched`` is that CPU instant (null for GPU work
    without its launch); ``context`` names the top-level CPU operator that launched GPU work (the span's own
    name for CPU work), for inferring passes without labels; ``launch_lane`` the thread of that instant. One
    query."""
    spans, found = spans.lazy(), found.lazy()
    keyed = with_launch(work.lazy(), spans, key=EVENT_KEY)
    on_gpu = pl.col("device").is_not_null()
    keyed = keyed.with_columns(
        at=pl.when(on_gpu).then("at").otherwise("start"),
        at_lane=pl.when(on_gpu).then("at_lane").otherwise("lane"),
        own=pl.when(on_gpu).then(pl.format("{}#{}", "lane", pl.col("stream").fill_null(-1))),
    )
    on_cpu = found.filter(pl.col("device").is_null())
    joined = _look_up(keyed, on_cpu, "at_lane", "at", "cpu")
    joined = _look_up(joined, found.filter(pl.col("device").is_not_null()), "own", "start", "gpu")
    joined = _launch_context(joined, spans)
    label = [f"{side}_{c}" for side in ("gpu", "cpu") for c in ("phase", "mb", "chunk", "in")]
    take = pl.col("gpu_in").fill_null(False)
    return joined.with_columns(
        launched=pl.col("at"),
        launch_lane=pl.col("at_lane"),
        phase=pl.when(take).then("gpu_phase").when(pl.col("cpu_in").fill_null(False)).then("cpu_phase"),
        microbatch=pl.when(take).then("gpu_mb").when(pl.col("cpu_in").fill_null(False)).then("cpu_mb"),
        chunk=pl.when(take).then("gpu_chunk").when(pl.col("cpu_in").fill_null(False)).then("cpu_chunk"),
    ).drop("at_pid", "at", "at_lane", "own", *label).collect(engine=ENGINE)


def _look_up(keyed: pl.LazyFrame, found: pl.LazyFrame, by: str, at: str, side: str) -> pl.LazyFrame:
    """The latest label of ``found`` starting at or before ``at`` on key ``by``: its phase, microbatch and
    chunk, and ``{side}_in``, whether its range still holds ``at``."""
    marks = found.select(
        pl.col("key").alias(by), pl.col("start").alias(at), _end=pl.col("end"), **{
            f"{side}_phase": pl.col("phase"), f"{side}_mb": pl.col("microbatch"), f"{side}_chunk": pl.col("chunk")
        }
    ).sort(by, at)
    joined = keyed.sort(by, at).join_asof(marks, on=at, by=by, strategy="backward", check_sortedness=False)
    return joined.with_columns(**{f"{side}_in": pl.col(at) < pl.col("_end")}).drop("_end")


def _launch_context(keyed: pl.LazyFrame, spans: pl.LazyFrame) -> pl.LazyFrame:
    """``context``: the top-level CPU operator holding each GPU span's launch (autograd's for backward)."""
    top = top_level(spans.filter(pl.col("kind") == "cpu_op")).select(
        at_lane="lane", at="start", op_end="end", op_name="name"
    )
    joined = keyed.sort("at_lane", "at").join_asof(
        top.sort("at_lane", "at"), on="at", by="at_lane", strategy="backward", check_sortedness=False
    )
    launched = pl.col("device").is_not_null() & (pl.col("at") < pl.col("op_end"))
    return joined.with_columns(
        context=pl.when(pl.col("device").is_null()).then("name").when(launched).then("op_name")
    ).drop("op_end", "op_name")
