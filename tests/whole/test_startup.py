"""What a command loads before it does its work: each checked in a fresh interpreter, since this one has
imported everything already."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "sample_traces" / "toy_train"

# Runs the command line in this interpreter, then prints which modules it had loaded when it exited.
PROBE = """\
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.__stderr__))
from pipebubble.cli import main
main(sys.argv[1:])
"""


def loaded(*argv: str) -> tuple[int, set[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300)
    return proc.returncode, set(json.loads(proc.stderr.strip().splitlines()[-1]))


def commands(modules: set[str]) -> set[str]:
    return {m.rsplit(".", 1)[1] for m in modules if m.startswith("pipebubble.cli.")} - {"flags", "output"}


def test_help_lists_every_command_and_loads_no_polars():
    code, modules = loaded("--help")
    assert code == 0
    assert commands(modules) == {"analyze", "theory", "capture", "export", "check", "diff"}
    assert "polars" not in modules
    assert "pydantic" not in modules


def test_a_named_command_builds_only_itself():
    code, modules = loaded("theory", "--stages", "4", "--microbatches", "8")
    assert code == 0
    assert commands(modules) == {"theory"}


def test_an_unknown_command_is_told_the_names_there_are():
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "anlyze", "x"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert "No such command 'anlyze'" in proc.stderr and "analyze" in proc.stderr.split("Did you mean", 1)[1]


def test_a_json_trace_loads_only_its_command_and_no_nsight_reader(tmp_path):
    if not TOY.exists():
        pytest.skip("sample traces absent")
    code, modules = loaded("analyze", str(TOY), "--no-cache", "--format", "json", "-o", str(tmp_path / "r.json"))
    assert code == 0
    assert commands(modules) == {"analyze"}
    assert "pipebubble.ingest.nsys" not in modules and "sqlite3" not in modules


# ``python -m pipebubble`` (like the ``pipebubble`` script) ends through ``cli.entry``: a quick exit that
# skips the interpreter's teardown. What a normal exit does must still happen.

SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"


def buffered(env: dict | None = None) -> dict:
    """``env`` (this one's by default) with stdout buffered as it is for most users: no PYTHONUNBUFFERED."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONUNBUFFERED"}


def module(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m pipebubble``, its stdout buffered."""
    return subprocess.run([sys.executable, "-m", "pipebubble", *argv], capture_output=True, text=True,
                          timeout=300, env=buffered(env))


def test_the_quick_exit_keeps_every_exit_code(tmp_path):
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    assert module("analyze", str(SAMPLE), "-q").returncode == 0
    assert module("analyze", str(tmp_path / "absent.json")).returncode == 2
    assert module("check", str(SAMPLE), "--max-bubble", "0.0001", "-q").returncode == 1


def test_the_quick_exit_writes_all_that_was_buffered(tmp_path):
    """What is still in stdout's buffer at the end (``--version`` prints without flushing) reaches the
    pipe, and so does a report bigger than the buffer."""
    proc = module("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("pipebubble ")
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    proc = module("analyze", str(SAMPLE), "--format", "json", "-q")
    assert proc.returncode == 0
    assert len(proc.stdout) > 8192 and json.loads(proc.stdout)["schema_version"]


@pytest.mark.parametrize("fmt", ["json", "html"])
def test_a_reader_that_leaves_early_is_no_error(fmt):
    """``pipebubble analyze ... | head -1``: exit 0, nothing on stderr, also when the output is longer than the
    pipe holds (the HTML report: the write itself then fails, not only the flush at exit)."""
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    proc = subprocess.Popen([sys.executable, "-m", "pipebubble", "analyze", str(SAMPLE), "--format", fmt, "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=buffered())
    assert proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and err == b""


def test_exit_handlers_still_run(tmp_path):
    """A cache that is not a folder sends a spill to a temporary folder, removed at exit."""
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    (tmp_path / "cache").write_text("not a folder")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": str(tmp_path / "cache"), "PIPEBUBBLE_SPILL_BYTES": "1000",
           "TMPDIR": str(scratch)}
    proc = module("analyze", str(SAMPLE / "rank0.pt.trace.json.gz"), "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "using a temporary folder" in proc.stderr
    assert json.loads(proc.stdout)["ingest"]["spans"] > 0
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("argv", [("analyze", str(TOY), "--format", "json"), ("--version",)], ids=["report", "version"])
def test_stdout_on_a_full_disk_is_exit_2_said_once(argv):
    """A report written straight away, and a line still in the buffer at the exit, alike."""
    if not Path("/dev/full").exists() or not TOY.exists():
        pytest.skip("no /dev/full, or sample traces absent")
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "pipebubble", *argv], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=300, env=buffered())
    assert proc.returncode == 2
    assert proc.stderr == "pipebubble: error: <stdout>: cannot write output: No space left on device\n"
