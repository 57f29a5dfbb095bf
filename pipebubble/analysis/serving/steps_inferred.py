"""Engine steps of LLM serving traces that carry no step labels, inferred (``source_label`` "inferred", no token
counts) from what engines leave in a profile anyway:

- the engine's per-step CPU frame when Python stacks were recorded (Kineto ``python_function``, our kind
  "annotation"): SGLang ``model_runner.py(N): forward``, vLLM ``gpu_model_runner.py(N): execute_model``. Inside
  it, SGLang calls ``forward_decode`` or ``forward_extend`` (``ForwardMode``), and ``cuda_graph_runner``'s
  ``replay`` when it replays a captured graph;
- otherwise, bursts of GPU work on a device lane separated by more than ``GPU_GAP_NS`` (the host's scheduling
  time between steps).

A step is decode when it replays a CUDA/HIP graph (vLLM and SGLang capture decode batches in graphs and run
prompts eagerly), runs decode-named attention or sits in a decode frame; prefill when it runs prompt attention
(varlen / prefill / context kernels) or sits in an extend frame; mixed when both; steps with neither sign are
dropped. Traces with backward kernels are training, not serving, and yield no steps; so do GPU bursts with no
decode among them (forward-only work that need not be an engine).

Steps from frames are timed as labelled steps are (``steps_llm.timed``: the longer of the frame and its GPU
work); a burst is its GPU work, so it is timed by it.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.launches import with_launch
from pipebubble.analysis.serving.steps_llm import STEP_COLUMNS, attach_gpu
from pipebubble.spans import GPU_WORK

STEP_FRAMES = r"(?:^|/)(?:gpu_)?model_runner\.py\(\d+\): (?:forward|execute_model)$"
DECODE_FRAMES = r": forward_decode$|cuda_graph_runner\.py\(\d+\): replay$"
PREFILL_FRAMES = r": forward_extend$"
GRAPH_LAUNCH = r"^(?:cuda|hip)GraphLaunch"
PREFILL_KERNELS = r"(?i)prefill|varlen|context_attention|flash_fwd_kernel|fmha_?fwd"
DECODE_KERNELS = r"(?i)decode|paged_?attention|splitkv|single_query"
TRAINING_KERNELS = r"(?i)bwd|backward"
GPU_GAP_NS = 200_000  # host time between engine steps; kernels of one step follow each other within µs


def _launched(spans: pl.DataFrame) -> pl.DataFrame:
    """GPU work with the thread lane, start and name of the runtime call that launched it (null if none); each
    GPU span once. A CUDA graph's kernels all carry their ``cudaGraphLaunch``'s correlation id."""
    gpu = spans.filter(pl.col("kind").is_in(GPU_WORK), pl.col("device").is_not_null())
    return with_launch(gpu, spans, name="call")


def _signs(frame: pl.DataFrame) -> pl.DataFrame:
    """Add ``cls`` from the boolean columns ``pre`` and ``dec``; drop rows with neither."""
    cls = (pl.when(pl.col("pre") & pl.col("dec")).then(pl.lit("mixed")).when(pl.col("pre"))
           .then(pl.lit("prefill")).when(pl.col("dec")).then(pl.lit("decode")))
    return frame.with_columns(cls=cls).filter(pl.col("cls").is_not_null())


def _finish(steps: pl.DataFrame) -> pl.DataFrame:
    nulls = {c: pl.lit(None, pl.Int64) for c in ("prefill_reqs", "prefill_tokens", "decode_reqs")}
    return steps.sort("lane", "start").with_columns(
        step=pl.int_range(pl.len()).cast(pl.Int64), source_label=pl.lit("inferred"), **nulls)


def _in_step(marks: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """``events`` (columns at_lane, at, ...) tagged with the step whose CPU span holds ``at`` on that thread."""
    return (events.sort("at").join_asof(marks, on="at", by="at_lane", strategy="backward", check_sortedness=False)
            .filter(pl.col("at") < pl.col("step_end")))


def from_frames(spans: pl.DataFrame, frames: pl.DataFrame) -> pl.DataFrame:
    """Steps from the engine's per-step CPU frames, classified by the frames and launches inside them."""
    steps = frames.sort("lane", "start").with_columns(step=pl.int_range(pl.len()).cast(pl.Int64))
    marks = steps.select("step", at_lane="lane", at="start", step_end="end").sort("at")
    cpu = spans.filter(pl.col("kind").is_in(["annotation", "runtime"]), pl.col("device").is_null()).select(
        "name", at_lane="lane", at="start")
    cpu_signs = _in_step(marks, cpu).group_by("step").agg(
        pre=pl.col("name").str.contains(PREFILL_FRAMES).any(),
        dec=(pl.col("name").str.contains(DECODE_FRAMES) | pl.col("name").str.contains(GRAPH_LAUNCH)).any())
    gpu_signs = _in_step(marks, _launched(spans).filter(pl.col("at").is_not_null())).group_by("step").agg(
        k_pre=pl.col("name").str.contains(PREFILL_KERNELS).any(),
        k_dec=pl.col("name").str.contains(DECODE_KERNELS).any())
    tagged = (steps.join(cpu_signs, on="step", how="left").join(gpu_signs, on="step", how="left")
              .with_columns(pre=pl.col("pre").fill_null(False) | pl.col("k_pre").fill_null(False),
                            dec=pl.col("dec").fill_null(False) | pl.col("k_dec").fill_null(False)))
    found = _finish(_signs(tagged).drop("step")).select(STEP_COLUMNS)
    return attach_gpu(found, spans)


