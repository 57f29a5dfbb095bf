"""Memory copies by direction and host memory (``analysis/memcpy.py``): hand-computed timelines, the map and
reduce over files, and the real recsys traces against a plain-Python sum over their raw events."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict

import polars as pl
import pytest
from conftest import shared

from pipebubble import spans
from pipebubble.analysis.memcpy import memcpy_part, memcpy_report
from pipebubble.options import Options, Scale
from pipebubble.run import run

US = 1_000


def table(rows: list[tuple]) -> pl.DataFrame:
    """(rank, kind, name, start, end, bytes) rows on rank{r}/gpu0."""
    return spans.conform(pl.DataFrame(
        [(r, k, n, s, e, b, f"rank{r}/gpu0", 0, 7) for r, k, n, s, e, b in rows],
        schema=["rank", "kind", "name", "start", "end", "bytes", "lane", "device", "stream"], orient="row"))


def test_copies_by_direction_and_host_memory_hand_computed():
    """Two pageable HtoD copies overlapping (durations add: 10 + 20 us, 3,000 + 6,000 bytes: 0.3 GB/s), one
    pinned HtoD, one DtoH to pageable memory without a recorded size (its time apart from GB/s), one DtoD, a
    kernel and a memset that are no copies."""
    spans_ = table([
        (0, "memcpy", "Memcpy HtoD (Pageable -> Device)", 0, 10 * US, 3_000),
        (0, "memcpy", "Memcpy HtoD (Pageable -> Device)", 5 * US, 25 * US, 6_000),
        (0, "memcpy", "Memcpy HtoD (Pinned -> Device)", 30 * US, 31 * US, 20_000),
        (0, "memcpy", "Memcpy DtoH (Device -> Pageable)", 40 * US, 44 * US, None),
        (0, "memcpy", "Memcpy DtoH (Device -> Pageable)", 50 * US, 52 * US, 1_000),
        (0, "memcpy", "Memcpy DtoD (Device -> Device)", 60 * US, 61 * US, 500_000),
        (0, "kernel", "gemm", 0, 100 * US, None),
        (0, "memset", "Memset (Device)", 70 * US, 71 * US, 64),
    ])
    report = memcpy_report([memcpy_part(spans_, Options())])
    got = {(r.direction, r.host_memory): (r.count, r.bytes, r.busy_ns, r.gbps) for r in report.rows}
    assert got == {
        ("HtoD", "pageable"): (2, 9_000, 30 * US, 0.3),
        ("HtoD", "pinned"): (1, 20_000, 1 * US, 20.0),
        ("DtoH", "pageable"): (2, 1_000, 6 * US, 0.5),  # GB/s over the 2 us of the sized copy alone
        ("DtoD", None): (1, 500_000, 1 * US, 500.0),
    }
    assert {r.lane for r in report.lanes} == {"rank0/gpu0"} and all(r.lane is None for r in report.rows)


def test_files_add_up_per_lane_and_over_the_job():
    """Two ranks' parts: the job's row sums both, each lane keeps its own; no copy at all: no section; a copy
    whose name says no direction (a generic trace's) keeps a null direction, never a guess."""
    a = memcpy_part(table([(0, "memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 4 * US, 4_000)]), Options())
    b = memcpy_part(table([(1, "memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 1 * US, 4_000),
                           (1, "memcpy", "copy", 0, 1 * US, None)]), Options())
    report = memcpy_report([a, b])
    assert [(r.direction, r.count, r.bytes, r.busy_ns, r.gbps) for r in report.rows] == [
        ("HtoD", 2, 8_000, 5 * US, 1.6), (None, 1, None, 1 * US, None)]
    assert [(r.lane, r.gbps) for r in report.lanes if r.direction] == [("rank0/gpu0", 1.0), ("rank1/gpu0", 4.0)]
    assert memcpy_report([memcpy_part(table([(0, "kernel", "k", 0, 5, None)]), Options())]) is None
    assert memcpy_report([]) is None


def raw_copies(paths) -> dict[tuple[str, str | None], list[int]]:
    """Independently of pipebubble: every ``gpu_memcpy`` event of the raw JSON, by its name's direction and
    host memory: [count, bytes, dur ns]."""
    sums: dict = defaultdict(lambda: [0, 0, 0])
    for path in paths:
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
        for e in events:
            if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy":
                direction = e["name"].split()[1]
                inside = e["name"][e["name"].index("(") + 1:-1].split(" -> ")
                host = next((m.lower() for m in inside if m in ("Pinned", "Pageable")), None)
                s = sums[direction, host]
                s[0], s[1], s[2] = s[0] + 1, s[1] + e["args"]["bytes"], s[2] + round(e["dur"] * 1000)
    return dict(sums)


def test_recsys_copies_equal_a_plain_sum_over_the_raw_events():
    paths = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    want = raw_copies(paths)
    report = run(paths, Options(), Scale(use_cache=False))
    got = {(r.direction, r.host_memory): [r.count, r.bytes, r.busy_ns] for r in report.memcpy.rows}
    assert got == want
    assert sum(c for c, _, _ in want.values()) == 80  # 40 a rank
    for r in report.memcpy.rows:
        assert r.gbps == pytest.approx(want[r.direction, r.host_memory][1] / want[r.direction, r.host_memory][2])
    assert report.to_dict()["memcpy"]["rows"][0].keys() >= {"direction", "host_memory", "count", "bytes", "busy_ns",
                                                            "gbps"}
