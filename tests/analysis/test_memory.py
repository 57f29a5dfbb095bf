"""Memory analysis against hand-computed timelines: the map part (peak, static, bytes per micro-batch,
in flight at the peak, the peak outside the passes), the schedules' in-flight counts and the prediction."""

from __future__ import annotations

from fractions import Fraction

import polars as pl
import pytest

from pipebubble import allocations
from pipebubble.analysis.memory import inflight_max, memory_part, memory_report, predicted_peak
from pipebubble.analysis.pipeline.work import WORK_SCHEMA
from pipebubble.report import Pipeline


def events(rows, lane="rank0/cpu", totals=True):
    """Allocator events of one device from (ts, bytes); ``allocated`` the running total from 0."""
    frame = pl.DataFrame({"ts": [t for t, _ in rows], "bytes": [b for _, b in rows]})
    frame = frame.with_columns(
        rank=pl.lit(0), lane=pl.lit(lane), device_type=pl.lit("cpu" if lane.endswith("cpu") else "cuda"),
        device=pl.lit(None if lane.endswith("cpu") else 0),
        allocated=pl.col("bytes").cum_sum() if totals else pl.lit(None), reserved=pl.lit(None))
    if totals:
        frame = frame.with_columns(baseline=pl.lit("allocator"))
        return allocations.conform(frame)
    return allocations.with_running_totals(allocations.conform(frame))


def passes(rows, lane="rank0/pid1/tid1", step=1):
    """Work rows of stage 0 from (phase, microbatch, start, end)."""
    return pl.DataFrame(
        [{"stage": 0, "lane": lane, "role": "compute", "start": s, "end": e, "phase": ph, "microbatch": mb,
          "chunk": None, "step": step} for ph, mb, s, e in rows], schema=WORK_SCHEMA)


# Static 1000; F0 [10, 20] keeps 100 (a temporary of 50 comes and goes), F1 [20, 30] keeps 100, B0 [30, 40]
# allocates 30 for a while then frees mb 0, B1 [40, 50] frees mb 1; an optimizer step at 60 takes 500.
EVENTS = [(0, 1000), (12, 100), (14, 50), (16, -50), (22, 100), (32, 30), (35, -30), (38, -100), (48, -100),
          (60, 500), (61, -500)]
PASSES = [("forward", 0, 10, 20), ("forward", 1, 20, 30), ("backward", 0, 30, 40), ("backward", 1, 40, 50)]


def test_part_by_hand():
    part = memory_part(events(EVENTS), None, passes(PASSES))
    device = part.devices.row(0, named=True)
    assert (device["peak_bytes"], device["peak_at_ns"], device["start_bytes"], device["end_bytes"],
            device["events"]) == (1500, 60, 0, 1000, 11)
    stage = part.stages.row(0, named=True)
    assert stage["lane"] == "rank0/cpu"
    assert (stage["peak_bytes"], stage["peak_at_ns"], stage["static_bytes"], stage["end_bytes"], stage["freed_bytes"],
            stage["forwards"], stage["inflight"], stage["outside_bytes"]) == (1230, 32, 1000, 1000, 100, 2, 2, 1500)
    assert part.timeline.filter(pl.col("bytes") == 1500)["t"].to_list() == [60]


def test_gpu_stage_uses_its_gpu_lane_and_running_totals():
    rows = [(t, b) for t, b in EVENTS]
    part = memory_part(events(rows, lane="rank0/gpu0", totals=False), None, passes(PASSES, lane="rank0/gpu0"))
    assert part.devices["baseline"].to_list() == ["trace"]
    assert part.stages["lane"].to_list() == ["rank0/gpu0"]
    assert part.stages["peak_bytes"].to_list() == [1230]


def test_no_events_no_part():
    assert memory_part(None) is None
    assert memory_part(allocations.empty()) is None


