"""Exit codes CI can use: 0 ok, 1 a failed gate, 2 bad input or output (one line), 3 an internal error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebubble import cli

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"
REPROS = ROOT.parent / "shared" / "repros"


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def test_internal_error_is_exit_3_with_one_line(capsys, monkeypatch):
    import pipebubble.run

    def boom(*args, **kwargs):
        raise RuntimeError("something\nbroke")

    monkeypatch.setattr(pipebubble.run, "execute", boom)
    monkeypatch.delenv("PIPEBUBBLE_DEBUG", raising=False)
    code, out, err = run(capsys, "analyze", str(SAMPLE), "--no-cache")
    assert code == 3
    assert err.count("\n") == 1 and "internal error: RuntimeError: something broke" in err
    assert "please report" in err and "--debug" in err and "Traceback" not in err


def test_debug_shows_the_traceback(capsys, monkeypatch):
    import pipebubble.run

    def boom(*args, **kwargs):
        raise RuntimeError("broke")

    monkeypatch.setattr(pipebubble.run, "execute", boom)
    monkeypatch.delenv("PIPEBUBBLE_DEBUG", raising=False)
    code, _, err = run(capsys, "--debug", "analyze", str(SAMPLE), "--no-cache")
    assert code == 3 and "Traceback" in err and "RuntimeError: broke" in err


@pytest.mark.parametrize("command", [["analyze"], ["export"], ["check", "--max-bubble", "0.9"]])
def test_unwritable_output_is_exit_2_naming_it(capsys, tmp_path, command):
    target = tmp_path / "missing-folder" / ("out.pftrace" if command == ["export"] else "out.txt")
    code, _, err = run(capsys, *command, str(SAMPLE), "-o", str(target))
    assert code == 2, err
    assert err.count("\n") == 1 and str(target) in err and "cannot write output" in err
    assert not target.parent.exists()


def test_output_into_a_folder_is_exit_2(capsys, tmp_path):
    code, _, err = run(capsys, "analyze", str(SAMPLE), "-o", str(tmp_path))
    assert code == 2 and "is a directory" in err and err.count("\n") == 1


def test_usage_error_is_exit_2(capsys):
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--format", "nope")
    assert code == 2 and "nope" in err


def cut_trace(tmp_path: Path) -> Path:
    """A trace cut off two thirds in: read to its last whole event, with a warning."""
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "pid": 0, "tid": 7, "ts": i * 10, "dur": 4}
              for i in range(50)]
    text = json.dumps({"traceEvents": events})
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) * 2 // 3])
    return cut


def test_warnings_reach_stderr_in_every_format(capsys, tmp_path):
    cut = cut_trace(tmp_path)
    for fmt in ("text", "json", "markdown", "html"):
        for cached in (False, True):  # a cached report warns again
            args = ["analyze", str(cut), "--format", fmt] + ([] if cached else ["--no-cache"])
            code, out, err = run(capsys, *args)
            assert code == 0, err
            assert "pipebubble: warning:" in err and "cut off" in err, (fmt, cached)
            if fmt == "json":
                assert any("cut off" in w for w in json.loads(out)["ingest"]["warnings"])
            if fmt == "text":
                assert "cut off" not in out  # on stderr, not mixed into the report


def test_report_written_whole_to_output(capsys, tmp_path):
    target = tmp_path / "report.json"
    code, out, _ = run(capsys, "analyze", str(SAMPLE), "-o", str(target))
    assert code == 0 and out == ""
    assert json.loads(target.read_text())["schema_version"]
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left behind


def _repros() -> list[Path]:
    if not REPROS.exists():
        return []
    names = ("*.json", "*.json.gz", "*.sqlite")
    return sorted(p for pattern in names for p in REPROS.glob(pattern))


@pytest.mark.parametrize("path", _repros(), ids=lambda p: p.name)
def test_every_repro_exits_0_or_2_with_one_line(capsys, path):
    """Through the real CLI: no input ends in a traceback; bad input is one line naming the file."""
    code, out, err = run(capsys, "analyze", str(path), "--no-cache", "--format", "json")
    assert code in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("pipebubble: error: ") and path.name in err
    else:
        report = json.loads(out)
        assert all(lane["idle_ns"] >= 0 and lane["busy_ns"] >= 0 for lane in report["lanes"])
        assert all(line.startswith("pipebubble: warning: ") for line in err.splitlines())


def test_repros_folder_is_present_or_skipped():
    if not REPROS.exists():
        pytest.skip(f"repros not available ({REPROS} is absent)")
    assert len(_repros()) > 30


def _baselines() -> list[Path]:
    return sorted((REPROS / "baselines").glob("*.json")) if REPROS.exists() else []


@pytest.mark.parametrize("path", _baselines(), ids=lambda p: p.name)
def test_every_saved_baseline_repro_is_gated_or_refused_in_one_line(capsys, path):
    code, _, err = run(capsys, "check", str(path), "--max-bubble", "0.3")
    assert code in (0, 2), err
    assert "Traceback" not in err and "internal error" not in err
    if code == 2:
        assert err.count("\n") == 1 and path.name in err


def test_a_saved_reports_warnings_are_not_repeated_by_check_and_diff(capsys, tmp_path):
    cut = cut_trace(tmp_path)
    saved = tmp_path / "saved.json"
    code, _, err = run(capsys, "analyze", str(cut), "-o", str(saved))
    assert code == 0 and "cut off" in err
    # The cut is a gap every gate fails on (tests/gates/test_completeness.py); allowed, it is judged as read.
    code, _, err = run(capsys, "check", str(saved), "--min-utilization", "0")
    assert code == 1 and "input incomplete" in err and "trace cut off" not in err
    code, _, err = run(capsys, "check", str(saved), "--min-utilization", "0", "--allow-partial")
    assert code == 0 and "trace cut off" not in err
    code, _, err = run(capsys, "diff", str(saved), str(cut), "--allow-partial")
    assert code == 0 and err.count("trace cut off") == 1  # the traces read now warn; the saved baseline does not
