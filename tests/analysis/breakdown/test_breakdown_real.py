"""The GPU time breakdown and the kernel summary, checked to the nanosecond against an independent computation
(``independent.py``: the raw files read with json/sqlite3/decimal, unions by sort and sweep) on every real
trace, and on random interval sets written as tiny Kineto traces."""

from __future__ import annotations

import json
import tempfile
from decimal import Decimal
from functools import cache
from pathlib import Path

import independent as ind
import pytest
from conftest import shared, shared_files
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.options import Options, Scale
from pipebubble.report import Report
from pipebubble.run import run

KINETO = shared_files("kineto", "*.json.gz")
NSYS = "torchrun_2xh100_nccl.sqlite"
INT_FIELDS = ind.FIELDS


@cache
def _report(path: str) -> Report:
    return run([Path(path)], Options(), Scale(use_cache=False, workers=1))


def _rows(report: Report) -> dict[tuple[str, int | None], dict]:
    rows = {}
    for b in report.breakdown:
        key = (b.lane, b.step)
        assert key not in rows, f"two breakdown rows for {key}"
        rows[key] = {f: getattr(b, f) for f in (*INT_FIELDS, "overlap", "idle_causes")}
    return rows


def _compare_breakdown(report: Report, job: ind.Job, ops: list[ind.Op] | None = None) -> None:
    expected = ind.breakdown(job, ops)
    got = _rows(report)
    assert sorted(got, key=str) == sorted(expected, key=str), "lanes/steps differ"
    for key, want in expected.items():
        have = got[key]
        assert {f: have[f] for f in INT_FIELDS} == {f: want[f] for f in INT_FIELDS}, key
        assert ind.identity_holds(have), key
        if want["overlap"] is None:
            assert have["overlap"] is None, key
        else:
            assert have["overlap"] == pytest.approx(want["overlap"], rel=1e-12, abs=1e-15), key
        if have["idle_causes"]:
            assert sum(have["idle_causes"].values()) == have["idle_ns"], key


def _compare_kernels(report: Report, ops: list[ind.Op]) -> None:
    expected = ind.kernel_summary(ops)
    got = {(k.name_full, k.kind): k for k in report.kernels}
    assert sorted(got) == sorted(expected)
    for key, want in expected.items():
        have = got[key]
        assert (have.count, have.total_ns, have.min_ns, have.max_ns) == (
            want["count"], want["total_ns"], want["min_ns"], want["max_ns"]), key  # fmt: skip
        for f in ("mean_ns", "median_ns", "share"):
            assert getattr(have, f) == pytest.approx(want[f], rel=1e-9, abs=1e-9), (key, f)
        # std from a sum of squares loses digits when std << mean (test_kernel_std_of_long_kernels)
        assert have.std_ns == pytest.approx(want["std_ns"], rel=1e-6, abs=1e-6), (key, "std_ns")
    assert sum(k.share for k in report.kernels) == pytest.approx(1.0 if any(o.end > o.start for o in ops) else 0.0)


# --------------------------------------------------------------------------- real traces


@pytest.mark.parametrize("path", KINETO or [None], ids=lambda p: p.name if p else "absent")
def test_kineto_breakdown_and_kernels_exact(path):
    path = path or shared("kineto")
    job = ind.read([path])
    report = _report(str(path))
    _compare_breakdown(report, job)
    _compare_kernels(report, job.ops)


def test_nsys_breakdown_and_kernels_exact():
    path = shared("nsys", NSYS)
    job = ind.read([path])
    report = _report(str(path))
    _compare_breakdown(report, job)
    _compare_kernels(report, job.ops)


def test_nsys_idle_matches_the_documented_figures():
    """SOURCES.md: idle inside each GPU's own first-to-last window is 8.68 % (GPU0) and 10.51 % (GPU1)."""
    rows = _rows(_report(str(shared("nsys", NSYS))))
    idle = {lane.split("/")[-1]: round(100 * r["idle_ns"] / r["window_ns"], 2)
            for (lane, step), r in rows.items() if step is None}  # fmt: skip
    assert idle == {"gpu0": 8.68, "gpu1": 10.51}


