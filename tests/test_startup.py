"""What a command loads before it does its work: each checked in a fresh interpreter, since this one has
imported everything already."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
