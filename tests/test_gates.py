"""CI gates: `check` thresholds and `diff` regressions on synthetic pipelines whose timelines are known exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from synth import simulate, write_pipeline

from pipebubble import config
from pipebubble.gates import GATES, check, diff
from pipebubble.render.gates import render_check, render_diff
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[1]
SERVE = ROOT / "sample_traces" / "serve_chunked_prefill"
FORWARD = [10_000, 12_000, 10_000, 10_000]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run in ``cwd`` (so no config file of this project is found), importing this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env)


def pipeline(folder: Path, forward=FORWARD) -> Path:
    return write_pipeline(folder, simulate("1f1b", 4, 8, forward, [2 * f for f in forward]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"base": pipeline(root / "base"), "slow": pipeline(root / "slow", [10_000, 15_000, 10_000, 10_000])}


@pytest.fixture(scope="module")
def report(runs) -> dict:
    return run([runs["base"]]).to_dict()


@pytest.fixture(scope="module")
def serving() -> dict:
    return run([SERVE]).to_dict()


@pytest.mark.parametrize("key", [k for k in GATES if k != "max_decode_slowdown"])
def test_each_pipeline_gate_passes_and_fails_on_its_own(report, key):
    (gate,) = check(report, {key: 1.0})
    assert gate.value is not None and gate.value > 0, gate
    margin = 1.01 if GATES[key][1] == "max" else 0.99
    assert [g.status for g in check(report, {key: gate.value * margin})] == ["pass"]
    assert [g.status for g in check(report, {key: gate.value / margin})] == ["fail"]


def test_decode_slowdown_gate_and_pipeline_gates_skip_on_serving(serving):
    (gate,) = check(serving, {"max_decode_slowdown": 100.0})
    assert gate.status == "pass" and gate.value > 1
    assert check(serving, {"max_decode_slowdown": gate.value * 0.99})[0].status == "fail"
    skipped = check(serving, {"max_bubble": 0.1, "max_imbalance": 1.1})
    assert [g.status for g in skipped] == ["skip", "skip"] and "not a pipeline" in skipped[0].note


def test_diff_of_a_report_with_itself_has_no_regression(report):
    result = diff(report, report, 0.05)
    assert result.deltas and not result.regressions and not result.notes


def test_diff_names_the_slower_stage(report, runs):
    result = diff(report, run([runs["slow"]]).to_dict(), 0.05)
    names = [d.metric for d in result.regressions]
    assert "stage 1 busy" in names and "step_time_ns" in names
    assert not any(name.startswith("stage 0 busy") for name in names)
    assert "stage 1 busy" in render_diff(result, "markdown") and json.loads(render_diff(result, "json"))["regressed"]


def test_renderers_are_deterministic_and_junit_is_xml(report):
    gates = check(report, {"max_bubble": 0.01, "min_utilization": 0.1, "max_decode_slowdown": 2.0})
    for fmt in ("text", "json", "junit", "github"):
        assert render_check(gates, fmt) == render_check(gates, fmt)
    suite = ET.fromstring(render_check(gates, "junit"))
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    assert "::error title=pipebubble check bubble fail::bubble" in render_check(gates, "github")


def test_config_from_pyproject_upward_and_unknown_key(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.pipebubble.check]\nmax-bubble = 0.3\n[tool.pipebubble.diff]\n'
                                             'tolerance = "10%"\n[tool.pipebubble.stages]\nstage-by = "rank"\n')
    (tmp_path / "sub").mkdir()
    cfg = config.load(start=tmp_path / "sub")
    assert (cfg.thresholds, cfg.tolerance, cfg.stages) == ({"max_bubble": 0.3}, 0.1, {"stage_by": "rank"})
    (tmp_path / "pipebubble.toml").write_text("[check]\nmax-bubbles = 0.3\n")
    with pytest.raises(config.ConfigError, match="unknown key check.max_bubbles"):
        config.load(start=tmp_path)


def test_cli_check_exit_codes_config_and_flags_win(runs, report, tmp_path):
    bubble = report["pipeline"]["bubble_fraction"]
    (tmp_path / "pipebubble.toml").write_text(f"[check]\nmax-bubble = {bubble / 2}\n")
    failed = run_cli("check", str(runs["base"]), "--format", "junit", cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr
    assert ET.fromstring(failed.stdout).get("failures") == "1"
    passed = run_cli("check", str(runs["base"]), "--max-bubble", str(bubble * 2), cwd=tmp_path)
    assert passed.returncode == 0 and passed.stdout.startswith("PASS  bubble"), passed.stdout + passed.stderr


def test_cli_diff_self_slower_and_saved_baseline(runs, tmp_path):
    assert run_cli("diff", str(runs["base"]), str(runs["base"]), cwd=tmp_path).returncode == 0
    saved = tmp_path / "base.json"
    made = run_cli("analyze", str(runs["base"]), "--format", "json", "-o", str(saved), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    same = run_cli("diff", str(saved), str(runs["base"]), cwd=tmp_path)
    assert same.returncode == 0 and "no regression" in same.stdout, same.stdout + same.stderr
    slow = run_cli("diff", str(saved), str(runs["slow"]), "--tolerance", "5%", cwd=tmp_path)
    assert slow.returncode == 1 and "REGRESSED  stage 1 busy" in slow.stdout, slow.stdout + slow.stderr
    loose = run_cli("diff", str(saved), str(runs["slow"]), "--tolerance", "500%", cwd=tmp_path)
    assert loose.returncode == 0, loose.stdout


def test_cli_missing_path_exits_2_with_one_line(tmp_path):
    for args in (["check", str(tmp_path / "absent"), "--max-bubble", "0.3"],
                 ["diff", str(tmp_path / "absent"), str(tmp_path / "absent2")]):
        proc = run_cli(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.count("\n") == 1 and "absent" in proc.stderr
