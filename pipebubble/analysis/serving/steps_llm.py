"""Engine steps of LLM serving traces: find them from the labels engines emit, classify them, attach the
GPU work each one launched and time them.

Labels (CPU ranges: Kineto ``user_annotation`` / ``python_function``, Nsight NVTX), as the engines write them:
- vLLM ``execute_context_{c}({ctx_tokens})_generation_{g}({gen_tokens})`` and vLLM V1's detailed form
  ``execute_{n}_context_{c}(sq{ctx_tokens}sk..sqsq..sqsk..)_generation_{g}(sq{gen_tokens}sk..)``: n tokens
  scheduled, c requests prefilling, g requests decoding. When a group's parentheses carry no ``sq`` count,
  the prompt tokens are n less the generation tokens (one per decoding request when those are not given).
- SGLang ``step[EXTEND bs={bs} toks={toks}]`` and ``step[{MODE} bs={bs}]`` (ModelRunner's step span name; MODE
  is a ForwardMode name: DECODE, MIXED, IDLE, TARGET_VERIFY, ...).
- TensorRT-LLM PyExecutor NVTX ``[Executor] _forward_step {it}: {c} ctx reqs, {g} gen reqs`` (some releases add
  ``{t} ctx tokens``).
- Generic ``prefill[bs=.. toks=..]`` / ``decode[bs=..]`` / ``mixed[...]``.
- A user regex (``step_regex``) with named groups, all optional: ``mode`` (prefill|decode|mixed|idle, or an
  SGLang mode name), ``prefill_reqs``, ``prefill_tokens``, ``decode_reqs``, ``bs``, ``toks``.

A step's GPU work is every kernel, memcpy and memset whose launching runtime call (joined on source and
correlation id, and on the process where the format records it) starts inside the step's CPU range on the
same thread. A CUDA graph replay is one ``cudaGraphLaunch`` whose correlation id every kernel of the graph
carries (Kineto and Nsight both record it so; Nsight's graph-level trace is one span for the whole graph), so
the whole graph joins its step.

A step lasts max(its CPU range, the GPU span of its work), the GPU span running from its first GPU instant to
its last (``timed``): an engine that synchronises before its range closes is timed by the range, as before;
an asynchronous one (vLLM V1 async scheduling, CUDA graphs, TensorRT-LLM's overlap scheduler), whose range
closes while its GPU work still runs, by its GPU work. A step completes (``done``) when both have ended.
"""

from __future__ import annotations

import re

import polars as pl

from pipebubble.analysis.launches import with_launch
from pipebubble.spans import GPU_WORK

#: (source, regex). Named groups feed the same columns; see the module docstring.
LABEL_PATTERNS = (
    ("vllm", r"^execute_context_(?P<prefill_reqs>\d+)\((?P<prefill_tokens>\d+)\)"
             r"_generation_(?P<decode_reqs>\d+)\((?P<decode_tokens>\d+)\)$"),
    ("vllm", r"^execute_(?P<tokens>\d+)_context_(?P<prefill_reqs>\d+)\((?:sq)?(?P<prefill_tokens>\d+)?[^)]*\)"
             r"_generation_(?P<decode_reqs>\d+)\((?:sq)?(?P<decode_tokens>\d+)?[^)]*\)$"),
    ("sglang", r"^step\[(?P<mode>[A-Z_]+)\b[^\]]*?\bbs=(?P<bs>\d+)(?:\s+toks=(?P<toks>\d+))?\]$"),
    ("trtllm", r"^\[Executor\] _forward_step(?: (?P<iter>\d+))?: (?P<prefill_reqs>\d+) ctx reqs"
               r"(?:, (?P<prefill_tokens>\d+) ctx tokens)?, (?P<decode_reqs>\d+) gen reqs"),
    ("generic", r"^(?P<mode>prefill|decode|mixed)\[(?:[^\]]*?\bbs=(?P<bs>\d+))?(?:[^\]]*?\btoks=(?P<toks>\d+))?"
                r"[^\]]*\]$"),
)

#: Mode names (SGLang ForwardMode, generic and user labels) to step classes. EXTEND is prefill; speculative
#: verification and draft steps serve running requests, so they count as decode.
MODES = {
    "EXTEND": "prefill", "PREFILL": "prefill", "SPLIT_PREFILL": "prefill", "DLLM_EXTEND": "prefill",
    "DECODE": "decode", "TARGET_VERIFY": "decode", "DRAFT_EXTEND": "decode", "DRAFT_EXTEND_V2": "decode",
    "MIXED": "mixed", "IDLE": "idle", "DUMMY_FIRST": "idle",
}
CLASSES = ("prefill", "decode", "mixed", "idle")
_FIELDS = ("prefill_reqs", "prefill_tokens", "decode_reqs")
STEP_COLUMNS = ("step", "lane", "rank", "pid", "tid", "name", "start", "end", "cls", "source_label",
                *_FIELDS)


def _groups(regex: str) -> set[str]:
    return set(re.compile(regex).groupindex)


