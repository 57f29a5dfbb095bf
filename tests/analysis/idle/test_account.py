"""The idle account (``analysis/idle``): hand-computed gaps of each cause, the operators and calls named, and
the property that every gap is tiled exactly once by its pieces, whatever the host did."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble import spans
from pipebubble.analysis.breakdown.part import inputs
from pipebubble.report.idle import CAUSES

US = 1_000
GPU, CPU = "rank0/gpu0", "rank0/pid7/tid1"


def table(rows: list[tuple]) -> pl.DataFrame:
    """Spans from (kind, name, start, end, correlation) rows of rank 0: GPU kinds on ``GPU``, the rest on ``CPU``."""
    frame = pl.DataFrame(rows, schema=["kind", "name", "start", "end", "correlation"], orient="row")
    gpu = pl.col("kind").is_in(spans.GPU_WORK)
    return spans.conform(frame.with_columns(
        source=pl.lit("t"), rank=pl.lit(0), pid=pl.lit(7), tid=pl.when(~gpu).then(pl.lit(1)),
        device=pl.when(gpu).then(pl.lit(0)), stream=pl.when(gpu).then(pl.lit(7)),
        lane=pl.when(gpu).then(pl.lit(GPU)).otherwise(pl.lit(CPU)),
    ))


def account(rows: list[tuple]) -> pl.DataFrame:
    return inputs(table(rows)).pieces


def by_cause(pieces: pl.DataFrame) -> dict[str, int]:
    summed = pieces.group_by("cause").agg((pl.col("end") - pl.col("start")).sum())
    return dict(summed.iter_rows())


def test_the_refill_after_a_long_sync_belongs_to_the_sync():
    """The host blocks 9.805 ms in a sync inside aten::to (it was that far ahead of the GPU), then launches
    kernels one by one, each after the GPU ran dry: those gaps lie within 9.805 ms of the sync's return, so
    they are the sync's; a gap of 30 ms that begins in the refill is the sync's only up to its end."""
    rows = [("kernel", "k", 0, 10_000 * US, 1), ("runtime", "cudaLaunchKernel", -50, -40, 1),
            ("cpu_op", "aten::to", 100 * US, 10_010 * US, None),
            ("sync", "cudaStreamSynchronize", 200 * US, 10_005 * US, None)]
    t = 10_005 * US
    for k in range(2, 6):  # a kernel 100 µs after each launch: 4 gaps after the sync
        rows += [("runtime", "cudaLaunchKernel", t + 200 * US, t + 210 * US, k),
                 ("kernel", "k", t + 220 * US, t + 320 * US, k)]
        t += 320 * US
    late = t + 30_000 * US
    rows += [("runtime", "cudaLaunchKernel", late, late + 10 * US, 9),
             ("kernel", "k", late + 20 * US, late + 50 * US, 9)]
    pieces = account(rows)
    refill = pieces.filter(pl.col("gap") < pieces["gap"].max())
    assert set(refill["cause"]) == {"sync_stall"} and refill["gap"].n_unique() == 4
    assert set(refill["op"]) == {"aten::to"} and set(refill["call"]) == {"cudaStreamSynchronize"}
    last = pieces.filter(pl.col("gap") == pieces["gap"].max())
    reach = 10_005 * US + (10_005 - 200) * US  # the sync's return plus how long it blocked
    assert by_cause(last) == {"sync_stall": reach - t, "python": late - reach, "launch": 20 * US}


def test_a_blocking_copy_that_holds_a_launched_kernel_back_is_the_copy():
    """The sglang shape: a kernel launched 40 µs after the GPU ran dry starts only when a 490 ms blocking copy
    (hipMemcpyWithStream in aten::to) returns: the launch's own time is launch, the rest the blocking copy."""
    ms = 1_000 * US
    rows = [("kernel", "k", 0, 1 * ms, 1), ("runtime", "hipLaunchKernel", -50, -40, 1),
            ("runtime", "hipLaunchKernel", 1 * ms + 40 * US, 1 * ms + 45 * US, 2),
            ("cpu_op", "aten::to", 1 * ms + 80 * US, 491 * ms + 10 * US, None),
            ("runtime", "hipMemcpyWithStream", 1 * ms + 90 * US, 491 * ms, 3),
            ("kernel", "resolve", 491 * ms - 10 * US, 491 * ms - 5 * US, 2),
            ("memcpy", "Memcpy HtoD", 491 * ms - 5 * US, 491 * ms - 1 * US, 3)]
    pieces = account(rows)
    causes = by_cause(pieces)
    assert causes["python"] == 40 * US and causes["launch"] == 55 * US
    assert causes["blocking_copy"] == 490 * ms - 10 * US - 95 * US - 40 * US + 40 * US
    copy = pieces.filter(pl.col("cause") == "blocking_copy")
    assert set(copy["op"]) == {"aten::to"} and set(copy["call"]) == {"hipMemcpyWithStream"}


def test_an_async_copy_that_returns_after_its_copy_blocks_whatever_its_name():
    """cudaMemcpyAsync to pageable memory returns once its copy is done: the GPU ran dry while the thread was
    in it (130 µs), so the gap is a blocking copy up to 130 µs after its return; then the host's own."""
    rows = [("memcpy", "Memcpy DtoH", 0, 100 * US, 1), ("runtime", "cudaMemcpyAsync", -10 * US, 120 * US, 1),
            ("runtime", "cudaLaunchKernel", 400 * US, 410 * US, 2), ("kernel", "k", 420 * US, 500 * US, 2)]
    assert by_cause(account(rows)) == {"blocking_copy": 150 * US, "python": 150 * US, "launch": 20 * US}


