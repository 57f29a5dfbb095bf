"""Served requests end to end: an OTLP export and the bundled serve workload's own trace analysed as a user
would, their percentiles in the JSON, the per-request CSV, the text/HTML section and the p99 gates."""

from __future__ import annotations

import csv
import io
import subprocess
import sys
from pathlib import Path

import pytest
from otlp_shapes import write_vllm

from pipebubble.options import Scale
from pipebubble.render import choices
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[3]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True, text=True)


@pytest.fixture
def otlp(tmp_path):
    path = tmp_path / "vllm.otlp.jsonl"
    return path, write_vllm(path, n=300)


def test_otlp_percentiles_in_the_report(otlp):
    path, sent = otlp
    report = run([path], scale=Scale(use_cache=False))
    r = report.requests
    assert r.count == 300 and len(r.rows) == 300
    ttft = sorted(q["ttft"] for q in sent)
    rank = 0.99 * (len(ttft) - 1)  # linear interpolation between the closest ranks (numpy's default)
    low = int(rank)
    assert r.ttft_ns["p99"] == pytest.approx(ttft[low] + (rank - low) * (ttft[low + 1] - ttft[low]), abs=1)
    body = report.to_dict()["requests"]
    assert {"count", "ttft_ns", "queue_ns", "tpot_ns", "e2e_ns"} <= set(body) and set(body["ttft_ns"]) == {
        "p50", "p90", "p99"}


def test_csv_text_and_html_show_the_requests(otlp, tmp_path):
    path, _ = otlp
    rows = list(csv.DictReader(io.StringIO(cli("analyze", str(path), "--format", "csv", "--table", "requests").stdout)))
    assert len(rows) == 300 and float(rows[0]["ttft_ms"]) == 25.0  # queue 0 + prefill 20 + 5 ms
    text = cli("analyze", str(path), "--width", "100").stdout
    assert "Served requests" in text and "Request latency" in text
    html = tmp_path / "r.html"
    assert cli("analyze", str(path), "-o", str(html)).returncode == 0
    assert "request latency distributions" in html.read_text()
    assert "requests" in choices.CSV_TABLES


def test_p99_gates_fail_above_and_pass_below(otlp):
    path, _ = otlp
    p99 = run([path], scale=Scale(use_cache=False)).requests.ttft_ns["p99"] / 1e6
    assert cli("check", str(path), "--max-ttft-p99", f"{p99 * 0.99:.3f}ms").returncode == 1
    assert cli("check", str(path), "--max-ttft-p99", f"{p99 * 1.01 / 1000:.6f}s").returncode == 0


def test_bad_otlp_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "bad.otlp.json"
    path.write_text('{"resourceSpans": 7}')
    proc = cli("analyze", str(path))
    assert proc.returncode == 2 and str(path) in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("sample", ["serve", "serve_chunked_prefill"])
def test_serve_capture_gives_every_request_with_queue_ttft_e2e_in_order(sample):
    r = run([ROOT / "sample_traces" / sample], scale=Scale(use_cache=False)).requests
    assert r.count == 32
    for row in r.rows:
        assert 0 <= row.queue_ns <= row.ttft_ns <= row.e2e_ns
    assert r.kv_cache["peak_blocks"] > 0 and r.steps is not None and r.steps.shared.count > 0