def test_stage_without_memory_of_its_device():
    part = memory_part(events(EVENTS, lane="rank0/gpu1"), None, passes(PASSES, lane="rank0/gpu0"))
    assert part.stages.is_empty() and part.devices.height == 1


def test_steps_peaks():
    steps = pl.DataFrame({"lane": ["rank0/pid1/tid1"] * 2, "name": ["ProfilerStep#4", "ProfilerStep#5"],
                          "start": [0, 55], "end": [50, 70]})
    part = memory_part(events(EVENTS), steps)
    assert part.steps.select("step", "peak_bytes", "peak_at_ns").rows() == [(4, 1230, 32), (5, 1500, 60)]


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 16])
def test_inflight_of_schedules(p, m):
    assert inflight_max("gpipe", p, m) == tuple(Fraction(m) for _ in range(p))
    assert inflight_max("1f1b", p, m) == tuple(Fraction(min(p - s, m)) for s in range(p))


def test_inflight_interleaved_counts_chunks():
    most = inflight_max("interleaved_1f1b", 4, 8, 2)
    assert all(Fraction(1, 2) <= n <= 8 for n in most) and most[0] >= most[-1]


def test_prediction_same_global_batch():
    # Measured GPipe p=2, m=2, stage 0: static 1000, peak 1230, 100 bytes a micro-batch until its backward:
    # the order FFBB holds 200 at most, so a backward allocates 30 on top.
    measured = ("gpipe", 2, 1)
    # GPipe m=4 at the same global batch: 4 in flight of 50 each, and 15 on top: 1000 + 200 + 15.
    assert predicted_peak(1000, 1230, 100, 0, None, 0, 2, measured, ("gpipe", 4, 1)) == 1215
    # 1F1B m=8: stage 0 holds 2 of 25 at most, 7.5 on top: 1057.5, rounded half to even.
    assert predicted_peak(1000, 1230, 100, 0, None, 0, 2, measured, ("1f1b", 8, 1)) == 1058
    # A forward that keeps 20 more to the step's end: held 240 at m=2 (the peak is 10 under it); at m=4,
    # 4 x 60 - 5.
    assert predicted_peak(1000, 1230, 100, 20, None, 0, 2, measured, ("gpipe", 4, 1)) == 1235
    # At today's micro-batch size (the global batch grows): GPipe m=4 holds 400.
    assert predicted_peak(1000, 1230, 100, 0, None, 0, 2, measured, ("gpipe", 4, 1), Fraction(1)) == 1430
    # An optimizer step's larger peak outside the passes stays; no bytes per micro-batch, no prediction.
    assert predicted_peak(1000, 1230, 100, 0, 1500, 0, 2, measured, ("gpipe", 4, 1)) == 1500
    assert predicted_peak(1000, 1230, None, 0, None, 0, 2, measured, ("gpipe", 4, 1)) is None
    # The measured shape predicts the measured peak.
    assert predicted_peak(1000, 1230, 100, 20, None, 0, 2, measured, measured) == 1230


def test_report_numbers_stages_and_expected():
    part = memory_part(events(EVENTS), None, passes(PASSES))
    pipeline = Pipeline(stages=2, microbatches=2, schedule="gpipe", chunks=1, window_ns=50, window_start_ns=0,
                        bubble_fraction=0.3, theoretical_bubble_fraction=0.3, excess_bubble_fraction=0.0,
                        excess_causes={}, stage_time_cv=0.0, imbalance=1.0, throughput_bound=1.0,
                        pipeline_efficiency=1.0)
    memory = memory_report([(part, ["rank0"], {}), (None, ["rank1"], {})], ["rank0", "rank1"], pipeline)
    assert memory.events == 11 and [d.lane for d in memory.devices] == ["rank0/cpu"]
    (stage,) = memory.stages
    assert (stage.stage, stage.peak_bytes, stage.static_bytes, stage.per_microbatch_bytes, stage.inflight_at_peak,
            stage.expected_inflight) == (0, 1230, 1000, 100, 2, 2)
    assert memory_report([(None, None, {})], [], None) is None