def test_a_long_call_that_returns_when_the_gpu_runs_dry_waited_for_it():
    """A call of any name (not a launch) that began long before the GPU ran dry and returned just after."""
    rows = [("kernel", "k", 0, 1_000 * US, 1), ("runtime", "cudaLaunchKernel", -50, -40, 1),
            ("runtime", "cudaEventQueryBlocking", 100 * US, 1_010 * US, None),
            ("runtime", "cudaLaunchKernel", 1_300 * US, 1_310 * US, 2), ("kernel", "k", 1_320 * US, 1_400 * US, 2)]
    assert by_cause(account(rows)) == {"sync_stall": 320 * US}


def test_operators_are_named_by_the_outermost_one_and_nvtx_ranges_count_as_operators():
    rows = [("kernel", "k", 0, 100, 1), ("runtime", "cudaLaunchKernel", -5, -4, 1),
            ("annotation", "aten::to, op_id = 991", 100, 160, None), ("cpu_op", "aten::_to_copy", 110, 150, None),
            ("runtime", "cudaLaunchKernel", 170, 171, 2), ("kernel", "k", 175, 200, 2)]
    pieces = account(rows)
    assert by_cause(pieces) == {"cpu_ops": 60, "python": 10, "launch": 5}
    assert pieces.filter(pl.col("cause") == "cpu_ops")["op"].to_list() == ["aten::to"]


@st.composite
def timelines(draw) -> list[tuple]:
    """A GPU's kernels and a host thread's launches, syncs, copies, operators and collectives at random."""
    rows, t, corr = [], 0, 0
    host = ["cpu_op", "sync", "runtime", "annotation"]
    names = {"cpu_op": ["aten::mm", "c10d::allreduce_"], "sync": ["cudaStreamSynchronize", "Stream wait sync"],
             "runtime": ["cudaMemcpy", "cudaFree", "cudaEventQuery"], "annotation": ["DataLoader next", "aten::to"]}
    for _ in range(draw(st.integers(1, 12))):
        corr += 1
        at = t + draw(st.integers(-40, 40))
        rows.append(("runtime", "cudaLaunchKernel", at, at + draw(st.integers(0, 5)), corr))
        start = max(t, at) + draw(st.integers(0, 30))
        rows.append(("kernel" if corr % 3 else "memcpy", "k", start, start + draw(st.integers(1, 30)),
                     corr if draw(st.booleans()) else None))
        t = start + draw(st.integers(0, 40))
    for _ in range(draw(st.integers(0, 10))):
        kind = draw(st.sampled_from(host))
        a = draw(st.integers(-50, t + 50))
        rows.append((kind, draw(st.sampled_from(names[kind])), a, a + draw(st.integers(0, 60)), None))
    return rows


@settings(max_examples=200, deadline=None)
@given(timelines())
def test_every_gap_is_tiled_once_by_pieces_of_known_causes(rows):
    given_ = inputs(table(rows))
    gpu = given_.gpu.sort("start")
    merged = gpu.select("start", "end").sort("start").with_columns(reach=pl.col("end").cum_max())
    gaps = merged.with_columns(gs=pl.col("reach").shift(1)).filter(pl.col("start") > pl.col("gs"))
    pieces = given_.pieces.sort("start")
    assert set(pieces["cause"]) <= set(CAUSES)
    assert (pieces["end"] > pieces["start"]).all()
    # pieces are disjoint and each lies in one gap; together they cover every gap exactly
    assert (pieces["start"].shift(-1) >= pieces["end"]).fill_null(True).all()
    assert pieces.select((pl.col("end") - pl.col("start")).sum()).item() == gaps.select(
        (pl.col("start") - pl.col("gs")).sum()).item()
    per_gap = pieces.group_by("gap").agg(lo=pl.col("start").min(), hi=pl.col("end").max(),
                                         ns=(pl.col("end") - pl.col("start")).sum())
    assert (per_gap["hi"] - per_gap["lo"] == per_gap["ns"]).all()
    assert per_gap.height == gaps.height


def test_a_stage_sees_the_accounts_blocking_calls_as_syncs():
    """A pipeline stage's host activity keeps spans by kind: a blocking call is a sync whatever its trace
    named it, and a sync the GPU does (Nsight's "Stream wait sync") is not."""
    from pipebubble.analysis.idle.activity import host_kind

    rows = table([("runtime", "cudaStreamSynchronize", 0, 5, None), ("sync", "Stream wait sync", 0, 5, None),
                  ("runtime", "cudaMemcpy", 0, 5, None), ("runtime", "cudaLaunchKernel", 0, 5, None),
                  ("sync", "Stream sync", 0, 5, None), ("cpu_op", "aten::mm", 0, 5, None)])
    assert rows.select(kind=host_kind())["kind"].to_list() == ["sync", "runtime", "sync", "runtime", "sync", "cpu_op"]


def test_a_launch_recorded_after_its_op_began_stays_inside_the_gap():
    """A host clock ahead of the GPU's: the launch's start lies after its kernel's. The gap is still tiled
    exactly, its host time up to the kernel's start."""
    rows = [("kernel", "k", 0, 100, 1), ("runtime", "cudaLaunchKernel", -5, -4, 1),
            ("runtime", "cudaLaunchKernel", 250, 260, 2), ("kernel", "k", 200, 300, 2)]
    pieces = account(rows)
    assert pieces["start"].min() == 100 and pieces["end"].max() == 200
    assert by_cause(pieces) == {"python": 100}
