"""Map: one file's allocator events summarised per device and per pipeline stage of the file.

The allocated total at an instant ``t`` is the total stated by the last event at or before ``t`` (before a
device's first event: that event's total less its bytes). A stage's memory is that of the device its work
ran on (its GPU lane, or its process's host memory for a CPU stage). Per stage and profiler step of its
passes (``window``: its first pass's start to its last pass's end):

- ``peak`` / ``peak_at``: the largest total inside the window, and when it was first reached;
- ``static``: the total at the window's start, before its first forward: no micro-batch in flight (weights,
  optimizer state, workspace, and gradients where they outlive a step);
- ``freed``: what a backward frees (its start's total less its end's), the median over backwards: the bytes
  one micro-batch holds from its forward until its backward;
- ``end``: the total at the window's end: less ``static``, what the step's micro-batches keep to its end
  (gradients, a last stage's outputs);
- ``inflight``: passes whose forward had begun and whose backward had not ended at the peak;
- ``outside``: the device's largest total outside every window of the stage (an optimizer step, say), which
  no pipeline setting changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

#: Points of a device's drawn timeline: the largest total in each of this many equal slices of its time.
TIMELINE_POINTS = 240

DEVICE_SCHEMA = {"lane": pl.String, "rank": pl.Int32, "device_type": pl.String, "device": pl.Int32,
                 "events": pl.UInt32, "peak_bytes": pl.Int64, "peak_at_ns": pl.Int64,
                 "reserved_peak_bytes": pl.Int64, "start_bytes": pl.Int64, "end_bytes": pl.Int64,
                 "baseline": pl.String}
STEP_SCHEMA = {"lane": pl.String, "step": pl.Int64, "peak_bytes": pl.Int64, "peak_at_ns": pl.Int64}
POINT_SCHEMA = {"lane": pl.String, "t": pl.Int64, "bytes": pl.Int64}
#: A stage's window: one per stage, device and profiler step of its passes.
KEY = ["stage", "lane", "step"]
STAGE_SCHEMA = {"stage": pl.Int32, "lane": pl.String, "step": pl.Int32, "peak_bytes": pl.Int64,
                "peak_at_ns": pl.Int64, "static_bytes": pl.Int64, "end_bytes": pl.Int64, "freed_bytes": pl.Int64,
                "forwards": pl.UInt32,
                "inflight": pl.UInt32, "chunks": pl.UInt32, "outside_bytes": pl.Int64}


@dataclass(frozen=True)
class MemoryPart:
    """One file's memory: ``devices`` (``DEVICE_SCHEMA``), per profiler step ``steps``, the drawn
    ``timeline`` points, and per stage of the file (the stage part's numbering) and step ``stages``."""

    devices: pl.DataFrame
    steps: pl.DataFrame
    timeline: pl.DataFrame
    stages: pl.DataFrame

    def shifted(self, offset: int) -> MemoryPart:
        """The part with ``offset`` taken off every time it holds (its file's clock moved onto the job's)."""
        at = pl.col("peak_at_ns") - offset
        return MemoryPart(self.devices.with_columns(peak_at_ns=at), self.steps.with_columns(peak_at_ns=at),
                          self.timeline.with_columns(t=pl.col("t") - offset), self.stages.with_columns(peak_at_ns=at))

    FRAMES = ("devices", "steps", "timeline", "stages")


def empty_part() -> MemoryPart:
    return MemoryPart(*(pl.DataFrame(schema=s) for s in (DEVICE_SCHEMA, STEP_SCHEMA, POINT_SCHEMA, STAGE_SCHEMA)))


def memory_part(memory: pl.DataFrame | None, steps: pl.DataFrame | None = None,
                work: pl.DataFrame | None = None) -> MemoryPart | None:
    """The file's memory part; None without allocator events. ``steps``: the file's profiler-step spans
    (``lane``, ``name``, ``start``, ``end``), ``work``: its stage part's work (``WORK_COLUMNS``)."""
    if memory is None or memory.is_empty():
        return None
    events = memory.select("lane", "rank", "device_type", "device", "ts", "bytes", "allocated", "reserved",
                           "baseline").sort("lane", "ts", maintain_order=True)
    return MemoryPart(_devices(events), _steps(events, steps), _timeline(events),
                      _stages(events, work) if work is not None and work.height else empty_part().stages)


def _devices(events: pl.DataFrame) -> pl.DataFrame:
    """One row per device lane: events, the peak and when it was first reached, the reserved peak, the
    totals before the first event and after the last."""
    return events.group_by("lane", maintain_order=True).agg(
        pl.col("rank").first(), pl.col("device_type").first(), pl.col("device").first(),
        events=pl.len().cast(pl.UInt32),
        peak_bytes=pl.col("allocated").max(),
        peak_at_ns=pl.col("ts").get(pl.col("allocated").arg_max()),
        reserved_peak_bytes=pl.col("reserved").max(),
        start_bytes=pl.col("allocated").first() - pl.col("bytes").first(),
        end_bytes=pl.col("allocated").last(),
        baseline=pl.col("baseline").first(),
    ).select(list(DEVICE_SCHEMA)).cast(DEVICE_SCHEMA)


def _steps(events: pl.DataFrame, steps: pl.DataFrame | None) -> pl.DataFrame:
    """Each profiler step's peak on each device of the file: ``ProfilerStep#N`` ranges, matched to the
    device's events by time (a step is the whole process's, so every device of the file is in it)."""
    if steps is None or steps.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    ranges = (steps.select(step=pl.col("name").str.extract(r"#(\d+)$").cast(pl.Int64), start="start", end="end")
              .drop_nulls("step").group_by("step").agg(pl.col("start").min(), pl.col("end").max()).sort("start"))
    if ranges.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    inside = (events.select("lane", "ts", "allocated").sort("ts")
              .join_asof(ranges, left_on="ts", right_on="start", strategy="backward")
              .filter(pl.col("step").is_not_null() & (pl.col("ts") <= pl.col("end"))))
    return inside.group_by("lane", "step").agg(
        peak_bytes=pl.col("allocated").max(), peak_at_ns=pl.col("ts").get(pl.col("allocated").arg_max())
    ).sort("lane", "step").cast(STEP_SCHEMA)


def _timeline(events: pl.DataFrame) -> pl.DataFrame:
    """At most ``TIMELINE_POINTS`` points per device: the largest total of each equal slice of its time
    and when it was reached (so the device's peak is one of them), plus its last total."""
    span = (pl.col("ts").max() - pl.col("ts").min()).over("lane")
    slot = ((pl.col("ts") - pl.col("ts").min().over("lane")) * (TIMELINE_POINTS - 1) // pl.max_horizontal(span, 1))
    peaks = events.with_columns(slot=slot).group_by("lane", "slot").agg(
        t=pl.col("ts").get(pl.col("allocated").arg_max()), bytes=pl.col("allocated").max())
    last = events.group_by("lane").agg(t=pl.col("ts").last(), bytes=pl.col("allocated").last())
    return (pl.concat([peaks.drop("slot"), last], how="vertical_relaxed").unique(["lane", "t"], keep="first")
            .sort("lane", "t").cast(POINT_SCHEMA))


def _stages(events: pl.DataFrame, work: pl.DataFrame) -> pl.DataFrame:
    """Per stage of the file and profiler step of its passes: peak, static, bytes held per forward, passes
    in flight at the peak, and the device's peak outside the stage's windows (module docstring)."""
    lanes = set(events["lane"].unique())
    passes = (
        work.filter(pl.col("phase").is_in(["forward", "backward"]) & pl.col("microbatch").is_not_null())
        .with_columns(lane=_memory_lane(pl.col("lane"), lanes))
        .filter(pl.col("lane").is_not_null())
        .group_by("stage", "lane", "step", "chunk", "microbatch", "phase")
        .agg(pl.col("start").min(), pl.col("end").max())
    )
    if passes.is_empty():
        return pl.DataFrame(schema=STAGE_SCHEMA)
    level = events.select("lane", "ts", "allocated", before=pl.col("allocated") - pl.col("bytes"))
    passes = _at(_at(passes, level, "start", "at_start"), level, "end", "at_end")
    windows = passes.group_by(KEY).agg(
        start=pl.col("start").min(), end=pl.col("end").max(), chunks=pl.col("chunk").n_unique().cast(pl.UInt32))
    windows = _at(windows, level, "end", "end_bytes")
    tagged = _windowed(events, windows)
    peaks = tagged.filter("inside").group_by(KEY).agg(
        peak_bytes=pl.col("allocated").max(), peak_at_ns=pl.col("ts").get(pl.col("allocated").arg_max()))
    # A window without an event inside still has a level: the one it starts at.
    windows = _at(windows, level, "start", "static_bytes").join(peaks, on=KEY, how="left", nulls_equal=True)
    windows = windows.with_columns(peak_at_ns=pl.coalesce("peak_at_ns", "start"),
                                   peak_bytes=pl.max_horizontal("peak_bytes", "static_bytes"))
    net = pl.col("at_end") - pl.col("at_start")
    forward = pl.col("phase") == "forward"
    held = passes.group_by(KEY).agg(
        freed_bytes=(-net).filter(~forward).median().round().cast(pl.Int64),
        forwards=forward.sum().cast(pl.UInt32))
    return (windows.join(held, on=KEY, how="left", nulls_equal=True)
            .join(_inflight(passes, windows), on=KEY, how="left", nulls_equal=True)
            .join(_outside(tagged), on=["stage", "lane"], how="left")
            .with_columns(pl.col("forwards").fill_null(0), pl.col("inflight").fill_null(0))
            .select(list(STAGE_SCHEMA)).cast(STAGE_SCHEMA).sort("stage", "step"))


def _memory_lane(work_lane: pl.Expr, lanes: set[str]) -> pl.Expr:
    """The memory lane of a stage's work: its own GPU lane when that has allocator events, else its
    process's host memory (``rank0/pid1/tid2`` → ``rank0/cpu``), else none."""
    host = work_lane.str.extract(r"^([^/]+)/", 1) + "/cpu"
    return (pl.when(work_lane.is_in(list(lanes))).then(work_lane)
            .when(host.is_in(list(lanes))).then(host))


def _at(frame: pl.DataFrame, level: pl.DataFrame, at: str, name: str) -> pl.DataFrame:
    """``frame`` with ``name``: its lane's allocated total at instant ``frame[at]``."""
    after = (frame.sort(at).join_asof(level.rename({"ts": "_ts"}).sort("_ts"), left_on=at, right_on="_ts",
                                      by="lane", strategy="backward", check_sortedness=False)
             .drop("_ts", "before").rename({"allocated": name}))
    first = level.group_by("lane").agg(_first=pl.col("before").first())
    return after.join(first, on="lane", how="left").with_columns(pl.coalesce(name, "_first")).drop("_first")


def _inflight(passes: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Per stage and step: (micro-batch, chunk) passes whose forward had begun and whose backward had not
    ended at the window's peak."""
    spans = passes.group_by("stage", "lane", "step", "chunk", "microbatch").agg(
        begun=pl.col("start").filter(pl.col("phase") == "forward").min(),
        freed=pl.col("end").filter(pl.col("phase") == "backward").max())
    at = spans.join(windows.select(*KEY, "peak_at_ns"), on=KEY, nulls_equal=True)
    peak = pl.col("peak_at_ns")
    held = (pl.col("begun") <= peak) & (pl.col("freed").is_null() | (pl.col("freed") > peak))
    return at.group_by(KEY).agg(inflight=held.sum().cast(pl.UInt32))


def _windowed(events: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Every event of a lane that holds a stage, once per such stage, with the step of the stage's window
    it falls in and whether it is inside that window; one pass, as the windows of a stage do not overlap."""
    starts = windows.select("stage", "lane", "step", "start", "end").sort("start")
    keyed = events.select("lane", "ts", "allocated").join(starts.select("stage", "lane").unique(), on="lane")
    tagged = keyed.sort("ts").join_asof(starts, left_on="ts", right_on="start", by=["stage", "lane"],
                                         strategy="backward", check_sortedness=False)
    return tagged.with_columns(inside=(pl.col("ts") <= pl.col("end")).fill_null(False))


def _outside(tagged: pl.DataFrame) -> pl.DataFrame:
    """Per stage: its device's largest total outside every window of the stage (null when none is)."""
    return tagged.group_by("stage", "lane").agg(outside_bytes=pl.col("allocated").filter(~pl.col("inside")).max())
