"""The gate traps through the real command line: each is exit 2 with one line and a hint, or a SKIP that says
why (an error with --strict); every I/O failure is exit 2 naming the path, in every command; diff of a run
recorded again under other PIDs is exit 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared
from pids import rerecord_folder

from pipebubble import cli

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "sample_traces" / "pipeline_1f1b"
SINGLE = ROOT / "sample_traces" / "toy_train"


def run(capsys, monkeypatch, tmp_path, *args: str) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)  # no config file of this project applies
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.fixture
def cli_run(capsys, monkeypatch, tmp_path):
    return lambda *args: run(capsys, monkeypatch, tmp_path, *map(str, args))


def one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    """Exit 2, nothing on stdout, and one error line (beside any notes and warnings) holding every needle."""
    assert code == 2, err
    errors = [line for line in err.splitlines() if not line.startswith(("pipebubble: note:", "pipebubble: warning:"))]
    assert out == "" and len(errors) == 1 and errors[0].startswith("pipebubble: error: "), err
    for needle in needles:
        assert needle in errors[0], err


@pytest.mark.parametrize("args,hint", [
    (["--max-bubble", "30"], "did you mean 30%?"),
    (["--min-utilization", "60"], "did you mean 60%?"),
    (["--max-bubble", "-1"], "must not be negative"),
    (["--max-bubble", "nan"], "not a finite number"),
    (["--max-wait-ms", "-3"], "must not be negative"),
    (["--max-imbalance", "0.2"], "did you mean 1.2?"),
    (["--max-bubble", "150%"], "more than 100%"),
])
def test_check_refuses_a_threshold_it_could_only_misread(cli_run, args, hint):
    one_line_error(*cli_run("check", PIPELINE, *args), args[0], hint)


def test_percent_and_fraction_mean_the_same_threshold(cli_run):
    outputs = [cli_run("check", PIPELINE, "--max-bubble", text) for text in ("30%", "0.3")]
    assert outputs[0] == outputs[1] and outputs[0][0] == 1 and "max 30.0%" in outputs[0][1]


@pytest.mark.parametrize("text,hint", [("5", "did you mean 5%?"), ("-1", "must not be negative"),
                                       ("nan", "not a finite number")])
def test_diff_refuses_a_tolerance_it_could_only_misread(cli_run, text, hint):
    one_line_error(*cli_run("diff", PIPELINE, PIPELINE, f"--tolerance={text}"), "--tolerance", hint)


def test_a_config_tolerance_of_5_is_refused_naming_the_file(cli_run, tmp_path):
    (tmp_path / "pipebubble.toml").write_text("[diff]\ntolerance = 5\n")
    one_line_error(*cli_run("diff", PIPELINE, PIPELINE), "pipebubble.toml", "diff.tolerance", "did you mean 5%?")


def test_gates_that_all_skip_say_why_and_strict_fails(cli_run):
    code, out, err = cli_run("check", SINGLE, "--max-bubble", "30%", "--max-imbalance", "1.2")
    assert code == 0 and out.count("SKIP") == 2 and "not a pipeline" in out
    assert err.count("pipebubble: warning: gate") == 2 and "--strict" in err  # said even when -o takes stdout
    code, out, err = cli_run("check", SINGLE, "--max-bubble", "30%", "--strict", "--format", "json")
    body = json.loads(out)
    assert code == 1 and not body["passed"] and body["gates"][0]["status"] == "error"


def test_strict_diff_fails_on_what_only_one_report_has(cli_run):
    code, out, err = cli_run("diff", PIPELINE, SINGLE)
    assert code == 0 and "not compared: pipeline only in the base report" in err
    code, out, _ = cli_run("diff", PIPELINE, SINGLE, "--strict")
    assert code == 1 and "ERROR: pipeline only in the base report" in out


@pytest.mark.parametrize("command", ["analyze", "export", "check", "diff"])
def test_an_unwritable_output_is_exit_2_naming_it_in_every_command(cli_run, tmp_path, command):
    target = tmp_path / "missing-folder" / ("out.pftrace" if command == "export" else "out.txt")
    args = {"check": ["--max-bubble", "90%"], "diff": [PIPELINE]}.get(command, [])
    one_line_error(*cli_run(command, PIPELINE, *args, "-o", target), str(target), "cannot write output")
    folder = tmp_path / target.name  # a folder where the file should go
    folder.mkdir()
    one_line_error(*cli_run(command, PIPELINE, *args, "-o", folder), str(folder), "is a directory")


def saved(tmp_path: Path, version: int = 1, **sections) -> Path:
    path = tmp_path / f"saved-v{version}.json"
    path.write_text(json.dumps({"schema_version": version, **sections}))
    return path


@pytest.mark.parametrize("command", [["analyze"], ["check", "--max-bubble", "30%"], ["diff", PIPELINE]])
def test_a_saved_report_of_another_schema_version_is_exit_2_naming_it(cli_run, tmp_path, command):
    path = saved(tmp_path, version=2)
    one_line_error(*cli_run(command[0], path, *command[1:]), str(path), "schema_version")


def test_an_unreadable_or_empty_baseline_is_exit_2_naming_it(cli_run, tmp_path):
    broken = tmp_path / "baseline.json"
    broken.symlink_to(tmp_path / "gone.json")
    one_line_error(*cli_run("diff", broken, PIPELINE), str(broken))
    folder = tmp_path / "folder.json"
    folder.mkdir()
    one_line_error(*cli_run("diff", folder, PIPELINE), str(folder))
    cut = tmp_path / "cut.json"
    cut.write_text('{"schema_version": 1, "lanes": [')
    one_line_error(*cli_run("diff", cut, PIPELINE), str(cut))
    empty = saved(tmp_path)  # a report of nothing: every metric would be "new"
    one_line_error(*cli_run("diff", empty, PIPELINE), str(empty), "nothing to compare")
    one_line_error(*cli_run("diff", PIPELINE, empty), str(empty), "nothing to compare")


@pytest.mark.parametrize("where", ["sample", "cpu"])
def test_diff_of_a_run_recorded_again_under_other_pids_is_exit_0(cli_run, tmp_path, where):
    source = PIPELINE if where == "sample" else shared("pipeline_cpu", "interleaved1f1b")
    again = rerecord_folder(source, tmp_path / "again")
    baseline = tmp_path / "baseline.json"
    assert cli_run("analyze", source, "--format", "json", "-o", baseline)[0] == 0
    for base in (source, baseline):
        code, out, err = cli_run("diff", base, again, "--tolerance", "0%", "--strict")
        assert code == 0, out + err
        assert out.startswith("no regression beyond 0.0%") and "lane" not in out
        assert not [line for line in err.splitlines() if not line.startswith("pipebubble: note:")], err


def test_diff_offers_every_format_and_regressions_point_at_the_baseline(cli_run, tmp_path):
    slow = ROOT / "sample_traces" / "pipeline_1f1b_imbalanced"
    for fmt in ("text", "json", "junit", "github", "markdown"):
        code, out, _ = cli_run("diff", PIPELINE, slow, "--format", fmt)
        assert code == 1 and out
    code, out, _ = cli_run("diff", PIPELINE, slow, "--format", "github")
    assert f"::error file={str(PIPELINE).replace(':', '%3A')},title=pipebubble diff%3A step time regressed::" in out
    code, out, _ = cli_run("check", PIPELINE, "--max-bubble", "30%", "--format", "markdown")
    assert code == 1 and out.startswith("## pipebubble check") and "| bubble |" in out


def test_an_os_error_on_an_input_path_is_exit_2_naming_it(cli_run, tmp_path):
    """A name the file system refuses (too long) reaches no traceback: one line naming it, in every command."""
    name = str(tmp_path / ("x" * 300 + ".json"))
    for args in (["analyze", name], ["check", name, "--max-bubble", "30%"], ["diff", name, PIPELINE]):
        one_line_error(*cli_run(*args), name[:200])