def from_gpu_bursts(spans: pl.DataFrame) -> pl.DataFrame:
    """Steps as bursts of GPU work per device lane, classified by graph replay and kernel names."""
    work = _launched(spans).sort("lane", "start")
    gap = pl.col("start") - pl.col("end").cum_max().shift(1).over("lane")
    work = work.with_columns(burst=(gap > GPU_GAP_NS).fill_null(True).cum_sum().over("lane"))
    bursts = work.group_by("lane", "burst").agg(
        rank=pl.col("rank").first(), start=pl.col("start").min(), end=pl.col("end").max(),
        gpu_ns=(pl.col("end") - pl.col("start")).sum(), kernels=pl.len(), device=pl.col("device").first(),
        pre=pl.col("name").str.contains(PREFILL_KERNELS).any(),
        dec=(pl.col("call").fill_null("").str.contains(GRAPH_LAUNCH) | pl.col("name").str.contains(DECODE_KERNELS))
        .any())
    found = _signs(bursts)
    if not (found["cls"] != "prefill").any():  # forward-only work with no decode is not a serving engine
        return pl.DataFrame()
    found = _finish(found.with_columns(pid=pl.lit(None, pl.Int64), tid=pl.lit(None, pl.Int64),
                                       name=pl.lit("gpu burst")))
    return found.select(*STEP_COLUMNS, pl.col("start").alias("gpu_start"), pl.col("end").alias("gpu_end"),
                        "gpu_ns", "kernels", "device")


def infer_steps(spans: pl.DataFrame) -> pl.DataFrame:
    """Inferred engine steps (``STEP_COLUMNS`` plus ``attach_gpu``'s columns); empty for training traces and
    traces with no sign of prefill or decode."""
    if spans.filter(pl.col("kind") == "kernel", pl.col("name").str.contains(TRAINING_KERNELS)).height:
        return pl.DataFrame()
    frames = spans.filter(pl.col("kind") == "annotation", pl.col("device").is_null(),
                          pl.col("name").str.contains(STEP_FRAMES)).select(
        "lane", "rank", "pid", "tid", "name", "start", "end")
    return from_frames(spans, frames) if frames.height else from_gpu_bursts(spans)
