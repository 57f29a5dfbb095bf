"""The scheduler steps an engine traced (vLLM's step tracing: ``requests_table.STEP_SCHEMA``), over time and
against the requests that waited through them, on the job's clock.

- coverage: steps traced / (last step id − first + 1); step tracing samples steps, so sums over steps count
  the traced ones only;
- a step is *prefill-heavy* when its prefill tokens are at least half the tokens it scheduled;
- a request waits through the steps that start in [arrival, first token) (an inequality join, the whole job
  at once); for the TTFT tail (TTFT at or above its p90) and the rest: the requests, the traced steps they
  waited through (mean per request), the mean queue of those steps, their peak KV-cache use and the share
  that were prefill-heavy;
- TTFT without prefill-heavy steps: TTFT − Σ over the prefill-heavy steps it waited through of (the step's
  duration − the median duration of the other steps, at least 0); its p99 is what the finding's worth
  compares;
- Kineto serving steps (``steps_llm``, same clock): a traced step matches the engine step whose start is
  nearest its own, where the two overlap; per match, the Kineto step's class.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.requests.latency import percentiles
from pipebubble.analysis.serving.steps_llm import timed
from pipebubble.report.requests import StepTrace

HEAVY = 0.5


def summarize(steps: pl.DataFrame | None, requests: pl.DataFrame, kineto: pl.DataFrame | None = None
              ) -> StepTrace | None:
    """The section's ``step_trace`` (None without traced steps)."""
    if steps is None or steps.is_empty():
        return None
    steps = with_heavy(steps)
    ids = steps["step"].drop_nulls()
    peak = steps.drop_nulls("kv_usage").sort("kv_usage", "end", descending=[True, False]).head(1)
    waited = waited_through(requests, steps)
    return StepTrace(
        steps=steps.height, coverage=None if ids.is_empty() else steps.height / (ids.max() - ids.min() + 1),
        waiting=percentiles(steps["waiting"]), running=percentiles(steps["running"]),
        kv_usage=percentiles(steps["kv_usage"]), kv_peak=peak["kv_usage"].first() if peak.height else None,
        kv_peak_at_ns=peak["end"].first() if peak.height else None, prefill_heavy=int(steps["heavy"].sum()),
        preempted=int(steps["preempted"].fill_null(0).sum()), timeline=timeline(steps),
        ttft_steps=_groups(waited), ttft_p99_without_prefill_heavy_ns=(
            percentiles(waited["ttft_without"]) or {}).get("p99") if waited.height else None,
        kineto=matched(steps, kineto))


def with_heavy(steps: pl.DataFrame) -> pl.DataFrame:
    """The steps with ``heavy`` (prefill-heavy) and ``dur``."""
    scheduled = pl.coalesce("scheduled_tokens", pl.col("prefill_tokens") + pl.col("decode_tokens"))
    return steps.with_columns(heavy=(pl.col("prefill_tokens") >= HEAVY * scheduled).fill_null(False)
                              & (scheduled > 0).fill_null(False), dur=pl.col("end") - pl.col("start"))


def waited_through(requests: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Per request with an arrival and a first token: the traced steps it waited through, their mean queue,
    peak KV use, prefill-heavy count and excess, and its TTFT without that excess (module docstring)."""
    rows = requests.filter(pl.col("arrival").is_not_null(), pl.col("first_token").is_not_null()).select(
        "arrival", "first_token", "ttft_ns", req=pl.int_range(pl.len()))
    other = steps.filter(~pl.col("heavy"))["dur"].median()
    excess = (pl.col("dur") - other).clip(lower_bound=0) if other is not None else pl.lit(0)
    marked = steps.select("start", "waiting", "kv_usage", "heavy", excess=pl.when("heavy").then(excess).otherwise(0))
    pairs = rows.join_where(marked, pl.col("start") >= pl.col("arrival"), pl.col("start") < pl.col("first_token"))
    per = pairs.group_by("req").agg(steps=pl.len(), waiting=pl.col("waiting").mean(), kv_peak=pl.col("kv_usage").max(),
                                    heavy=pl.col("heavy").sum(), excess=pl.col("excess").sum())
    out = rows.join(per, on="req", how="left").with_columns(pl.col("steps", "heavy", "excess").fill_null(0))
    return out.with_columns(ttft_without=pl.col("ttft_ns") - pl.col("excess"))


def _groups(waited: pl.DataFrame) -> dict | None:
    """The TTFT tail against the rest (module docstring)."""
    known = waited.filter(pl.col("ttft_ns").is_not_null())
    if known.is_empty():
        return None
    p90 = known["ttft_ns"].quantile(0.9, interpolation="linear")
    tail = pl.col("ttft_ns") >= p90

    def group(rows: pl.DataFrame) -> dict:
        total = rows["steps"].sum()
        return {"requests": rows.height, "steps_per_request": rows["steps"].mean() if rows.height else None,
                "waiting": rows["waiting"].mean(), "kv_peak": rows["kv_peak"].max(),
                "prefill_heavy_share": rows["heavy"].sum() / total if total else None}

    return {"tail": group(known.filter(tail)), "rest": group(known.filter(~tail))}


def timeline(steps: pl.DataFrame) -> list[list]:
    """At most ``StepTrace.POINTS`` points: per equal slice of time, the step with the most KV use in it."""
    span = max(steps["end"].max() - steps["end"].min(), 1)
    slot = (pl.col("end") - steps["end"].min()) * (StepTrace.POINTS - 1) // span
    kept = ("end", "waiting", "running", "prefill_tokens", "decode_tokens", "kv_usage")
    picked = steps.sort("end").with_columns(slot=slot).group_by("slot", maintain_order=True).agg(
        pl.col(c).get(pl.col("kv_usage").fill_null(-1.0).arg_max()) for c in kept)
    return [list(r) for r in picked.select(kept).iter_rows()]


def matched(steps: pl.DataFrame, kineto: pl.DataFrame | None) -> dict | None:
    """How many traced steps match a Kineto serving step (module docstring), and the classes of the matches
    of prefill-heavy and of other traced steps; None without Kineto steps."""
    if kineto is None or kineto.is_empty():
        return None
    engine = timed(kineto).select(k_start="start", k_done="done", cls="cls").sort("k_start")
    found = steps.sort("start").join_asof(engine, left_on="start", right_on="k_start", strategy="nearest",
                                          check_sortedness=False)
    hit = found.filter(pl.col("k_done") > pl.col("start"), pl.col("k_start") < pl.col("end"))

    def classes(rows: pl.DataFrame) -> dict[str, int]:
        return dict(sorted(rows.group_by("cls").len().iter_rows()))

    return {"matched": hit.height, "steps": steps.height, "heavy": classes(hit.filter("heavy")),
            "other": classes(hit.filter(~pl.col("heavy")))}
