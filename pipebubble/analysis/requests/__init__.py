"""Served requests: the ``requests`` report section from the request table (``requests_table``), with the tail
attributed to engine steps where those are known (``tail``), and its findings (``findings``).

Pure functions over polars frames: ``summarize(requests, steps)`` -> ``Requests`` (None without requests).
Definitions and the percentile rule: ``latency``; attribution: ``tail``; preemptions: ``preemption``; the
scheduler steps an engine traced: ``step_trace``.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.requests import preemption, step_trace
from pipebubble.analysis.requests.latency import percentiles, ttft_split, with_tpot, without_queue_p99
from pipebubble.analysis.requests.tail import attribute
from pipebubble.report.requests import RequestRow, Requests

KV_CACHE_NOTE = "KV-cache occupancy: no KV-cache events among the inputs"


def summarize(requests: pl.DataFrame, steps: pl.DataFrame | None = None, kv: pl.DataFrame | None = None,
              traced: pl.DataFrame | None = None) -> Requests | None:
    """The section for ``requests`` (the request table of every file); ``steps``: engine steps from
    ``steps_llm.find_steps`` (with ``attach_gpu`` where possible) on the same clock, to attribute the tail;
    ``kv``: KV-cache allocations and releases (``requests_from_trace``), for its occupancy; ``traced``: the
    scheduler steps an engine traced (``requests_table.STEP_SCHEMA``)."""
    if requests.is_empty():
        return None
    cache = kv_cache(kv)
    rows = with_tpot(requests)
    ttft = percentiles(rows["ttft_ns"])
    attributed, why = attribute(rows, steps)
    window = rows.select(pl.col("completion").max() - pl.col("arrival").min()).item()
    return Requests(
        count=rows.height,
        **{c: percentiles(rows[c]) for c in ("ttft_ns", "queue_ns", "tpot_ns", "e2e_ns", "prefill_ns",
                                             "prompt_tokens", "completion_tokens")},
        with_tpot=int(rows["tpot_ns"].is_not_null().sum()),
        window_ns=window,
        ttft_split_ns=ttft_split(rows, ttft["p90"] if ttft else None),
        ttft_p99_without_queue_ns=without_queue_p99(rows),
        steps=attributed,
        kv_cache=cache,
        notes=[n for n in (why, None if cache or _kv_traced(traced) else KV_CACHE_NOTE) if n],
        rows=[RequestRow(**r) for r in rows.sort("arrival", nulls_last=True).select(
            "request_id", "queue_ns", "ttft_ns", "tpot_ns", "e2e_ns", "prefill_ns", "decode_ns", "prompt_tokens",
            "completion_tokens", "preemptions", "requeue_ns", "lost_tokens", arrival_ns="arrival").iter_rows(
            named=True)],
        requeue_ns=percentiles(rows["requeue_ns"]),
        preemption_counts=percentiles(rows["preemptions"]),
        preemptions=preemption.summarize(rows, traced),
        step_trace=step_trace.summarize(traced, rows, steps),
    )


def _kv_traced(traced: pl.DataFrame | None) -> bool:
    """Whether the engine's traced steps say how much of the KV cache was in use."""
    return traced is not None and traced["kv_usage"].drop_nulls().len() > 0


#: Points of the KV-cache occupancy timeline kept in the report.
KV_POINTS = 240


def kv_cache(kv: pl.DataFrame | None) -> dict | None:
    """The KV-cache's blocks in use over time: the peak and when, and at most ``KV_POINTS`` points (the most
    in use in each equal slice of time); None without KV-cache events."""
    if kv is None or kv.is_empty():
        return None
    kv = kv.sort("t")
    peak = kv.row(int(kv["blocks_used"].arg_max()), named=True)
    span = max(kv["t"].max() - kv["t"].min(), 1)
    slot = (pl.col("t") - kv["t"].min()) * (KV_POINTS - 1) // span
    points = kv.with_columns(slot=slot).group_by("slot", maintain_order=True).agg(
        pl.col("t").get(pl.col("blocks_used").arg_max()), pl.col("blocks_used").max())
    return {"peak_blocks": peak["blocks_used"], "peak_at_ns": peak["t"], "events": kv.height,
            "timeline": [[t, used] for _, t, used in points.iter_rows()]}
