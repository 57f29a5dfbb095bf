"""CI gates: `check` thresholds on synthetic pipelines whose timelines are known exactly, the threshold traps
(30 read as 3000 %, a tolerance of 5 read as 500 %, negative and NaN thresholds) and --strict."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from synth import simulate, write_pipeline

from pipebubble import config
from pipebubble.gates import GATES, check, diff, parse_threshold, parse_tolerance
from pipebubble.render.gates import render_diff, warnings
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.parametrize("key", [k for k in GATES if k not in ("max_decode_slowdown", "max_preemptions")
                                 and not k.endswith("_p99")])
def test_each_pipeline_gate_passes_and_fails_on_its_own(report, key):
    (gate,) = check(report, {key: 1e9 if GATES[key].unit == "ms" else 1.0}).gates
    assert gate.value is not None and gate.value > 0, gate
    floor = GATES[key].floor
    margin = 1.01 if GATES[key].bound == "max" else 0.99
    assert [g.status for g in check(report, {key: max(floor, gate.value * margin)}).gates] == ["pass"]
    if gate.value / margin >= floor:
        assert [g.status for g in check(report, {key: gate.value / margin}).gates] == ["fail"]


def test_decode_slowdown_gate_and_pipeline_gates_skip_on_serving(serving):
    (gate,) = check(serving, {"max_decode_slowdown": 100.0}).gates
    assert gate.status == "pass" and gate.value > 1
    assert check(serving, {"max_decode_slowdown": gate.value * 0.99}).gates[0].status == "fail"
    skipped = check(serving, {"max_bubble": 0.1, "max_imbalance": 1.1})
    assert [g.status for g in skipped.gates] == ["skip", "skip"] and "not a pipeline" in skipped.gates[0].note
    assert not skipped.failed
    said = warnings(skipped)  # a skip is never silent: stderr names each one and why
    assert len(said) == 2 and all("skipped: not a pipeline" in w and "--strict" in w for w in said)


def test_strict_turns_a_gate_that_cannot_be_evaluated_into_a_failure(serving):
    result = check(serving, {"max_bubble": 0.1, "max_decode_slowdown": 100.0}, strict=True)
    assert [g.status for g in result.gates] == ["error", "pass"] and result.failed


@pytest.mark.parametrize("key,text,value", [
    ("max_bubble", "0.3", 0.3), ("max_bubble", "30%", 0.3), ("max_bubble", " 30 % ", 0.3), ("max_bubble", 0.3, 0.3),
    ("min_utilization", "100%", 1.0), ("max_bubble", "0", 0.0), ("max_stage_cv", "10%", 0.1),
    ("max_stage_cv", "1.5", 1.5), ("max_imbalance", "1.2", 1.2), ("max_imbalance", "1.2x", 1.2),
    ("max_wait_ms", "50", 50.0), ("max_wait_ms", "500us", 0.5), ("max_wait_ms", "0.1s", 100.0),
    ("max_wait_ms", "1e9", 1e9), ("max_decode_slowdown", "1.5", 1.5),
])
def test_thresholds_read_as_written(key, text, value):
    assert parse_threshold(key, text) == pytest.approx(value)


@pytest.mark.parametrize("key,text,message", [
    ("max_bubble", "30", "did you mean 30%?"),  # would have passed silently as 3000 %
    ("min_utilization", "60", "did you mean 60%?"),
    ("max_bubble", 30.0, "did you mean 30%?"),  # a number from pipebubble.toml
    ("max_bubble", "-1", "must not be negative"),
    ("max_bubble", "nan", "not a finite number"),
    ("max_wait_ms", "inf", "not a finite number"),
    ("max_wait_ms", "-5", "must not be negative"),
    ("max_bubble", "300%", "more than 100%"),
    ("max_bubble", "abc", "expected a number"),
    ("max_imbalance", "0.2", "did you mean 1.2?"),
    ("max_imbalance", "20%", "did you mean 1.2?"),
    ("max_decode_slowdown", "0.5", "did you mean 1.5?"),
])
def test_thresholds_a_gate_could_only_misread_are_refused_with_a_hint(key, text, message):
    with pytest.raises(ValueError, match=message.replace("?", r"\?")) as caught:
        parse_threshold(key, text, "--" + key.replace("_", "-"))
    assert "\n" not in str(caught.value) and str(caught.value).startswith(f"--{key.replace('_', '-')} ")


def test_tolerance_reads_percent_and_fractions_and_refuses_a_bare_5():
    assert parse_tolerance("5%") == pytest.approx(0.05) and parse_tolerance("0.05") == 0.05
    assert parse_tolerance("500%") == pytest.approx(5.0) and parse_tolerance("1") == 1.0
    for text, message in (("5", r"did you mean 5%\?"), ("-1", "negative"), ("nan", "finite")):
        with pytest.raises(ValueError, match=message):
            parse_tolerance(text)


def test_library_refuses_what_the_flags_refuse(report):
    with pytest.raises(ValueError, match="did you mean 30%"):
        check(report, {"max_bubble": 30})
    with pytest.raises(ValueError, match="unknown gate"):
        check(report, {"max_bubbles": 0.3})
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="tolerance"):
            diff(report, report, bad)


def test_diff_names_the_slower_stage_and_the_faster_run_improves(report, runs):
    slow = run([runs["slow"]]).to_dict()
    result = diff(report, slow, 0.05)
    names = [d.metric for d in result.regressions]
    assert "stage 1 busy" in names and "step time" in names
    assert not any(name.startswith("stage 0 busy") for name in names)
    assert "stage 1 busy" in render_diff(result, "markdown")
    back = diff(slow, report, 0.05)  # the other way round, the same metrics are improvements
    assert {"stage 1 busy", "step time", "bubble"} <= {d.metric for d in back.improvements}
    assert "IMPROVED   stage 1 busy" in render_diff(back, "text")


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
    assert "failures=\"1\"" in failed.stdout
    passed = run_cli("check", str(runs["base"]), "--max-bubble", f"{bubble * 200}%", cwd=tmp_path)
    assert passed.returncode == 0 and passed.stdout.startswith("PASS  bubble"), passed.stdout + passed.stderr


def test_cli_config_threshold_above_1_is_refused_naming_the_file(runs, tmp_path):
    (tmp_path / "pipebubble.toml").write_text("[check]\nmax-bubble = 30\n")
    proc = run_cli("check", str(runs["base"]), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "pipebubble.toml" in proc.stderr and "did you mean 30%?" in proc.stderr


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
