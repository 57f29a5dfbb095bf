"""What a folder of traces may hold besides traces, and where output goes: an Nsight report beside its SQLite
export, a saved report, capture's files; an output name that does not fit its format; `wrote PATH (N KB)`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipebubble import cli
from pipebubble.ingest import find_traces

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    import nsys_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "toy_train"


def run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code, out, err


@pytest.fixture
def no_nsys(monkeypatch, tmp_path):
    """A PATH without nsys on it: what most machines that analyse traces have."""
    bare = tmp_path / "bin"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))


def nsys_pair(folder: Path, stale: bool = False) -> tuple[Path, Path]:
    """`report1.nsys-rep` (nsys's own format: unreadable without nsys) and its `report1.sqlite` export."""
    folder.mkdir(exist_ok=True)
    trace = fx.Trace(processes={100: "python3"}, gpu=[fx.Gpu(100, 0, 7, 1_000, 2_000, correlation=1)])
    report = folder / "report1.nsys-rep"
    report.write_bytes(b"\x00nsys report, a format only nsys reads")
    sqlite = fx.write(trace, folder / "report1.sqlite")
    mtime = report.stat().st_mtime
    os.utime(sqlite, (mtime - 60, mtime - 60) if stale else (mtime + 1, mtime + 1))
    return report, sqlite


def test_a_folder_with_a_report_and_its_export_reads_the_export(capsys, tmp_path, no_nsys):
    report, sqlite = nsys_pair(tmp_path / "run")
    assert find_traces([tmp_path / "run"]) == [sqlite]
    code, out, err = run(capsys, "analyze", str(tmp_path / "run"), "--format", "json", "--no-cache")
    assert code == 0, err
    assert json.loads(out)["ingest"]["files"] == [str(sqlite)] and "nsys" not in err


def test_a_report_named_alone_is_read_from_the_export_beside_it(capsys, tmp_path, no_nsys):
    report, _ = nsys_pair(tmp_path / "run")
    code, out, err = run(capsys, "analyze", str(report), "--format", "json", "--no-cache")
    assert code == 0, err
    assert json.loads(out)["lanes"]


def test_a_stale_export_is_not_read_for_its_report(capsys, tmp_path, no_nsys):
    report, sqlite = nsys_pair(tmp_path / "run", stale=True)
    notes: list[str] = []
    assert find_traces([tmp_path / "run"], notes) == [report]
    assert notes == [f"{sqlite}: skipped, older than report1.nsys-rep (export it again)"]
    code, _, err = run(capsys, "analyze", str(tmp_path / "run"), "--no-cache")
    assert code == 2 and "needs nsys on PATH" in err


def saved_report(path: Path, capsys) -> Path:
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--format", "json", "-o", str(path), "-q")
    assert code == 0, err
    return path


def test_a_saved_report_in_a_trace_folder_is_skipped_with_a_note(capsys, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(SAMPLE, folder)
    saved = saved_report(folder / "report.json", capsys)
    code, out, err = run(capsys, "analyze", str(folder), "--format", "json", "--no-cache")
    assert code == 0, err
    assert err == (f"pipebubble: note: {saved}: skipped, a saved pipebubble report, not a trace (read it alone: "
                   f"pipebubble analyze {saved})\n")
    assert json.loads(out)["ingest"]["files"] == [str(folder / "rank0.pt.trace.json.gz")]


def test_a_folder_of_saved_reports_only_says_so(capsys, tmp_path):
    (tmp_path / "run").mkdir()
    saved = saved_report(tmp_path / "run" / "report.json", capsys)
    code, _, err = run(capsys, "analyze", str(tmp_path / "run"))
    assert code == 2 and err.count("\n") == 1  # one line, and it says why
    assert err.endswith(f"folder holds no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep, *.qdrep); {saved}: "
                        f"skipped, a saved pipebubble report, not a trace (read it alone: pipebubble analyze "
                        f"{saved})\n")


def test_capture_json_is_passed_over_without_a_word(capsys):
    assert (SAMPLE / "capture.json").exists()
    code, _, err = run(capsys, "analyze", str(SAMPLE), "--format", "json")
    assert code == 0 and err == ""


def test_capture_files_and_saved_reports_named_among_traces_are_skipped(capsys, tmp_path):
    # `pipebubble analyze out/*`: the shell names everything capture wrote, and a report saved beside it.
    folder = tmp_path / "out"
    shutil.copytree(SAMPLE, folder)
    (folder / "capture.log").write_text("USDT:2026-12-01 14:23:09 1:1 SyncActivityProfilerHandler.cpp:52] x\n")
    saved = saved_report(folder / "report.json", capsys)
    named = sorted(folder.iterdir())
    code, out, err = run(capsys, "analyze", *map(str, named), "--format", "json", "--no-cache")
    assert code == 0, err
    assert json.loads(out)["ingest"]["files"] == [str(folder / "rank0.pt.trace.json.gz")]
    assert err.splitlines() == [
        f"pipebubble: note: {folder / 'capture.json'}: skipped, capture's record of the run, not a trace",
        f"pipebubble: note: {folder / 'capture.log'}: skipped, capture's log of the profiler's messages, not a trace",
        f"pipebubble: note: {saved}: skipped, a saved pipebubble report, not a trace (read it alone: pipebubble "
        f"analyze {saved})",
    ]


def test_capture_json_named_alone_says_what_it_is(capsys):
    code, _, err = run(capsys, "analyze", str(SAMPLE / "capture.json"))
    assert code == 2
    assert err == f"pipebubble: error: {SAMPLE / 'capture.json'}: capture's record of the run, not a trace\n"


@pytest.mark.parametrize("args, asks", [
    (["-o", "out.pdf"], "out.pdf: expected an output name ending in"),  # analyze chooses by suffix
    (["--format", "json", "-o", "out.html"], "the name asks for html, but the output is json"),
    (["--format", "text", "-o", "out.pdf"], ".pdf is not a format of analyze; the output is text"),
])
def test_an_output_name_that_does_not_fit_is_exit_2_before_any_reading(capsys, tmp_path, monkeypatch, args, asks):
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "analyze", str(tmp_path / "no-such-trace"), *args)
    assert code == 2 and asks in err, err  # not "no such file": the name was checked first
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name, fmt", [("report.txt", "json"), ("report.log", "markdown"), ("report", None)])
def test_plain_names_fit_any_text_format(capsys, tmp_path, name, fmt):
    code, _, err = run(capsys, "analyze", str(SAMPLE), "-o", str(tmp_path / name), *(["-f", fmt] if fmt else []))
    assert code == 0, err


def test_writing_a_file_says_where_and_how_big(capsys, tmp_path):
    target = tmp_path / "report.json"
    code, out, err = run(capsys, "analyze", str(SAMPLE), "-o", str(target))
    size = target.stat().st_size
    assert code == 0 and out == ""
    assert err == f"pipebubble: wrote {target} ({round(size / 1024)} KB)\n"
    code, _, err = run(capsys, "analyze", str(SAMPLE), "-o", str(target), "--quiet")
    assert code == 0 and err == ""


@pytest.mark.parametrize("command", ["analyze", "capture"])
def test_the_output_flags_are_the_same_everywhere(command):
    from typer.main import get_command

    cli._register()
    params = {p.name: p for p in get_command(cli.app).commands[command].params}
    assert params["output"].opts[:2] == ["--output", "-o"] and params["width"].opts == ["--width"]
    assert params["quiet"].opts == ["--quiet", "-q"]


def test_human_sizes():
    from pipebubble.cli.output import human_bytes

    sizes = [0, 812, 1024, 41 * 1024 + 7, int(12.34 * 2**20), 250 * 2**20, int(1.2 * 2**30)]
    assert [human_bytes(n) for n in sizes] == ["0 bytes", "812 bytes", "1 KB", "41 KB", "12.3 MB", "250 MB", "1.2 GB"]


@pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir(), reason="reads Linux's /proc")
def test_bytes_read_of_an_open_file_and_of_a_mapped_one(tmp_path):
    import mmap

    from pipebubble.cli.output import bytes_read

    path = tmp_path / "big.json"
    path.write_bytes(b"x" * (1 << 20))
    with open(path, "rb") as fh:
        fh.read(300_000)
        assert 300_000 <= bytes_read([str(path)])[str(path)] < 1 << 20  # the descriptor's offset (buffered)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as view:
        fh.seek(0)
        assert view[: 1 << 19].count(b"x") == 1 << 19  # half of it paged in
        assert (1 << 19) <= bytes_read([str(path)])[str(path)] <= 1 << 20
    assert bytes_read([str(path)]) == {}


def test_the_progress_counts_bytes_of_finished_files(tmp_path):
    from pipebubble.cli.output import _Reading

    small, big = tmp_path / "a.json", tmp_path / "b.json"
    small.write_bytes(b"a" * 1000)
    big.write_bytes(b"b" * 9000)
    reading = _Reading([small, big])
    task = reading.bar.tasks[0]
    assert task.total == 10_000 and task.completed == 0
    reading.done(str(big))
    assert task.completed == 9000 and task.fields["files"] == "1/2 files"
    reading._update({str(small): 5000})  # being read: never counted as done before it is
    assert task.completed == 9000 + 990
