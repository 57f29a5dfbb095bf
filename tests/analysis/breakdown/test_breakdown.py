"""The GPU time breakdown, kernel and host summaries on hand-computed timelines."""

from __future__ import annotations

import polars as pl
import pytest

from pipebubble import spans
from pipebubble.analysis import breakdown as bd


def table(rows: list[tuple]) -> pl.DataFrame:
    """Spans from (kind, name, start, end, device, correlation, lane) rows of rank 0."""
    frame = pl.DataFrame(
        rows, schema=["kind", "name", "start", "end", "device", "correlation", "lane"], orient="row"
    ).with_columns(
        source=pl.lit("t"), rank=pl.lit(0), pid=pl.when(pl.col("device").is_null()).then(pl.lit(7)),
        tid=pl.when(pl.col("device").is_null()).then(pl.lit(1)),
        stream=pl.when(pl.col("device").is_not_null()).then(pl.lit(7)),
    )
    return spans.conform(frame)


GPU, CPU = "rank0/gpu0", "rank0/pid7/tid1"
#: compute [0,10) and [30,40), comm [5,20), memcpy [18,25); the compute at 30 launched at 27 (the GPU went
#: idle at 25: the host was late: [25,27) its thread ran nothing traced, [27,30) the launch call and its
#: latency); two profiler steps [0,22) and [22,45).
TIMELINE = [
    ("kernel", "gemm", 0, 10, 0, 1, GPU),
    ("comm", "ncclDevKernel_AllReduce", 5, 20, 0, 2, GPU),
    ("memcpy", "Memcpy DtoH", 18, 25, 0, 3, GPU),
    ("kernel", "gemm", 30, 40, 0, 4, GPU),
    ("runtime", "cudaLaunchKernel", -5, -4, None, 1, CPU),
    ("runtime", "cudaLaunchKernel", 27, 28, None, 4, CPU),
    ("step", "ProfilerStep#3", 0, 22, None, None, CPU),
    ("step", "ProfilerStep#4", 22, 45, None, None, CPU),
]


def rows(frame: pl.DataFrame) -> dict:
    return {r.step: r for r in bd.gpu_part(frame).rows}


def test_whole_window_breakdown_adds_up_to_the_window():
    whole = rows(table(TIMELINE))[None]
    assert (whole.window_start_ns, whole.window_ns) == (0, 40)
    assert (whole.compute_ns, whole.comm_ns, whole.comm_exposed_ns) == (20, 15, 10)
    assert (whole.memory_ns, whole.memory_exposed_ns, whole.idle_ns) == (7, 5, 5)
    assert _nonzero(whole.idle_causes) == {"python": 2, "launch": 3}
    assert whole.overlap == pytest.approx(5 / 15)  # [5,10) of the comm is under compute


def test_step_rows_clip_work_to_each_step():
    by_step = rows(table(TIMELINE))
    three, four = by_step[3], by_step[4]
    assert (three.window_ns, three.compute_ns, three.comm_exposed_ns, three.memory_exposed_ns, three.idle_ns) == (
        22, 10, 10, 2, 0)
    # step 4: memcpy [22,25), compute [30,40); idle [25,30) the host's late launch, [40,45) after the work
    assert (four.window_ns, four.compute_ns, four.memory_exposed_ns, four.idle_ns) == (23, 10, 3, 10)
    assert _nonzero(four.idle_causes) == {"python": 2, "launch": 3, "unknown": 5}
    for row in by_step.values():
        assert row.compute_ns + row.comm_exposed_ns + row.memory_exposed_ns + row.idle_ns == row.window_ns
        assert sum(row.idle_causes.values()) == row.idle_ns


def _nonzero(causes: dict) -> dict:
    return {k: v for k, v in causes.items() if v}


@pytest.mark.parametrize(
    ("blocker", "causes"),
    [
        (("sync", "cudaStreamSynchronize", 24, 26), {"sync_stall": 5}),  # the GPU ran dry in it: the refill is its
        (("runtime", "cudaMemcpy", 24, 26), {"blocking_copy": 5}),
        (("runtime", "cudaFree", 24, 26), {"allocator": 5}),
        (("cpu_op", "c10d::recv_", 20, 27), {"peer": 2, "launch": 3}),  # waiting for a peer until it returned
        (("cpu_op", "aten::index", 23, 26), {"cpu_ops": 1, "python": 1, "launch": 3}),
        (None, {"python": 2, "launch": 3}),
    ],
)
def test_a_gap_is_caused_by_what_the_launching_thread_was_doing(blocker, causes):
    extra = [(*blocker, None, None, CPU)] if blocker else []
    whole = rows(table(TIMELINE + extra))[None]
    assert _nonzero(whole.idle_causes) == causes


def test_a_gap_whose_next_op_was_launched_before_it_is_a_dependency():
    early = [r if r[5] != 4 or r[0] != "runtime" else ("runtime", "cudaLaunchKernel", 12, 13, None, 4, CPU)
             for r in TIMELINE]
    assert _nonzero(rows(table(early))[None].idle_causes) == {"dependency": 5}


def test_kernel_summary_has_exact_medians_across_files():
    a = bd.gpu_part(table([("kernel", "k", 0, 10, 0, None, GPU), ("kernel", "k", 20, 40, 0, None, GPU)]))
    b = bd.gpu_part(table([("kernel", "k", 0, 30, 0, None, GPU), ("kernel", "k", 50, 90, 0, None, GPU),
                           ("memset", "Memset", 100, 110, 0, None, GPU)]))
    k, m = bd.kernels([a, b])
    assert (k.name, k.kind, k.count, k.total_ns, k.min_ns, k.max_ns) == ("k", "compute", 4, 100, 10, 40)
    assert (k.mean_ns, k.median_ns) == (25.0, 25.0)  # durations 10, 20, 30, 40
    assert k.std_ns == pytest.approx(125**0.5)
    assert (m.kind, m.count, m.share, k.share) == ("memset", 1, pytest.approx(10 / 110), pytest.approx(100 / 110))


def test_host_summary_counts_calls_delays_and_short_kernels():
    part = bd.gpu_part(table(TIMELINE))
    host = bd.host([part])
    (api,) = host.api
    assert (api.name, api.count, api.total_ns, api.max_ns) == ("cudaLaunchKernel", 2, 2, 1)
    assert (host.launches, host.launch_delay_max_ns, host.launch_delay_median_ns) == (2, 5, 4.0)  # 5 and 3 ns
    assert host.short_kernels == 3  # the kernels and the comm kernel are shorter than 10 µs; memcpy is not counted


def test_no_gpu_work_gives_no_rows():
    part = bd.gpu_part(table([("cpu_op", "aten::mm", 0, 10, None, None, CPU)]))
    assert part.rows == [] and bd.kernels([part]) == []


def test_launch_delay_median_is_exact_over_files():
    """Two files, delays 5 and 3 ns each: the median of 3, 3, 5, 5 is 4; one more delay of 9 ns makes it 5."""
    one = bd.gpu_part(table(TIMELINE))
    extra = bd.gpu_part(table([("kernel", "k", 9, 10, 0, 9, GPU), ("runtime", "cudaLaunchKernel", 0, 1, None, 9, CPU)]))
    assert bd.host([one, one]).launch_delay_median_ns == 4.0
    assert bd.host([one, one, extra]).launch_delay_median_ns == 5.0
