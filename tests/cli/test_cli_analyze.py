"""`pipebubble analyze` end to end: the JSON contract, plain text when piped, the cache."""

from __future__ import annotations

import json
import os

import pytest
from runs import ROOT, SAMPLE, run_cli

from pipebubble.ingest import cache, load

REQUIRED = {"schema_version", "ingest", "lanes", "stages", "pipeline", "waits", "interference"}
LANE_KEYS = {"lane", "kind", "rank", "pid", "tid", "device", "stream", "busy_ns", "idle_ns", "window_start_ns",
             "window_end_ns"}


def test_json_report_contract():
    proc = run_cli("analyze", str(SAMPLE), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert REQUIRED <= report.keys() and report["schema_version"] == 1
    assert {"files", "events_read", "spans", "skipped", "warnings"} <= report["ingest"].keys()
    assert report["lanes"] and all(LANE_KEYS <= lane.keys() for lane in report["lanes"])
    for lane in report["lanes"]:
        assert lane["busy_ns"] + lane["idle_ns"] == lane["window_end_ns"] - lane["window_start_ns"]


def test_text_is_plain_when_piped_and_fits_the_width():
    proc = run_cli("analyze", str(SAMPLE), "--width", "80")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "Lanes" in proc.stdout and "rank0/" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80


def test_help_shows_examples():
    proc = run_cli("analyze", "--help")
    assert proc.returncode == 0 and "pipebubble analyze sample_traces" in proc.stdout


def test_cache_hit_is_identical_and_never_beside_the_input(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path / "cache"))
    before = sorted(p.name for p in SAMPLE.iterdir())
    first = load([SAMPLE])
    assert list((tmp_path / "cache").glob("*.parquet"))
    second = load([SAMPLE])
    assert second.spans.equals(first.spans)
    assert second.files[0].skipped == first.files[0].skipped
    assert sorted(p.name for p in SAMPLE.iterdir()) == before


def test_cache_key_changes_with_the_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]')
    assert load([path]).spans.height == 1 and cache.get(path) is not None
    path.write_text('[{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0, "dur": 1},'
                    ' {"ph": "X", "name": "b", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]')
    os.utime(path, ns=(1, 10**18))
    assert cache.get(path) is None and load([path]).spans.height == 2


@pytest.mark.parametrize("workers", [1, 2])
def test_parallel_block_decoding_matches_serial(tmp_path, monkeypatch, workers):
    from pipebubble.ingest.json import trace as jsontrace

    events = [{"ph": "X", "cat": "kernel" if i % 2 else "cpu_op", "name": f"n{i}", "pid": i % 2, "tid": 7,
               "ts": i * 3.25, "dur": 2} for i in range(2000)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    serial = load([path], use_cache=False, workers=1).spans
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 10_000)
    split = load([path], use_cache=False, workers=workers).spans
    assert split.equals(serial) and serial.height == 2000


def test_bundled_samples_read_as_the_pipelines_they_are():
    from pipebubble.run import run

    for name, schedule in [("pipeline_1f1b", "1f1b"), ("pipeline_gpipe", "gpipe"),
                           ("pipeline_1f1b_imbalanced", "1f1b")]:
        pipe = run([ROOT / "sample_traces" / name]).pipeline
        assert (pipe.stages, pipe.microbatches, pipe.schedule) == (4, 8, schedule), name
        assert pipe.theoretical_bubble_fraction == pytest.approx(3 / 11)


def test_text_report_shows_pipeline_sections():
    proc = run_cli("analyze", str(ROOT / "sample_traces" / "pipeline_1f1b"), "--width", "100")
    assert proc.returncode == 0, proc.stderr
    for heading in ("p=4 stages, m=8 micro-batches, 1f1b", "Timeline", "Stages", "Biggest waits", "What if"):
        assert heading in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100
