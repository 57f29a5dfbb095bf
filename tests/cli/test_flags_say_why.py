"""Every flag works or says why not, and help shows what it says: a --window that ends before it starts or
misses the timeline, a --stage-by that finds no stages, a Ray cluster that cannot be reached or a job too small
for it, a capture over an earlier one, a command run without its paths, and help text rich would swallow."""

from __future__ import annotations

import json
import re
import socket
import sys
import types
from pathlib import Path

import pytest

from pipebubble import cli
from pipebubble.render.choices import CSV_TABLES

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"
CPU_PIPELINE = ROOT / "sample_traces" / "pipeline_gpipe"  # captured on CPU ranks: no GPU work


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


def one_error_line(err: str) -> bool:
    return err.count("\n") == 1 and err.startswith("pipebubble: error: ")


# ---- --window ----------------------------------------------------------------------------------------------


def test_a_window_that_ends_before_it_starts_is_exit_2_in_one_line(capsys):
    code, out, err = run(capsys, "analyze", str(SAMPLE), "--window", "100:50")
    assert code == 2 and out == "" and one_error_line(err), err
    assert "--window 100:50 ends before it starts" in err and "--window 50:100" in err


@pytest.mark.parametrize("window, words", [("100:100", "is empty"), ("abc", "expects START:END"),
                                           ("nan:5", "expects START:END"), ("1:inf", "expects START:END")])
def test_an_empty_or_unreadable_window_is_exit_2_in_one_line(capsys, window, words):
    code, _, err = run(capsys, "analyze", str(SAMPLE), f"--window={window}")
    assert code == 2 and one_error_line(err) and words in err, err


def test_a_window_outside_the_timeline_is_exit_2_saying_where_the_timeline_lies(capsys):
    code, out, err = run(capsys, "analyze", str(SAMPLE), "--window", "5000:6000", "--width", "100")
    assert code == 2 and out == "" and one_error_line(err), err
    assert "--window 5000:6000 lies outside the timeline, which runs from 0.00 to " in err


def test_a_window_inside_the_timeline_zooms_it(capsys):
    code, out, _ = run(capsys, "analyze", str(SAMPLE), "--window", "10:50", "--width", "100")
    assert code == 0 and "Timeline (10.00 to 50.00 ms)" in out


# ---- --stage-by --------------------------------------------------------------------------------------------


def test_stage_by_device_on_cpu_ranks_says_it_found_no_stages_in_text_and_json(capsys):
    note = "--stage-by device found no stages: these traces have no GPU work; try --stage-by rank or thread"
    code, out, _ = run(capsys, "analyze", str(CPU_PIPELINE), "--stage-by", "device", "--width", "200")
    assert code == 0 and note in out
    code, out, _ = run(capsys, "analyze", str(CPU_PIPELINE), "--stage-by", "device", "--format", "json")
    report = json.loads(out)
    assert code == 0 and note in report["notes"] and report["pipeline"] is None


# ---- --executor ray ----------------------------------------------------------------------------------------


def fake_ray(monkeypatch, init=None) -> list[dict]:
    """A stand-in for Ray that records ``ray.init``'s calls (no cluster, and no Ray installed, needed)."""
    calls: list[dict] = []

    def start(**kwargs):
        calls.append(kwargs)
        if init is not None:
            init(**kwargs)

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False, init=start))
    return calls


