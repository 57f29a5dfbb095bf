"""The requests' tail attributed to engine steps (``steps_llm``), joined on the wall clock.

The steps are one engine thread's (the one with the most steps: tensor-parallel ranks repeat the same steps,
and requests do not say which engine served them), timed as ``steps_llm.timed`` does (max of the CPU range
and its GPU work). Only requests that arrive and complete within the steps' window are attributed; requests
from OTLP are on epoch ns, so the steps must be too (a Kineto trace of the same run).

A step "in" a window is one that starts inside it (from running counts joined as-of at both ends, one sorted
pass instead of a request × step join):
- a request's decode (first token → completion) *shared* a step with prompt work when a prefill or mixed step
  lies in it; TPOT without interference = (e2e − TTFT − Σ excess) / (tokens − 1), the excess of a prompt step
  being its duration less the median pure-decode step (clipped at 0): the request's TPOT had each such step
  run as fast as a decode step;
- the prompt tokens that ran while a request waited (arrival → scheduled): what it queued behind.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.requests.latency import percentiles
from pipebubble.analysis.serving.steps_llm import timed
from pipebubble.report.requests import Group, Steps

_PROMPT = ("prefill", "mixed")


def attribute(requests: pl.DataFrame, steps: pl.DataFrame | None) -> tuple[Steps | None, str | None]:
    """The ``Steps`` part of the section for requests with ``tpot_ns`` (``latency.with_tpot``), or None and
    why not (None, None without steps)."""
    if steps is None or steps.is_empty():
        return None, None
    lane = steps.group_by("lane").len().sort(["len", "lane"], descending=[True, False])["lane"][0]
    engine = _running(timed(steps.filter(pl.col("lane") == lane)))
    first, last = engine["start"].min(), engine["done"].max()
    inside = requests.filter(pl.col("arrival") >= first, pl.col("completion") <= last)
    if inside.is_empty():
        return None, "no request lies within the engine steps' window (are both on the same clock?)"
    joined = _between(_between(inside, engine, "first_token", "completion", "decode"), engine, "arrival",
                      "scheduled", "queue")
    return _summary(joined, lane, engine.height), None


def _running(steps: pl.DataFrame) -> pl.DataFrame:
    """Steps in start order with running counts: prompt steps, their excess over the median decode step, and
    prompt tokens."""
    decode_p50 = steps.filter(pl.col("cls") == "decode")["dur"].median()
    prompt = pl.col("cls").is_in(_PROMPT)
    excess = (pl.col("dur") - decode_p50).clip(lower_bound=0) if decode_p50 is not None else pl.lit(None)
    return steps.sort("start").select(
        "start", "done", prompt_steps=prompt.cast(pl.Int64).cum_sum(),
        excess=pl.when(prompt).then(excess).otherwise(0).cast(pl.Float64).cum_sum(),
        tokens=pl.when(prompt).then(pl.col("prefill_tokens").fill_null(0)).otherwise(0).cast(pl.Int64).cum_sum())


def _between(requests: pl.DataFrame, engine: pl.DataFrame, lo: str, hi: str, name: str) -> pl.DataFrame:
    """``{name}_prompt_steps``, ``{name}_excess`` and ``{name}_tokens``: the running counts' growth over the
    steps that start in [lo, hi) of each request (null where either end is unknown)."""
    counts = ("prompt_steps", "excess", "tokens")
    marks = engine.select("start", *counts)
    at = []
    for end in (lo, hi):
        keyed = requests.with_row_index("_row").select("_row", end).drop_nulls().sort(end)
        found = keyed.join_asof(marks, left_on=end, right_on="start", strategy="backward",
                                allow_exact_matches=False, check_sortedness=False)
        at.append(found.select("_row", *(pl.col(c).fill_null(0).alias(f"{c}_{end}") for c in counts)))
    out = requests.with_row_index("_row").join(at[0], on="_row", how="left").join(at[1], on="_row", how="left")
    grown = [(pl.col(f"{c}_{hi}") - pl.col(f"{c}_{lo}")).alias(f"{name}_{c}") for c in counts]
    return out.with_columns(grown).drop("_row", *(f"{c}_{e}" for c in counts for e in (lo, hi)))


def _summary(joined: pl.DataFrame, lane: str, steps: int) -> Steps:
    tokens = pl.col("completion_tokens")
    without = (pl.col("e2e_ns") - pl.col("ttft_ns") - pl.col("decode_excess")).clip(lower_bound=0) / (tokens - 1)
    rows = joined.with_columns(tpot_without=pl.when(tokens >= 2).then(without))
    shared = rows.filter(pl.col("decode_prompt_steps") > 0)
    apart = rows.filter(pl.col("decode_prompt_steps") == 0)
    p99 = (percentiles(rows["tpot_without"]) or {}).get("p99")
    return Steps(lane, steps, joined.height, _group(shared), _group(apart), p99, _ahead(rows))


def _group(rows: pl.DataFrame) -> Group:
    return Group(rows.height, percentiles(rows["tpot_ns"]))


def _ahead(rows: pl.DataFrame) -> dict[str, float | None] | None:
    """Median prompt tokens run while waiting, for the queue's tail (queue >= its p90) and the rest."""
    known = rows.filter(pl.col("queue_tokens").is_not_null(), pl.col("queue_ns").is_not_null())
    if known.is_empty():
        return None
    p90 = known["queue_ns"].quantile(0.9, interpolation="linear")
    tail = pl.col("queue_ns") >= p90
    return {"tail": known.filter(tail)["queue_tokens"].median(), "rest": known.filter(~tail)["queue_tokens"].median()}
