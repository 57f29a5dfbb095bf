"""Bad input: one line naming the file, exit code 2, no traceback; cut-off traces read to their last event."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest
from conftest import shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipebubble.errors import TraceFormatError
from pipebubble.executor import pool as _pool
from pipebubble.ingest.json import chrome


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "empty file"),
        (b"hello", "not a JSON trace"),
        (b'{"a": 1}', "without a 'traceEvents' array"),
        (b'{"traceEvents": 5}', "'traceEvents' is not an array"),
        (b"\x1f\x8b\x08\x00garbage", "corrupt gzip data"),
    ],
)
def test_bad_files_exit_2_with_one_line(tmp_path, content, reason):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    proc = run_cli("analyze", str(path))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(path) in proc.stderr and reason in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_path_and_empty_folder(tmp_path):
    proc = run_cli("analyze", str(tmp_path / "nope.json"))
    assert proc.returncode == 2 and "no such file" in proc.stderr and proc.stderr.count("\n") == 1
    proc = run_cli("analyze", str(tmp_path))
    assert proc.returncode == 2 and "no trace files" in proc.stderr


def cut_trace(tmp_path, fraction: float, gz: bool):
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10, "dur": 4,
               "args": {"External id": i, "correlation": i}} for i in range(200)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events, "traceName": "x"}, indent=1).encode()
    cut = text[: int(len(text) * fraction)]
    path = tmp_path / ("cut.json.gz" if gz else "cut.json")
    path.write_bytes(gzip.compress(text)[: int(len(gzip.compress(text)) * fraction)] if gz else cut)
    return path


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("fraction", [0.5, 0.77, 0.999])
def test_cut_off_trace_reads_whole_events_with_a_warning(tmp_path, fraction, gz):
    result = chrome.read(cut_trace(tmp_path, fraction, gz))
    names = result.spans["name"].to_list()
    assert 0 < len(names) <= 200
    assert names == [f"k{i}" for i in range(len(names))]  # a prefix of whole events, none invented
    assert result.warnings and all("cut off" in w for w in result.warnings)
    assert result.meta["unread_bytes"] > 0 or gz


def test_cut_off_trace_via_cli_warns(tmp_path):
    proc = run_cli("analyze", "--format", "json", str(cut_trace(tmp_path, 0.6, False)))
    assert proc.returncode == 0
    report = json.loads(proc.stdout)
    assert report["ingest"]["unread_bytes"] > 0 and "cut off" in report["ingest"]["warnings"][0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_real_trace_never_crashes(tmp_path, data):
    """Any byte-level damage to a real trace gives a result or a TraceFormatError, never anything else."""
    original = gzip.decompress(shared("kineto", "mi250_rocm_toy_train.json.gz").read_bytes())
    damaged = bytearray(original)
    for _ in range(data.draw(st.integers(1, 5))):
        kind = data.draw(st.sampled_from(["flip", "cut", "delete", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(damaged) - 1)))
        if kind == "flip" and damaged:
            damaged[pos] = data.draw(st.integers(0, 255))
        elif kind == "cut":
            del damaged[pos:]
        elif kind == "delete":
            del damaged[pos:pos + data.draw(st.integers(1, 200))]
        else:
            damaged[pos:pos] = data.draw(st.sampled_from([b"{", b"}", b"]", b",", b'"', b"\x00", b"NaN", b"}, {"]))
    path = tmp_path / "damaged.json"
    path.write_bytes(bytes(damaged))
    try:
        result = chrome.read(path)
    except TraceFormatError as exc:
        assert str(path) in str(exc)
        return
    assert result.spans.height <= 112 + 5


@pytest.mark.parametrize("fraction", [1.0, 0.6])
def test_big_gzip_is_gunzipped_to_scratch_and_cleaned_up(tmp_path, monkeypatch, fraction):
    """A gzipped trace over the threshold is streamed to a scratch file (not into memory, never beside the
    input), decoded from there in parallel blocks, and the scratch file is removed."""
    from pipebubble.ingest.json import trace as jsontrace

    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10, "dur": 4}
              for i in range(3000)]
    text = json.dumps({"schemaVersion": 1, "traceEvents": events}).encode()
    packed = gzip.compress(text)
    path = tmp_path / "in" / "big.json.gz"
    path.parent.mkdir()
    path.write_bytes(packed[: int(len(packed) * fraction)])
    plain = chrome.read(path)
    monkeypatch.setattr(jsontrace, "GUNZIP_TO_DISK", 0)
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 20_000)
    scratch = tmp_path / "scratch"
    with _pool(2) as pool:  # spawned workers, as the CLI uses
        streamed = chrome.read(path, 0, pool, scratch)
    assert streamed.spans.equals(plain.spans) and streamed.warnings == plain.warnings
    assert (streamed.spans.height == 3000) == (fraction == 1.0)
    assert list(scratch.iterdir()) == [] and sorted(p.name for p in path.parent.iterdir()) == ["big.json.gz"]


@pytest.mark.parametrize("cut", [False, True])
def test_invalid_utf8_in_an_event_is_replaced_not_a_crash(tmp_path, cut):
    """The bug `test_mutated_real_trace_never_crashes` found: one flipped byte in a name raised
    msgspec.DecodeError (Invalid UTF-8) out of ingest; the bytes are replaced, counted and the events kept."""
    event = b'{"ph": "X", "cat": "kernel", "name": "k\xe9rnel", "pid": 0, "tid": 7, "ts": 1, "dur": 2}'
    text = b'{"schemaVersion": 1, "traceEvents": [' + event + b", " + event.replace(b'"ts": 1', b'"ts": 5')
    path = tmp_path / "bad_utf8.json"
    path.write_bytes(text + (b", {" if cut else b"]}"))
    result = chrome.read(path)
    assert result.spans["name"].to_list() == ["k\ufffdrnel"] * 2
    assert "2 invalid UTF-8" in result.warnings[0] and (len(result.warnings) == 2) == cut
