"""Preemptions: requests the engine evicted (KV cache full) and queued again, from the request table's
``preemptions``, ``requeue_ns``, ``lost_tokens`` and ``intervals`` (``requests_table``).

Every preemption is a ``requeue`` interval of its request: it begins at the preemption and lasts until the
request runs again, the time the preemption lost in the queue (its recompute is not counted: no event marks
where it ends). The engine beside each preemption is the traced scheduler step (vLLM's step tracing) that
started last at or before it: its queue, running batch and KV-cache use. Without the requeue waits, a
request's e2e (and, for a preemption before its first token, its TTFT) is shorter by them:
p99 (e2e − requeue) and p99 (TTFT − requeue before the first token), what the findings' worth compares.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.requests.latency import percentiles
from pipebubble.report.requests import Preemption, Preemptions

_EVENT = ("request_id", "at_ns", "requeue_ns")


def requeues(rows: pl.DataFrame) -> pl.DataFrame:
    """One row per preemption: its request, when (``at_ns``, on the rows' clock), its requeue wait, and
    whether it came before the request's first token."""
    flat = rows.select("request_id", "arrival", "ttft_ns", "intervals").explode("intervals").unnest("intervals")
    found = flat.filter(pl.col("phase") == "requeue", pl.col("arrival").is_not_null())
    return found.select("request_id", at_ns=pl.col("arrival") + pl.col("start"),
                        requeue_ns=pl.col("end") - pl.col("start"), before_first=pl.col("start") < pl.col("ttft_ns"))


def at_steps(events: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """``events`` (with ``at_ns``) with the traced step that started last at or before each: its ``step``,
    ``waiting``, ``running`` and ``kv_usage`` (null without such a step)."""
    kept = ("step", "waiting", "running", "kv_usage")
    if steps is None or steps.is_empty():
        return events.with_columns(pl.lit(None, pl.Int64).alias(k) for k in kept[:3]).with_columns(
            kv_usage=pl.lit(None, pl.Float64))
    ordered = steps.select("start", *kept).drop_nulls("start").sort("start")
    return events.sort("at_ns").join_asof(ordered, left_on="at_ns", right_on="start", strategy="backward",
                                          check_sortedness=False).drop("start")


def summarize(rows: pl.DataFrame, steps: pl.DataFrame | None) -> Preemptions | None:
    """The preemptions of ``rows`` (the request table on the job's clock); None where no request's source says
    whether it was preempted."""
    known = rows.filter(pl.col("preemptions").is_not_null())
    if known.is_empty():
        return None
    events = at_steps(requeues(known), steps)
    before = events.filter(pl.col("before_first")).group_by("request_id").agg(pl.col("requeue_ns").sum())
    ttft = known.join(before.rename({"requeue_ns": "early"}), on="request_id", how="left")
    lost = known["lost_tokens"]
    worst = events.sort("requeue_ns", "at_ns", descending=[True, False]).head(Preemptions.WORST)
    return Preemptions(
        known=known.height, requests=int((known["preemptions"] > 0).sum()), count=int(known["preemptions"].sum()),
        requeue_ns=int(known["requeue_ns"].sum()),
        lost_tokens=None if lost.null_count() == lost.len() else int(lost.sum()),
        kv_usage=percentiles(events["kv_usage"]),
        e2e_p99_ns=_p99(known["e2e_ns"]), e2e_p99_without_requeue_ns=_p99(known["e2e_ns"] - known["requeue_ns"]),
        ttft_p99_ns=_p99(known["ttft_ns"]),
        ttft_p99_without_requeue_ns=_p99(ttft["ttft_ns"] - ttft["early"].fill_null(0)),
        worst=[Preemption(**r) for r in worst.select(*_EVENT, "step", "waiting", "running", "kv_usage").iter_rows(
            named=True)])


def _p99(values: pl.Series) -> float | None:
    return (percentiles(values) or {}).get("p99")
