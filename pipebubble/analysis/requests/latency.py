"""Per-request latencies and their percentiles (ARCHITECTURE.md, "Request").

Per request: queue = arrival → scheduled (as the source states it), TTFT = arrival → first token, e2e =
arrival → completion, TPOT = (e2e − TTFT) / (completion tokens − 1), null with fewer than two output tokens
(no interval between tokens to time) or an unknown TTFT or e2e.

Percentiles are linear interpolation between the closest ranks (numpy's default, Hyndman & Fan type 7; polars
``quantile(q, interpolation="linear")``): for n sorted values x₀..xₙ₋₁, position h = (n − 1)·q and
p = x⌊h⌋ + (h − ⌊h⌋)·(x⌊h⌋₊₁ − x⌊h⌋). Nulls are left out; no value gives null.

TTFT's parts: queue, prefill (scheduled → first token, vLLM's ``time_in_model_prefill``) and the rest (arrival
to entering the queue, the front end's tokenising and hand-off, and the first token's way back), each as its
mean over the requests that state all three, for all of them and for the tail (TTFT at or above its p90), so
the three add up to the group's mean TTFT.
"""

from __future__ import annotations

import polars as pl

from pipebubble.report.requests import Quantiles, Split

PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def with_tpot(requests: pl.DataFrame) -> pl.DataFrame:
    """The request table with ``tpot_ns`` (float ns; null where it is not defined, see the module docstring)."""
    tokens = pl.col("completion_tokens")
    decode = pl.col("e2e_ns") - pl.col("ttft_ns")
    return requests.with_columns(tpot_ns=pl.when(tokens >= 2).then(decode / (tokens - 1)))


def percentiles(values: pl.Series) -> Quantiles | None:
    """p50, p90 and p99 of ``values`` (linear interpolation), None when it holds no value."""
    values = values.drop_nulls()
    if values.is_empty():
        return None
    return {name: values.quantile(q, interpolation="linear") for name, q in PERCENTILES}


def ttft_split(requests: pl.DataFrame, ttft_p90: float | None) -> dict[str, Split] | None:
    """Mean queue, prefill and other time of TTFT over the requests stating all three parts, and over those of
    them at or above ``ttft_p90``; None when no request states them."""
    known = requests.filter(pl.all_horizontal(pl.col("ttft_ns", "queue_ns", "prefill_ns").is_not_null()))
    if known.is_empty():
        return None
    parts = known.select(queue="queue_ns", prefill="prefill_ns",
                         other=pl.col("ttft_ns") - pl.col("queue_ns") - pl.col("prefill_ns"),
                         ttft="ttft_ns")
    tail = parts.filter(pl.col("ttft") >= ttft_p90) if ttft_p90 is not None else parts.clear()
    return {"all": _means(parts), "tail": _means(tail)}


def _means(parts: pl.DataFrame) -> Split:
    row = parts.select(pl.col("queue", "prefill", "other").mean()).row(0, named=True)
    return {k: (None if v is None else float(v)) for k, v in row.items()}


def without_queue_p99(requests: pl.DataFrame) -> float | None:
    """p99 of TTFT − queue: the tail TTFT had no request waited in the queue."""
    rest = requests.select(pl.col("ttft_ns") - pl.col("queue_ns")).to_series().drop_nulls()
    return None if rest.is_empty() else rest.quantile(0.99, interpolation="linear")
