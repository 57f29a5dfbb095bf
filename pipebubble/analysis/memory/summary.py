"""Reduce: the files' memory parts as the report's ``memory`` section (``report.memory``), stages numbered as
the job's and times already on its clock (``alignment.shift`` moved them with the rest of each part)."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.memory.part import MemoryPart
from pipebubble.analysis.memory.predict import inflight_max
from pipebubble.analysis.pipeline.report import stacked
from pipebubble.analysis.schedule.schedules import SCHEDULES
from pipebubble.report import Pipeline
from pipebubble.report.memory import Memory, MemoryDevice, MemoryStage, MemoryStep


def memory_report(parts: list[tuple[MemoryPart | None, list[str] | None, dict]], stage_names: list[str],
                  pipeline: Pipeline | None) -> Memory | None:
    """``parts``: each file's memory part, the names of its stage part's stages (None without one) and its
    meta (``gpu_memory_bytes``: capacities); ``stage_names``: the job's stages in order. None when no file
    has allocator events."""
    present = [(m, names, meta) for m, names, meta in parts if m is not None]
    if not present:
        return None
    capacity = {lane: size for m, _, meta in present for lane, size in _capacities(m, meta).items()}
    devices = _devices(present, capacity)
    stages = _stages(present, stage_names, pipeline, capacity)
    notes = []
    if any(d.baseline == "trace" for d in devices):
        notes.append("some devices' totals are sums since the trace began (the format states no allocator "
                     "totals): memory held before it is not counted")
    return Memory(events=sum(d.events for d in devices), devices=devices, stages=stages, notes=notes)


def _capacities(part: MemoryPart, meta: dict) -> dict[str, int]:
    """Each GPU lane's memory in bytes, from the file's ``gpu_memory_bytes`` (device id -> bytes)."""
    sizes = {int(k): int(v) for k, v in (meta.get("gpu_memory_bytes") or {}).items()}
    rows = part.devices.filter(pl.col("device_type") != "cpu").select("lane", "device").iter_rows()
    return {lane: sizes[device] for lane, device in rows if device in sizes}


def _devices(present: list, capacity: dict[str, int]) -> list[MemoryDevice]:
    steps: dict[str, list[MemoryStep]] = {}
    points: dict[str, list[list[int]]] = {}
    for m, _, _ in present:
        for lane, step, peak, at in m.steps.iter_rows():
            steps.setdefault(lane, []).append(MemoryStep(step, peak, at))
        for lane, t, size in m.timeline.iter_rows():
            points.setdefault(lane, []).append([t, size])
    rows = pl.concat([m.devices for m, _, _ in present], how="vertical").sort("lane")
    return [MemoryDevice(**row, capacity_bytes=capacity.get(row["lane"]), steps=steps.get(row["lane"], []),
                         timeline=points.get(row["lane"], []))
            for row in rows.iter_rows(named=True)]


def _stages(present: list, stage_names: list[str], pipeline: Pipeline | None,
            capacity: dict[str, int]) -> list[MemoryStage]:
    """One row per stage of the job with memory: the step and device of its largest peak."""
    index = {name: k for k, name in enumerate(stage_names)}
    staged = [(m.stages, names) for m, names, _ in present if names and m.stages.height]
    if not staged:
        return []
    # each file's stage numbers to the job's: one join over every file's rows, not a query a file
    numbers = pl.DataFrame([(k, i, index.get(n)) for k, (_, names) in enumerate(staged) for i, n in enumerate(names)],
                           schema={"part": pl.Int64, "stage": pl.Int32, "job_stage": pl.Int32}, orient="row")
    rows = (stacked([frame for frame, _ in staged]).join(numbers, on=["part", "stage"], how="left")
            .with_columns(stage="job_stage").drop_nulls("stage")
            .sort("stage", "peak_bytes", "peak_at_ns", descending=[False, True, False])
            .unique("stage", keep="first", maintain_order=True))
    expected = _expected(pipeline)
    return [MemoryStage(stage=r["stage"], lanes=[r["lane"]], peak_bytes=r["peak_bytes"], peak_at_ns=r["peak_at_ns"],
                        static_bytes=r["static_bytes"], per_microbatch_bytes=r["freed_bytes"],
                        kept_per_microbatch_bytes=round((r["end_bytes"] - r["static_bytes"]) / r["forwards"])
                        if r["forwards"] else None,
                        inflight_at_peak=r["inflight"], expected_inflight=expected.get(r["stage"]),
                        forwards_measured=r["forwards"], capacity_bytes=capacity.get(r["lane"]),
                        outside_bytes=r["outside_bytes"], chunks=r["chunks"])
            for r in rows.iter_rows(named=True)]


def _expected(pipeline: Pipeline | None) -> dict[int, int]:
    """Per stage: the passes the measured schedule holds in flight at most (GPipe m, 1F1B p − s), counted as
    ``inflight_at_peak`` is (a chunk's pass is one); empty where the schedule or m is unknown."""
    if pipeline is None or pipeline.schedule not in SCHEDULES or not pipeline.microbatches:
        return {}
    v = pipeline.chunks if pipeline.schedule == "interleaved_1f1b" else 1
    most = inflight_max(pipeline.schedule, pipeline.stages, pipeline.microbatches, v)
    return {s: int(n * v) for s, n in enumerate(most)}
