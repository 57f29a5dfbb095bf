"""GPU annotations, launch queues and launch delays on the shared V100 trace, against plain Python over its raw
events (``json`` with ``Decimal``; the µs → ns rules of ``independent``, the definitions of
``report.launches``): sorted sweeps, a stack per thread, no polars."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest
from conftest import shared
from independent import dur_ns, kineto_rank, load_json, ts_ns

import pipebubble

GPU_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCHES = {"cuda_runtime", "cuda_driver"}  # the categories of the calls that launch GPU work
#: The shared traces with GPU annotations (``gpu_user_annotation``), launches and operators.
TRACES = ["resnet_v100_ns_resolution.json.gz", "resnet_ddp_a100_nccl_rank0.json.gz", "mi250_rocm_toy_train.json.gz"]


def raw_events(path) -> tuple[int, list[tuple[str, str, object, object, int, int, int | None]]]:
    """The trace's rank and (cat, name, pid, tid, start, end, correlation) of every complete event."""
    doc = load_json(path)
    base = int(doc.get("baseTimeNanoseconds") or 0)
    out = []
    for e in doc["traceEvents"]:
        if e.get("ph") != "X" or e.get("ts") is None or e.get("dur") is None:
            continue
        start = ts_ns(e["ts"]) + base
        corr = (e.get("args") or {}).get("correlation")
        out.append((e.get("cat"), e.get("name"), e.get("pid"), e.get("tid"), start, start + dur_ns(e["dur"]), corr))
    return kineto_rank(doc, path, 0), out


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def expected_annotations(events) -> dict[str, tuple[int, int, int, int, int]]:
    """name -> (ranges, union per stream summed, sum, operations within the union on its stream, their time)."""
    ranges = defaultdict(list)
    for cat, name, pid, tid, s, e, _ in events:
        if cat == "gpu_user_annotation":
            ranges[name].append((pid, tid, s, e))
    ops = [(pid, tid, s, e) for cat, _, pid, tid, s, e, _ in events if cat in GPU_WORK]
    out = {}
    for name, rows in ranges.items():
        pieces = {key: union([(s, e) for p, t, s, e in rows if (p, t) == key]) for key in {(p, t) for p, t, *_ in rows}}
        inside = [(s, e) for p, t, s, e in ops if any(a <= s and e <= b for a, b in pieces.get((p, t), []))]
        out[name] = (len(rows), sum(b - a for ps in pieces.values() for a, b in ps), sum(e - s for *_, s, e in rows),
                     len(inside), sum(e - s for s, e in inside))
    return out


def expected_queue(rank: int, events) -> dict:
    """(GPU lane, stream) -> max, time-weighted mean, time at max, time empty, launches, p50, p95: a sweep
    per stream."""
    launched = {corr: s for cat, _, _, _, s, _, corr in events if cat in LAUNCHES and corr is not None}
    steps = defaultdict(lambda: defaultdict(int))
    counts = defaultdict(int)
    for cat, _, pid, tid, _, e, corr in events:
        if cat in GPU_WORK and corr in launched and e >= launched[corr]:
            key = (f"rank{rank}/gpu{pid}", tid)
            steps[key][launched[corr]] += 1
            steps[key][e] -= 1
            counts[key] += 1
    out = {}
    for key, deltas in steps.items():
        times = sorted(deltas)
        held, queue = defaultdict(int), 0
        for t, nxt in zip(times, times[1:], strict=False):
            queue += deltas[t]
            held[queue] += nxt - t
        window, top = times[-1] - times[0], max(held)
        out[key] = (top, sum(q * d for q, d in held.items()) / window, held[top], held[0], counts[key],
                    weighted(held, 0.5, window), weighted(held, 0.95, window))
    return out


def weighted(held: dict[int, int], share: float, window: int) -> int:
    """The least queue length held for at least ``share`` of the window, with every shorter one."""
    total = 0
    for queue in sorted(held):
        total += held[queue]
        if total >= share * window:
            return queue
    raise AssertionError("the lengths held do not fill the window")


def expected_delays(events) -> dict:
    """operator -> (launches, total delay, median, max, kernel mean, share over its kernel): each launch's
    operator the innermost ``cpu_op`` open at its start on its thread, found with a stack."""
    ops = defaultdict(list)
    for cat, name, pid, tid, s, e, _ in events:
        if cat == "cpu_op":
            ops[(pid, tid)].append((s, -e, name))
    calls = defaultdict(list)
    gpu = {corr: (s, e) for cat, _, _, _, s, e, corr in events if cat in GPU_WORK and corr is not None}
    for cat, _, pid, tid, s, _, corr in events:
        if cat in LAUNCHES and corr in gpu:
            calls[(pid, tid)].append((s, corr))
    rows = defaultdict(list)
    for thread, launches in calls.items():
        opened = sorted(ops[thread])
        stack: list[tuple[int, str]] = []
        k = 0
        for at, corr in sorted(launches):
            while k < len(opened) and opened[k][0] <= at:
                s, neg_end, name = opened[k]
                while stack and stack[-1][0] <= s:
                    stack.pop()
                stack.append((-neg_end, name))
                k += 1
            while stack and stack[-1][0] <= at:
                stack.pop()
            start, end = gpu[corr]
            rows[stack[-1][1] if stack else None].append((max(start - at, 0), end - start))
    return {op: (len(r), sum(d for d, _ in r), statistics.median(d for d, _ in r), max(d for d, _ in r),
                 sum(k for _, k in r) / len(r), sum(d > k for d, k in r) / len(r)) for op, r in rows.items()}


@pytest.fixture(scope="module", params=TRACES)
def both(request):
    path = shared("kineto", request.param)
    return raw_events(path), pipebubble.analyze(path).data


def test_gpu_annotations_equal_the_raw_ranges(both):
    (_, events), report = both
    expected = expected_annotations(events)
    assert {a.name: (a.count, a.gpu_ns, a.sum_ns, a.kernel_count, a.kernel_ns) for a in report.gpu_annotations} \
        == expected
    assert expected  # every trace here has some


def test_launch_queue_equals_a_sweep_of_the_raw_events(both):
    (rank, events), report = both
    expected = expected_queue(rank, events)
    got = {(q.lane, q.stream): q for q in report.launch_queue}
    assert set(got) == set(expected) and expected
    for key, (top, mean, at_max, empty, launches, p50, p95) in expected.items():
        q = got[key]
        assert (q.max, q.at_max_ns, q.empty_ns, q.launches, q.p50, q.p95) == (top, at_max, empty, launches, p50, p95)
        assert q.mean == pytest.approx(mean, rel=1e-12)


def test_launch_delays_equal_the_raw_launches(both):
    (_, events), report = both
    expected = expected_delays(events)
    shown = report.launch_delays
    assert len(shown) == min(len(expected), 50)
    for d in shown:
        count, total, median, most, kernel_mean, over = expected[d.operator]
        assert (d.count, d.total_ns, d.max_ns) == (count, total, most)
        assert d.median_ns == pytest.approx(median) and d.kernel_mean_ns == pytest.approx(kernel_mean)
        assert d.over_share == pytest.approx(over)