def test_capacity_from_device_properties():
    part = memory_part(events(EVENTS, lane="rank0/gpu0"), None, passes(PASSES, lane="rank0/gpu0"))
    memory = memory_report([(part, ["s0"], {"gpu_memory_bytes": {"0": 4096}})], ["s0"], None)
    assert memory.devices[0].capacity_bytes == 4096 and memory.stages[0].capacity_bytes == 4096


def stage_memory(stage, static=1000, peak=1230, held=100, inflight=2, capacity=None, outside=None):
    from pipebubble.report.memory import MemoryStage

    return MemoryStage(stage=stage, lanes=[f"rank{stage}/gpu0"], peak_bytes=peak, peak_at_ns=0, static_bytes=static,
                       per_microbatch_bytes=held, inflight_at_peak=inflight, capacity_bytes=capacity,
                       outside_bytes=outside)


def pipeline_with(recs, schedule="gpipe", p=2, m=2):
    return Pipeline(stages=p, microbatches=m, schedule=schedule, chunks=1, window_ns=50, window_start_ns=0,
                    bubble_fraction=0.3, theoretical_bubble_fraction=0.3, excess_bubble_fraction=0.0,
                    excess_causes={}, stage_time_cv=0.0, imbalance=1.0, throughput_bound=1.0,
                    pipeline_efficiency=1.0, recommendations=recs)


def rec(label, schedule, m, v=1):
    from pipebubble.report import Recommendation

    return Recommendation(label, schedule, m, v, 100, 0.1, 1.0)


def test_rows_gain_predicted_peak_and_fits():
    from pipebubble.analysis.memory.fit import with_memory
    from pipebubble.report.memory import Memory

    memory = Memory(events=1, stages=[stage_memory(0), stage_memory(1, static=500)])
    recs = [rec("current: gpipe, m=2", "gpipe", 2), rec("m=4", "gpipe", 4), rec("1f1b", "1f1b", 2)]
    out = with_memory(pipeline_with(recs), memory, limit=1220)
    current, m4, one = out.recommendations
    assert (current.peak_memory_bytes, current.fits) == (1230, False)
    assert (m4.peak_memory_bytes, m4.fits) == (1215, True)  # 1000 + 4 x 50 + 15
    assert one.peak_memory_bytes == 1230  # 1F1B p=2 m=2: stage 0 holds 2, as GPipe does
    # No limit and no capacity: fits unknown; a capacity decides per stage.
    assert with_memory(pipeline_with(recs), memory, None).recommendations[1].fits is None
    memory = Memory(events=1, stages=[stage_memory(0, capacity=1215), stage_memory(1, static=500, capacity=1215)])
    assert with_memory(pipeline_with(recs), memory, None).recommendations[1].fits is True


def test_without_memory_rows_are_unmeasured():
    from pipebubble.analysis.memory.fit import with_memory

    recs = [rec("current: gpipe, m=2", "gpipe", 2)]
    out = with_memory(pipeline_with(recs), None, limit=10)
    assert out.recommendations[0].peak_memory_bytes is None and out.recommendations[0].fits is None


def test_largest_m_at_todays_microbatch_size():
    from pipebubble.analysis.memory.fit import with_memory
    from pipebubble.report.memory import Memory

    memory = Memory(events=1, stages=[stage_memory(0), stage_memory(1, static=500)])
    recs = [rec("current: gpipe, m=2", "gpipe", 2)]
    # GPipe at 100 bytes a micro-batch (and a transient of 30): m fits while 1000 + 100 m + 30 <= 1530.
    out = with_memory(pipeline_with(recs), memory, limit=1530)
    assert out.notes[-1].startswith("memory: the largest m that fits at today's micro-batch size is 5 ")
    out = with_memory(pipeline_with(recs, schedule="1f1b"), memory, limit=1530)
    assert "every m up to" in out.notes[-1]
