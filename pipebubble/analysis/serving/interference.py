"""Prefill/decode interference in LLM serving: how much a step that carries prompt work slows the decodes in it.

Definitions (ARCHITECTURE.md; SARATHI, Agrawal et al., OSDI 2024, for chunking and step uniformity):
- A step's duration is max(its CPU range, the GPU span of the work it launched) (``steps_llm.timed``): the
  range where the engine synchronises before closing it, the GPU work where it does not (async engines). Every
  number below uses it; ``clock`` says which of the two timed most steps that launched GPU work.
- decode_slowdown_when_mixed = median(mixed step) / median(pure-decode step).
- Time between tokens (TBT) proxy: on one engine thread, the time from the completion of one step that carries
  decodes to the completion of the next (each such step emits one token per decoding request); a step
  completes when its range and its GPU work have both ended, so overlapping steps (async scheduling: step
  n+1's range runs while step n's GPU work executes) are measured completion to completion, not range to
  range. An interval that holds prompt work (a mixed step, or prefill-only steps that made the decodes wait)
  is an interference episode; decode_slowdown_when_prefill = median(episode) / median(interval of pure-decode
  steps), which also covers engines that never mix (decodes stall behind whole-prompt steps).
- generation_stalls: TBT intervals above ``STALL_FACTOR`` x the median interval.
- ms_per_1k_prefill_tokens: b in the least-squares fit dur = a + b·prefill_tokens + c·decode_requests over
  non-idle steps; chunk_for_slo_tokens = (SLO − a − c·median decode batch) / b: the prompt tokens a step can add
  to the running decodes and stay under the time-between-tokens SLO (SARATHI's token budget).
- step_cv: standard deviation / mean of non-idle step durations, the non-uniformity chunking aims to shrink.
- host_gap_ns: the host time between one CPU range's end and the next's start, per thread.
- gpu_idle_between_steps_ns: Σ max(0, next step's first GPU instant − this step's last), per thread.
- overlapped_steps: steps whose range opened before the previous step on their thread completed.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.serving.steps_inferred import infer_steps
from pipebubble.analysis.serving.steps_llm import CLASSES, attach_gpu, find_steps, timed
from pipebubble.report import Episode, Interference, Segment, StepClass

STALL_FACTOR = 3.0
WORST = 5
_Q = (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))


def _ratio(num: float | None, den: float | None) -> float | None:
    """A ratio as the JSON report has always written it: 4 decimals."""
    return round(num / den, 4) if num is not None and den else None


def _median(frame: pl.DataFrame, col: str) -> float | None:
    return frame[col].median() if frame.height else None


def _quantiles(values: pl.Series) -> dict[str, float | None] | None:
    values = values.drop_nulls()
    return {k: values.quantile(q, interpolation="linear") for k, q in _Q} if values.len() else None


def _classes(steps: pl.DataFrame) -> list[StepClass]:
    """Every step class (``CLASSES`` order): its count, the quantiles of its durations and of their parts (CPU
    range; GPU span and launch lag of the steps that launched GPU work; None when none ran) and the median GPU
    span."""
    out = []
    for cls in CLASSES:
        of = steps.filter(pl.col("cls") == cls)
        gpu = of["gpu_span"].drop_nulls()
        out.append(StepClass(cls, of.height, _quantiles(of["dur"]), gpu.median() if gpu.len() else None,
                             _quantiles(of["cpu_span"]), _quantiles(gpu), _quantiles(of["lag"])))
    return out


def tbt_intervals(steps: pl.DataFrame) -> pl.DataFrame:
    """One row per decode-carrying step that follows another on its thread (``timed`` steps, in order of
    completion): ``start`` (the previous one's completion), ``dur`` (the TBT proxy), ``prefill_tokens`` and
    ``prefill_steps`` completed in between (this step included), the ending step's ``cls``, ``decode_reqs``
    and ``step``."""
    marked = steps.sort("lane", "done", "start").with_columns(
        cum_tokens=pl.col("prefill_tokens").fill_null(0).cum_sum().over("lane"),
        cum_pf=pl.col("cls").is_in(["prefill", "mixed"]).cast(pl.Int64).cum_sum().over("lane"))
    dec = marked.filter((pl.col("decode_reqs").fill_null(0) > 0) | pl.col("cls").is_in(["decode", "mixed"]))
    prev = pl.col("done").shift(1).over("lane")
    return dec.with_columns(
        start=prev, dur=pl.col("done") - prev,
        prefill_tokens=pl.col("cum_tokens") - pl.col("cum_tokens").shift(1).over("lane"),
        prefill_steps=pl.col("cum_pf") - pl.col("cum_pf").shift(1).over("lane"),
    ).filter(pl.col("start").is_not_null()).select(
        "step", "lane", "start", "dur", "cls", "decode_reqs", "prefill_tokens", "prefill_steps")


def _fit(steps: pl.DataFrame) -> tuple[float, float, float] | None:
    """Least squares dur = a + b·prefill_tokens + c·decode_requests over non-idle steps (normal equations on
    centred sums); (a, b, c) in ns, or None when prefill tokens never vary. Falls back to c = 0 when decode
    requests do not vary independently (all steps alike, or no counts in the labels)."""
    pts = steps.filter(pl.col("cls") != "idle").select(
        x=pl.col("prefill_tokens").fill_null(0).cast(pl.Float64),
        z=pl.col("decode_reqs").fill_null(0).cast(pl.Float64), y=pl.col("dur").cast(pl.Float64))
    if pts["x"].n_unique() < 2:
        return None
    c = pts.select(x=pl.col("x") - pl.col("x").mean(), z=pl.col("z") - pl.col("z").mean(),
                   y=pl.col("y") - pl.col("y").mean())
    sxx, szz, sxz, sxy, szy = (c.select(e).item() for e in (
        (pl.col("x") ** 2).sum(), (pl.col("z") ** 2).sum(), (pl.col("x") * pl.col("z")).sum(),
        (pl.col("x") * pl.col("y")).sum(), (pl.col("z") * pl.col("y")).sum()))
    det = sxx * szz - sxz * sxz
    if det > 1e-9 * sxx * max(szz, 1.0):
        b, cz = (szz * sxy - sxz * szy) / det, (sxx * szy - sxz * sxy) / det
    else:
        b, cz = sxy / sxx, 0.0
    a = pts["y"].mean() - b * pts["x"].mean() - cz * pts["z"].mean()
    return a, b, cz


def _chunk_for_slo(fit: tuple[float, float, float] | None, decodes: float | None,
                   slo_ms: float | None) -> int | None:
    """Prompt tokens a step may carry beside the typical decode batch and stay under the SLO:
    (SLO − a − c·decodes) / b."""
    if fit is None or fit[1] <= 0 or slo_ms is None:
        return None
    a, b, c = fit
    return max(0, int((slo_ms * 1e6 - a - c * (decodes or 0.0)) / b))


def _gpu_idle(steps: pl.DataFrame) -> int | None:
    if steps["gpu_start"].is_null().all():
        return None
    ran = steps.filter(pl.col("gpu_start").is_not_null()).sort("lane", "start")
    gap = pl.col("gpu_start") - pl.col("gpu_end").shift(1).over("lane")
    return int(ran.select(gap.clip(lower_bound=0).sum()).item() or 0)


def _episodes(tbt: pl.DataFrame, base: float | None) -> list[Episode]:
    """The worst TBT intervals that held prompt work, slowest first."""
    if not base:
        return []
    worst = tbt.filter(pl.col("prefill_steps") > 0).sort("dur", descending=True).head(WORST)
    return [Episode(r["start"], r["dur"], r["cls"] if r["cls"] == "mixed" else "prefill", r["prefill_tokens"],
                    r["decode_reqs"], round(r["dur"] / base, 4)) for r in worst.iter_rows(named=True)]


def _tbt_section(steps: pl.DataFrame) -> dict:
    """The time-between-tokens fields of ``Interference``."""
    tbt = tbt_intervals(steps)
    pure = tbt.filter(pl.col("prefill_steps") == 0)
    hit = tbt.filter(pl.col("prefill_steps") > 0)
    median = _median(tbt, "dur")
    stalls = tbt.filter(pl.col("dur") > STALL_FACTOR * median).height if median else 0
    return {
        "tbt_ns": {"p50": median, "p99": tbt["dur"].quantile(0.99) if tbt.height else None},
        "tbt_intervals": tbt.height,
        "generation_stalls": stalls,
        "decode_slowdown_when_prefill": _ratio(_median(hit, "dur"), _median(pure, "dur")),
        "worst_episodes": _episodes(tbt, _median(pure, "dur")),
    }


def _clock_section(steps: pl.DataFrame) -> dict:
    """Which clock timed the steps, in fields and in words: the GPU when most steps that launched GPU work
    outlasted their range on it, else the CPU ranges."""
    with_gpu = int(steps["gpu_span"].is_not_null().sum())
    by_gpu = int(steps["by_gpu"].sum())
    previous_done = pl.col("done").shift(1).over("lane")
    overlapped = int(steps.sort("lane", "start").select((pl.col("start") < previous_done).sum()).item() or 0)
    clock = "gpu" if with_gpu and 2 * by_gpu > with_gpu else "cpu"
    if not with_gpu:
        note = "timed by CPU ranges: no GPU work was launched from the steps"
    elif steps["name"].eq("gpu burst").all():
        note = "timed by GPU work: the steps are bursts of GPU work (no CPU ranges)"
    elif clock == "gpu":
        note = (f"timed by GPU work: CPU ranges close before the GPU finishes (async engine); "
                f"steps longer on the GPU than their range: {by_gpu} of {with_gpu}")
    else:
        note = "timed by CPU ranges: the engine synchronises, the GPU work ends inside each range"
        note += f"; steps longer on the GPU than their range, timed by it: {by_gpu} of {with_gpu}" if by_gpu else ""
    return {"clock": clock, "clock_note": note, "steps_timed_by_gpu": by_gpu, "steps_with_gpu_work": with_gpu,
            "overlapped_steps": overlapped}


def _segments(steps: pl.DataFrame) -> list[Segment]:
    """One timeline segment per non-idle step: on its GPU (its launched work) when it launched any, else on
    stage 0 (its CPU span)."""
    rows = steps.filter(pl.col("cls") != "idle").iter_rows(named=True)
    return [Segment(stage=int(r["device"]) if r.get("device") is not None else 0,
                    start_ns=r["gpu_start"] if r["gpu_start"] is not None else r["start"],
                    end_ns=r["gpu_end"] if r["gpu_end"] is not None else r["end"],
                    phase=r["cls"], step=r["step"], lane=r["lane"]) for r in rows]


def _source(steps: pl.DataFrame) -> str:
    return "+".join(s if s == "inferred" else f"labels:{s}" for s in sorted(steps["source_label"].unique().to_list()))


def summarize(steps: pl.DataFrame, tbt_slo_ms: float | None = None) -> Interference:
    """The report section for steps from ``find_steps`` (with ``attach_gpu`` columns where available)."""
    steps = timed(steps)
    decode_med = _median(steps.filter(pl.col("cls") == "decode"), "dur")
    busy = steps.filter(pl.col("cls") != "idle")["dur"]
    fit = _fit(steps)
    decodes = steps.filter(pl.col("decode_reqs").fill_null(0) > 0)["decode_reqs"].median()
    gaps = steps.sort("lane", "start").select(
        (pl.col("start") - pl.col("end").shift(1).over("lane")).alias("gap")).drop_nulls()["gap"]
    return Interference(
        steps=steps.height,
        classes=_classes(steps),
        source=_source(steps),
        decode_slowdown_when_mixed=_ratio(_median(steps.filter(pl.col("cls") == "mixed"), "dur"), decode_med),
        **_tbt_section(steps),
        ns_per_1k_prefill_tokens=fit[1] * 1000 if fit else None,
        ns_per_decode_request=fit[2] if fit else None,
        step_fit_intercept_ns=fit[0] if fit else None,
        chunk_for_slo_tokens=_chunk_for_slo(fit, decodes, tbt_slo_ms),
        tbt_slo_ms=tbt_slo_ms,
        step_cv=round(busy.std() / busy.mean(), 4) if busy.len() > 1 and busy.mean() else None,
        host_gap_ns={"p50": gaps.median(), "p99": gaps.quantile(0.99)} if gaps.len() else None,
        gpu_idle_between_steps_ns=_gpu_idle(steps),
        engine_threads=steps["lane"].n_unique(),
        **_clock_section(steps),
    )


def interference(spans: pl.DataFrame, *, step_regex: str | None = None,
                 tbt_slo_ms: float | None = None) -> tuple[Interference | None, list[Segment]]:
    """The ``interference`` report section and per-step timeline segments; (None, []) without engine steps.
    Without step labels (and without ``step_regex``), steps are inferred (``steps_inferred``)."""
    steps = find_steps(spans, step_regex)
    steps = attach_gpu(steps, spans) if steps.height or step_regex else infer_steps(spans)
    if steps.is_empty():
        return None, []
    return summarize(steps, tbt_slo_ms), _segments(timed(steps))
