"""Reduce: every file's ``LaunchPart`` to the report's GPU annotations, launch queues and launch delays."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.launch import LaunchPart
from pipebubble.report.launches import AnnotatedKernel, GpuAnnotation, LaunchDelay, LaunchQueue
from pipebubble.report.names import short_names

TOP_KERNELS = 5  # kernels listed under each GPU annotation (by time); ``kernel_count`` counts them all
MAX_OPERATORS = 50  # operators listed by total launch delay

#: The note of a report some of whose traces were spilled and not read whole (``run.mapper._map_spilled``).
SKIPPED = ("GPU annotations, launch queues and launch delays: not computed for {} trace(s) spilled to disk "
           "(bigger than the memory budget)")


def _all(parts: list[LaunchPart], name: str) -> pl.LazyFrame:
    frames = [getattr(p, name).lazy() for p in parts if getattr(p, name).height]
    return pl.concat(frames, how="vertical_relaxed") if frames else getattr(LaunchPart(), name).lazy()


def gpu_annotations(parts: list[LaunchPart]) -> list[GpuAnnotation]:
    """Per annotation name over every file, the most GPU time first; its ``TOP_KERNELS`` kernels by time."""
    if all(p.annotations.is_empty() for p in parts):
        return []
    names = _all(parts, "annotations").group_by("name").agg(pl.all().sum()).sort(
        "gpu_ns", "name", descending=[True, False], nulls_last=True)
    kernels = _all(parts, "kernels").group_by("name", "kernel").agg(pl.col("count", "total").sum())
    top = kernels.sort("total", "kernel", descending=[True, False]).group_by("name", maintain_order=True).head(
        TOP_KERNELS)
    names, top = pl.collect_all([names, top])
    short = short_names(sorted(set(top["kernel"].to_list()))) if top.height else {}
    under: dict[str | None, list[AnnotatedKernel]] = {}
    for name, kernel, count, total in top.select("name", "kernel", "count", "total").iter_rows():
        under.setdefault(name, []).append(AnnotatedKernel(short.get(kernel), kernel, count, total))
    return [GpuAnnotation(r["name"], r["count"], r["gpu_ns"], r["sum_ns"], r["kernel_count"], r["kernel_ns"],
                          under.get(r["name"], [])) for r in names.iter_rows(named=True)]


def launch_queues(parts: list[LaunchPart]) -> list[LaunchQueue]:
    """Every GPU stream's launch queue, by lane and stream."""
    if all(p.queue.is_empty() for p in parts):
        return []
    rows = _all(parts, "queue").sort("lane", "stream", nulls_last=True).collect()
    return [LaunchQueue(**r) for r in rows.iter_rows(named=True)]


def launch_delays(parts: list[LaunchPart]) -> list[LaunchDelay]:
    """Per operator over every file, the ``MAX_OPERATORS`` with the most total launch delay first. Medians
    are exact: a file's own, or from the files' value counts when files are combined."""
    if all(p.delays.is_empty() for p in parts):
        return []
    merged = _all(parts, "delays").group_by("operator").agg(pl.col("count", "total", "kernel_total", "over").sum(),
                                                            pl.col("max").max(), median=pl.col("median").first())
    if len(parts) > 1 and any(p.delay_counts.height for p in parts):
        medians = _all(parts, "delay_counts").group_by("operator", "d").agg(pl.col("n").sum()).sort(
            "operator", "d").group_by("operator", maintain_order=True).agg(median=_counted_median())
        merged = merged.drop("median").join(medians, on="operator", how="left", nulls_equal=True)
    top = merged.sort("total", "operator", descending=[True, False], nulls_last=True).head(MAX_OPERATORS).collect()
    return [LaunchDelay(r["operator"], r["count"], r["total"], r["total"] / r["count"], float(r["median"]), r["max"],
                        r["kernel_total"] / r["count"], r["over"] / r["count"]) for r in top.iter_rows(named=True)]


def _counted_median() -> pl.Expr:
    """The exact median of values given as value counts (``d``, ``n``; rows in value order): the mean of the
    values at the two middle positions of the expanded list."""
    cum, count = pl.col("n").cum_sum(), pl.col("n").sum()
    return (pl.col("d").filter(cum > (count - 1) // 2).first() + pl.col("d").filter(cum > count // 2).first()) / 2


def skipped(parts: list[LaunchPart | None], metas: list[dict]) -> list[str]:
    """A note when spilled traces have no launch part (not read whole)."""
    count = sum(1 for p, meta in zip(parts, metas, strict=True) if meta.get("spill") and p is None)
    return [SKIPPED.format(count)] if count else []