def closed_port() -> int:
    """A local port nothing listens on: bound, then let go."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_ray_address_nothing_answers_at_is_exit_2_naming_it(capsys, monkeypatch):
    calls = fake_ray(monkeypatch)
    address = f"127.0.0.1:{closed_port()}"
    code, out, err = run(capsys, "analyze", str(SAMPLE), "--executor", "ray", "--ray-address", address, "--no-cache")
    assert code == 2 and out == "" and one_error_line(err), err
    assert f"--ray-address {address}: no Ray cluster answers there" in err and not calls


def test_ray_address_auto_without_a_cluster_is_exit_2_in_our_words(capsys, monkeypatch):
    def no_cluster(**_):
        raise ConnectionError("Could not find any running Ray instance. Please specify the one to connect to by "
                              "setting `--address` flag or `RAY_ADDRESS` environment variable.")

    fake_ray(monkeypatch, no_cluster)
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--executor", "ray", "--ray-address", "auto", "--no-cache")
    assert code == 2 and one_error_line(err), err
    assert "--ray-address auto: no Ray cluster is running" in err and "`--address`" not in err


def test_one_file_on_ray_is_mapped_here_and_says_so(capsys, monkeypatch):
    calls = fake_ray(monkeypatch)
    one = SAMPLE / "rank0.pt.trace.json.gz"
    code, out, err = run(capsys, "analyze", str(one), "--executor", "ray", "--ray-address", "127.0.0.1:1",
                         "--no-cache", "--format", "json")
    assert code == 0 and json.loads(out)["lanes"] and not calls
    assert "pipebubble: warning: --executor ray was not used: one file is mapped in this process" in err


def test_a_cached_report_says_ray_was_not_used(capsys, monkeypatch):
    calls = fake_ray(monkeypatch)
    assert run(capsys, "analyze", str(SAMPLE), "--format", "json")[0] == 0  # the report cache now holds it
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--executor", "ray", "--format", "json")
    assert code == 0 and not calls
    assert "--executor ray was not used: the report came from the cache" in err and "--no-cache" in err


# ---- capture over an earlier capture -----------------------------------------------------------------------


def earlier_capture(folder: Path) -> Path:
    folder.mkdir()
    (folder / "capture.json").write_text("{}")
    for rank in range(4):
        (folder / f"rank{rank}.pt.trace.json.gz").write_bytes(b"")
    return folder


def test_capture_over_an_earlier_capture_is_refused_without_torch(capsys, monkeypatch, tmp_path):
    folder = earlier_capture(tmp_path / "pp")
    monkeypatch.setitem(sys.modules, "pipebubble.capture", None)  # importing the capture package would fail
    code, _, err = run(capsys, "capture", "--workload", "pipeline", "--out", str(folder))
    assert code == 2 and one_error_line(err), err
    assert f"{folder}/ holds an earlier capture (capture.json, 4 traces)" in err and "--force" in err
    assert len(list(folder.iterdir())) == 5  # nothing was touched


def test_force_or_a_new_folder_is_not_refused(tmp_path):
    from pipebubble.cli.capture import _refuse_earlier

    folder = earlier_capture(tmp_path / "pp")
    _refuse_earlier(folder, force=True)
    _refuse_earlier(tmp_path / "new", force=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    _refuse_earlier(tmp_path / "other", force=False)  # a folder of other files is no earlier capture


def test_the_refusal_knows_the_names_a_capture_writes():
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("the capture package needs torch")
    from pipebubble.capture.metadata import METADATA_NAME
    from pipebubble.capture.runner import TRACE_PATTERN
    from pipebubble.cli.capture import EARLIER_CAPTURE

    assert EARLIER_CAPTURE == (METADATA_NAME, TRACE_PATTERN)


# ---- a command without its paths ---------------------------------------------------------------------------


@pytest.mark.parametrize("args, example", [
    (["analyze"], "pipebubble analyze traces/"),
    (["analyze", "--gpu-cost", "3"], "pipebubble analyze traces/"),
    (["check"], "pipebubble check traces/"),
    (["diff"], "pipebubble diff baseline.json traces/"),
    (["diff", "baseline.json"], "pipebubble diff baseline.json traces/"),
    (["export"], "pipebubble export traces/ -o annotated.pftrace"),
])
def test_a_command_without_its_paths_says_so_in_two_lines_with_an_example(capsys, args, example):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    first, second = err.splitlines()
    assert first.startswith(f"pipebubble: error: {args[0]} needs ") and example in second


# ---- help --------------------------------------------------------------------------------------------------


def help_text(capsys, monkeypatch, command: str) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # no help line wraps
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    return " ".join(out.split())


def test_capture_help_shows_its_bracketed_words(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "capture")
    assert "[memory]" in text and "[default: 32 rows per micro-batch]" in text


def test_analyze_help_names_every_csv_table(capsys, monkeypatch):
    text = help_text(capsys, monkeypatch, "analyze")
    listed = text[text.index("The table --format csv writes"):]
    assert all(re.search(rf"\b{table}\b", listed) for table in CSV_TABLES)


@pytest.mark.parametrize("command", ["check", "diff"])
def test_the_timeunit_help_of_check_and_diff_names_their_own_formats(capsys, monkeypatch, command):
    text = help_text(capsys, monkeypatch, command)
    said = text[text.index("Unit of the times in"):][:200]
    assert "text, junit, github and markdown output" in said and "html" not in said and "csv" not in said


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_bracketed_word_of_an_options_help_is_shown(capsys, monkeypatch, command):
    cli._register([command])
    text = help_text(capsys, monkeypatch, command)
    import typer.main

    params = typer.main.get_command(cli.app).commands[command].params
    said = [re.sub(r"\\\[", "[", p.help or "") for p in params]
    for bracketed in (b for help_ in said for b in re.findall(r"\[[^\]]*\]", help_)):
        assert " ".join(bracketed.split()) in text, f"{command} --help drops {bracketed}"
