"""Every minimal bad input of ../shared/repros through the real command line in every output format the
registry has: ``analyze`` in each of its formats (CSV with each ``--table``), ``export`` in each of its
formats, ``check`` with gates and ``diff`` of the file with itself. Each ends with exit 0 and output that
parses, or exit 2 and one stderr line naming the file; never 1 (no gate here can fail) or 3.

The commands run in this process (``cli.main``, as the ``pipebubble`` script runs it): the first reads the
file afresh (``--no-cache``, as the repros' README runs it), the others find its report in this test's own
cache, so a file costs one read, not one per format.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from every_format import EXPORT_NAMES, GATES, assert_export, assert_valid, cases

from pipebubble import cli
from pipebubble.render import formats

ROOT = Path(__file__).resolve().parents[2]
REPROS = ROOT.parent / "shared" / "repros"
NOT_INPUTS = {"README.md", "INDEX.txt"}
FILES = sorted(p for p in REPROS.rglob("*") if p.is_file() and p.name not in NOT_INPUTS) if REPROS.exists() else []
def test_every_format_of_the_registry_is_covered():
    """A format added to the registry is run here too (export's by the output names below)."""
    assert {name for name, _ in cases()} >= set(formats.names("analyze")) - {"csv"}
    assert set(EXPORT_NAMES) == set(formats.names("export"))
    assert {formats.from_suffix(out, "export").name for out in EXPORT_NAMES.values()} == set(EXPORT_NAMES)


def invoke(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        cli.main(list(args))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def assert_outcome(path: Path, what: str, code: int, err: str) -> None:
    assert code in (0, 2), f"{path.name} {what}: exit {code}: {err}"
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("pipebubble: error: ") and path.name in lines[0], (
            f"{path.name} {what}: exit 2 must say one line naming the file: {err}")


@pytest.mark.skipif(not FILES, reason=f"the minimal bad inputs are not available ({REPROS} is absent)")
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(REPROS)))
def test_a_repro_in_every_format_is_exit_0_or_2(path, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no config file of this project applies
    codes = set()
    for i, (what, args) in enumerate(cases()):
        code, out, err = invoke(capsys, "analyze", str(path), *(["--no-cache"] if i == 0 else []), *args)
        assert_outcome(path, what, code, err)
        codes.add(code)
        if code == 0:
            assert_valid(path, what, out)
    assert len(codes) == 1, f"{path.name}: the exit code depends on the format: {codes}"
    for name, output in EXPORT_NAMES.items():
        code, _, err = invoke(capsys, "export", str(path), "-o", str(tmp_path / output), "--quiet")
        assert_outcome(path, f"export {name}", code, err)
        if code == 0:
            assert_export(path, name, tmp_path / output)
    code, out, err = invoke(capsys, "check", str(path), *GATES, "--format", "json")
    assert_outcome(path, "check", code, err)
    if code == 0:
        assert json.loads(out)["passed"] is True
        gaps = [g for g in json.loads(out)["gates"] if g["name"] == "completeness"]
        whole = [a for a in GATES if a != "--allow-partial"]
        strict, _, _ = invoke(capsys, "check", str(path), *whole, "--format", "json")
        assert strict == (1 if gaps else 0), f"{path.name}: an incomplete input fails check, a complete one passes"
    code, out, err = invoke(capsys, "diff", str(path), str(path), "--format", "json", "--allow-partial")
    assert_outcome(path, "diff", code, err)
    if code == 0:
        assert json.loads(out)["regressions"] == []