def _parse(labels: pl.DataFrame, source: str, regex: str) -> pl.DataFrame:
    """Rows of ``labels`` whose name matches ``regex``, with the step fields it names (null where absent)."""
    names = _groups(regex)
    hit = labels.filter(pl.col("name").str.contains(regex))
    if hit.is_empty():
        return pl.DataFrame()
    parts = hit.with_columns(pl.col("name").str.extract_groups(regex).alias("g")).unnest("g")

    def num(group: str) -> pl.Expr:
        return pl.col(group).cast(pl.Int64, strict=False) if group in names else pl.lit(None, pl.Int64)

    # vLLM V1 counts the tokens it scheduled: those not generated were prompt tokens.
    from_total = (num("tokens") - pl.coalesce(num("decode_tokens"), num("decode_reqs"))).clip(lower_bound=0)
    mode = pl.col("mode").str.to_uppercase() if "mode" in names else pl.lit(None, pl.String)
    cls = mode.replace_strict(MODES, default=None, return_dtype=pl.String)
    is_prefill_mode = cls == "prefill"
    is_decode_mode = cls == "decode"
    return parts.select(
        "lane", "rank", "pid", "tid", "name", "start", "end",
        mode_cls=cls,
        source_label=pl.lit(source),
        prefill_reqs=pl.coalesce(num("prefill_reqs"), pl.when(is_prefill_mode).then(num("bs"))),
        prefill_tokens=pl.coalesce(num("prefill_tokens"), from_total, pl.when(is_prefill_mode).then(num("toks"))),
        decode_reqs=pl.coalesce(num("decode_reqs"), pl.when(is_decode_mode).then(num("bs"))),
    )


def _classify() -> pl.Expr:
    """prefill (context only), decode (generation only), mixed, idle; an explicit mode wins over counts."""
    has_p = (pl.col("prefill_reqs").fill_null(0) > 0) | (pl.col("prefill_tokens").fill_null(0) > 0)
    has_d = pl.col("decode_reqs").fill_null(0) > 0
    counted = (pl.when(has_p & has_d).then(pl.lit("mixed")).when(has_p).then(pl.lit("prefill"))
               .when(has_d).then(pl.lit("decode")).otherwise(pl.lit("idle")))
    return pl.coalesce(pl.col("mode_cls"), counted)


def _innermost(found: pl.DataFrame) -> pl.DataFrame:
    """Drop a step label that holds the next step label on its thread (two engines' labels nested around one
    forward, e.g. a vLLM-style range around SGLang's ``step[...]``): keep the innermost."""
    ordered = found.sort("lane", "start", pl.col("end"), descending=[False, False, True])
    next_start = pl.col("start").shift(-1).over("lane")
    next_end = pl.col("end").shift(-1).over("lane")
    holds = (next_start >= pl.col("start")) & (next_end <= pl.col("end"))
    return ordered.filter(~holds.fill_null(False))


def find_steps(spans: pl.DataFrame, step_regex: str | None = None) -> pl.DataFrame:
    """One row per engine step (columns ``STEP_COLUMNS``), ordered by thread then start; empty when the trace
    holds no step labels. ``step_regex`` replaces the built-in patterns."""
    labels = spans.filter(pl.col("kind") == "annotation", pl.col("device").is_null()).select(
        "lane", "rank", "pid", "tid", "name", "start", "end")
    patterns = (("custom", step_regex),) if step_regex else LABEL_PATTERNS
    frames = [f for source, regex in patterns if not (f := _parse(labels, source, regex)).is_empty()]
    if not frames:
        text = {"lane", "name", "cls", "source_label"}
        return pl.DataFrame(schema={c: pl.String if c in text else pl.Int64 for c in STEP_COLUMNS})
    found = _innermost(pl.concat(frames, how="vertical_relaxed").unique(["lane", "start", "end"], keep="first"))
    return found.sort("lane", "start").with_columns(
        cls=_classify(), step=pl.int_range(pl.len()).cast(pl.Int64)).select(STEP_COLUMNS)


def launched_work(spans: pl.DataFrame) -> pl.DataFrame:
    """GPU work (kernels, copies, sets, collectives on a device) with the thread lane (``at_lane``) and start
    (``at``) of the runtime call that launched it; each GPU span once, work without its launch left out.
    Correlation ids are per file in Kineto (a GPU span has no pid) and per process in Nsight."""
    gpu = spans.filter(pl.col("kind").is_in(GPU_WORK), pl.col("device").is_not_null(),
                       pl.col("correlation").is_not_null())
    return with_launch(gpu, spans, how="inner")


def attach_gpu(steps: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Add per step: ``gpu_start``, ``gpu_end`` (first and last instant of the GPU work it launched),
    ``gpu_ns`` (summed GPU span time), ``kernels`` and ``device`` (null when it launched none)."""
    marks = steps.select("step", at_lane="lane", at="start", step_end="end").sort("at")
    owned = (launched_work(spans).sort("at")
             .join_asof(marks, on="at", by="at_lane", strategy="backward", check_sortedness=False)
             .filter(pl.col("at") < pl.col("step_end")))
    per_step = owned.group_by("step").agg(
        gpu_start=pl.col("start").min(), gpu_end=pl.col("end").max(),
        gpu_ns=(pl.col("end") - pl.col("start")).sum(), kernels=pl.len(),
        device=pl.col("device").mode().first())
    return steps.join(per_step, on="step", how="left").sort("step")


def timed(steps: pl.DataFrame) -> pl.DataFrame:
    """Add each step's clocks (ns): ``cpu_span`` (its range), ``gpu_span`` (first to last instant of its GPU
    work; null when it launched none), ``lag`` (first GPU instant − range start: how long its work waited to
    start), ``dur`` = max(cpu_span, gpu_span), ``done`` = max(range end, GPU end) and ``by_gpu`` (the GPU span
    is the longer: the range closed before the work it launched finished)."""
    missing = [pl.lit(None, pl.Int64).alias(c) for c in ("gpu_start", "gpu_end") if c not in steps.columns]
    spans = steps.with_columns(*missing).with_columns(
        cpu_span=pl.col("end") - pl.col("start"), gpu_span=pl.col("gpu_end") - pl.col("gpu_start"),
        lag=pl.col("gpu_start") - pl.col("start"))
    return spans.with_columns(
        dur=pl.max_horizontal("cpu_span", "gpu_span"), done=pl.max_horizontal("end", "gpu_end"),
        by_gpu=(pl.col("gpu_span") >= pl.col("cpu_span")).fill_null(False))
