"""Memory on real captures (``sample_traces/memory``: the bundled pipeline on CPU, GPipe and 1F1B at one global
batch of 2048 rows in 4 and 8 micro-batches, torch 2.13): each device's peak is its largest ``Total
Allocated`` to the byte, the micro-batches in flight at each stage's peak are the schedule's (GPipe m, 1F1B
p − s), and the m=8 what-if row predicted from the m=4 capture is within 15 % of the m=8 capture's peak."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pipebubble.options import Scale
from pipebubble.run import run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces" / "memory"


@pytest.fixture(scope="module")
def reports():
    return {name: run([SAMPLES / name], scale=Scale(use_cache=False, workers=1))
            for name in ("gpipe_m4", "gpipe_m8", "1f1b_m4", "1f1b_m8")}


def largest_totals(folder: Path) -> dict[str, int]:
    """Each rank's largest ``Total Allocated`` of its CPU ``[memory]`` events, read with json alone."""
    out = {}
    for path in sorted(folder.glob("rank*.pt.trace.json.gz")):
        trace = json.loads(gzip.decompress(path.read_bytes()))
        rank = trace["distributedInfo"]["rank"]
        out[f"rank{rank}/cpu"] = max(e["args"]["Total Allocated"] for e in trace["traceEvents"]
                                     if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
    return out


@pytest.mark.parametrize("name", ["gpipe_m4", "1f1b_m8"])
def test_device_peak_is_the_largest_total(reports, name):
    memory = reports[name].memory
    assert {d.lane: d.peak_bytes for d in memory.devices} == largest_totals(SAMPLES / name)
    assert reports[name].ingest.memory_events == memory.events > 0


@pytest.mark.parametrize("name, m", [("gpipe_m4", 4), ("gpipe_m8", 8), ("1f1b_m4", 4), ("1f1b_m8", 8)])
def test_inflight_at_peak_is_the_schedule(reports, name, m):
    stages = reports[name].memory.stages
    p = len(stages)
    expected = [m] * p if name.startswith("gpipe") else [min(p - s, m) for s in range(p)]
    assert p == 4
    assert [s.inflight_at_peak for s in stages] == expected == [s.expected_inflight for s in stages]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_m8_predicted_from_m4_within_15_percent(reports, schedule):
    row = next(r for r in reports[f"{schedule}_m4"].pipeline.recommendations if r.label.startswith("m=8"))
    measured = max(s.peak_bytes for s in reports[f"{schedule}_m8"].memory.stages)
    assert abs(row.peak_memory_bytes - measured) <= 0.15 * measured
    assert row.fits is None  # CPU memory: no capacity in the trace, no --memory-limit


def test_memory_limit_decides_fits(reports):
    from dataclasses import replace

    from pipebubble.analysis.memory.fit import with_memory

    r = reports["gpipe_m4"]
    current = max(s.peak_bytes for s in r.memory.stages)
    plain = replace(r.pipeline, recommendations=[replace(x, peak_memory_bytes=None, fits=None)
                                                 for x in r.pipeline.recommendations])
    judged = with_memory(plain, r.memory, limit=current - 1)
    for rec in judged.recommendations:
        assert rec.fits == (rec.peak_memory_bytes <= current - 1)
    fits = {rec.label.split(" → ")[0]: rec.fits for rec in judged.recommendations}
    assert fits["current: gpipe, m=4"] is False and fits["1f1b"] is True  # 1F1B holds p - s, not m
    assert judged.notes[-1].startswith("memory: even m=1") or "largest m that fits" in judged.notes[-1]