def test_job_of_two_ranks_exact():
    """Two ranks read together: a lane per rank, each with its own steps."""
    paths = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    job = ind.read(paths)
    report = run(paths, Options(), Scale(use_cache=False, workers=1))
    _compare_breakdown(report, job)
    _compare_kernels(report, job.ops)


# --------------------------------------------------------------------------- random interval sets

COMPUTE, COMM = "gemm_kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"
CATEGORY = {"compute": "kernel", "comm": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
NAMES = {"compute": (COMPUTE, "elementwise_kernel"), "comm": (COMM,), "memcpy": ("Memcpy HtoD",),
         "memset": ("Memset (Device)",)}  # fmt: skip

op_strategy = st.tuples(
    st.sampled_from(sorted(CATEGORY)),
    st.integers(0, 1),  # name choice
    st.integers(0, 1),  # device
    st.sampled_from((7, 13, 21)),  # stream
    st.integers(0, 5_000),  # start, ns
    st.integers(0, 1_500),  # duration, ns
)
# Profiler steps follow each other: (gap before, length) from a random first start, so no two overlap.
step_strategy = st.tuples(
    st.integers(-500, 3_000), st.lists(st.tuples(st.integers(0, 1_000), st.integers(1, 3_000)), max_size=3)
)


def _step_windows(first: int, steps: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out, at = [], first
    for gap, length in steps:
        out.append((at + gap, length))
        at += gap + length
    return out


def _event(cat: str, name: str, pid: int, tid: int, start_ns: int, dur_ns: int) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start_ns / 1000, "dur": dur_ns / 1000}


def _us_text(ns: int) -> str:
    """Exact µs text of a non-negative ns count (an epoch timestamp a float cannot hold to 1 ns)."""
    return f"{ns // 1000}.{ns % 1000:03d}"


#: Times relative to the trace's start (small floats), or absolute epoch µs with a ns fraction.
EPOCHS = (1_000_000, 1_712_195_495_505_582_988)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(op_strategy, min_size=1, max_size=25), steps=step_strategy, epoch=st.sampled_from(EPOCHS))
def test_random_intervals_match_independent(ops, steps, epoch):
    events, stamps = [], []
    for cls, which, device, stream, start, dur in ops:
        names = NAMES[cls]
        events.append(_event(CATEGORY[cls], names[which % len(names)], device, stream, 0, dur))
        stamps.append(epoch + start)
    for i, (start, dur) in enumerate(_step_windows(*steps)):
        events.append(_event("user_annotation", f"ProfilerStep#{i + 1}", 100, 100, 0, dur))
        stamps.append(epoch + start)
    for i, e in enumerate(events):  # each start written as its exact decimal text below
        e["ts"] = f"@{i}@"
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    text = json.dumps(doc)
    for i, ns in enumerate(stamps):
        text = text.replace(f'"@{i}@"', _us_text(ns), 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        path.write_text(text)
        job = ind.read([path])
        report = run([path], Options(), Scale(use_cache=False, workers=1))
    _compare_breakdown(report, job)
    _compare_kernels(report, job.ops)
    for b in report.breakdown:
        assert b.compute_ns + b.comm_exposed_ns + b.memory_exposed_ns + b.idle_ns == b.window_ns
        assert 0 <= b.comm_exposed_ns <= b.comm_ns and 0 <= b.memory_exposed_ns <= b.memory_ns


def test_kernel_std_of_long_kernels(tmp_path):
    """Two 100 ms kernels 2 ns apart: population std 1 ns (deviations from the exact mean, not E[x²] − mean²)."""
    events = [_event("kernel", "k", 0, 7, start, dur) for start, dur in ((0, 100_000_001), (200_000_000, 100_000_003))]
    path = _trace(tmp_path, events)
    (k,) = run([path], Options(), Scale(use_cache=False, workers=1)).kernels
    assert (k.count, k.total_ns, k.mean_ns, k.median_ns) == (2, 200_000_004, 100_000_002.0, 100_000_002.0)
    assert k.std_ns == pytest.approx(1.0, rel=1e-9)


def _trace(folder: Path, events: list[dict]) -> Path:
    path = folder / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0}, "traceEvents": events}))
    return path


def test_kernel_crossing_steps_is_cut_into_each(tmp_path):
    """A kernel longer than a step, starting before the first: each step gets its own piece."""
    steps = [_event("user_annotation", f"ProfilerStep#{n}", 100, 100, 1_000 * n, 1_000) for n in (1, 2, 3)]
    kernel = _event("kernel", COMPUTE, 0, 7, 500, 2_800)  # [500, 3300) over steps [1000, 2000), ... [3000, 4000)
    path = _trace(tmp_path, [*steps, kernel])
    report = run([path], Options(), Scale(use_cache=False, workers=1))
    _compare_breakdown(report, ind.read([path]))
    assert {b.step: b.compute_ns for b in report.breakdown} == {None: 2_800, 1: 1_000, 2: 1_000, 3: 300}


def test_duplicate_events_count_in_the_summary_not_in_the_unions(tmp_path):
    """Nothing drops a repeated event (same lane, stream, start, end, name): the kernel summary counts it
    twice, the unions once, as the independent side does."""
    kernel = _event("kernel", COMPUTE, 0, 7, 1_000, 2_000)
    path = _trace(tmp_path, [kernel, dict(kernel), _event("kernel", COMPUTE, 0, 7, 5_000, 1_000)])
    report = run([path], Options(), Scale(use_cache=False, workers=1))
    _compare_breakdown(report, ind.read([path]))
    (k,) = report.kernels
    assert (k.count, k.total_ns, k.median_ns) == (3, 5_000, 2_000.0)
    (row,) = report.breakdown
    assert (row.window_ns, row.compute_ns, row.idle_ns) == (5_000, 3_000, 2_000)


def test_overlapping_step_ranges_each_get_their_work(tmp_path):
    """Step ranges that overlap (nested annotations under --step-regex, or a step recorded twice): a kernel
    inside both counts in both. Steps [0, 10 µs) and [5, 15 µs), a kernel [6, 8 µs)."""
    steps = [_event("user_annotation", "ProfilerStep#1", 100, 100, 0, 10_000),
             _event("user_annotation", "ProfilerStep#2", 100, 100, 5_000, 10_000)]  # fmt: skip
    path = _trace(tmp_path, [*steps, _event("kernel", COMPUTE, 0, 7, 6_000, 2_000)])
    report = run([path], Options(), Scale(use_cache=False, workers=1))
    assert {b.step: b.compute_ns for b in report.breakdown} == {None: 2_000, 1: 2_000, 2: 2_000}


def test_independent_union_by_hand():
    """The reference itself, on a case worked out by hand: compute [0,10) and [5,20), comm [15,30) on another
    stream, memcpy [28,40), nothing until a memset [50,50): window 50, compute 20, comm 15 of which 10
    exposed, memory 12 of which 10 exposed, idle 10."""

    def op(cls, s, e):
        return ind.Op("rank0/gpu0", 0, None, 0, 7, cls, cls, s, e)

    ops = [op("compute", 0, 10), op("compute", 5, 20), op("comm", 15, 30), op("memcpy", 28, 40), op("memset", 50, 50)]
    r = ind.breakdown(ind.Job(ops=ops))[("rank0/gpu0", None)]
    assert (r["window_ns"], r["compute_ns"], r["comm_ns"], r["comm_exposed_ns"]) == (50, 20, 15, 10)
    assert (r["memory_ns"], r["memory_exposed_ns"], r["idle_ns"]) == (12, 10, 10)
    assert r["overlap"] == pytest.approx(5 / 15)
    assert ind.ts_ns(Decimal("1712195495519695.8129")) == 1712195495519695812
    assert ind.ts_ns(Decimal("12.0005")) == 12000  # half to even
    assert ind.dur_ns(Decimal("0.0016")) == 2
