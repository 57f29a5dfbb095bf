"""Imports point down only (ARCHITECTURE.md): no module imports from a layer above its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pipebubble"

#: What each part of the package must never import (a layer above it, or a sibling it must not know).
FORBIDDEN = {
    "errors": {"*"},
    "spans": {"*"},
    "options": {"*"},
    "report": {"ingest", "analysis", "render", "run", "executor", "cli", "capture", "gates", "config"},
    "report/serving": {"*"},
    "report/memory": {"*"},
    "report/findings": {"*"},
    "report/critical": {"*"},
    "report/strips": {"*"},
    "report/requests": {"*"},
    "report/ingest": {"*"},
    "report/pipeline": {"*"},
    "report/collectives": {"*"},
    "report/breakdown": {"*"},
    "report/idle": {"*"},
    "allocations": {"*"},
    "requests_table": {"*"},
    "executor": {"ingest", "analysis", "render", "run", "cli", "capture", "report", "gates"},
    "ingest": {"analysis", "render", "run", "cli", "capture", "report", "gates", "config"},
    "analysis": {"ingest", "render", "run", "executor", "cli", "capture", "gates", "config"},
    "gates": {"ingest", "analysis", "render", "run", "executor", "cli", "capture"},
    # gates/: the gates and their syntax, check, diff and stable names; requests' and names' import nothing above
    "gates/requests": {"*"},
    "gates/names": {"*"},
    "gates/specs": {"ingest", "analysis", "render", "run", "executor", "cli", "capture", "gates", "gates/check",
                    "gates/diff", "gates/names"},
    "gates/check": {"ingest", "analysis", "render", "run", "executor", "cli", "capture", "gates", "gates/diff"},
    "gates/diff": {"ingest", "analysis", "render", "run", "executor", "cli", "capture", "gates", "gates/check",
                   "gates/specs"},
    "config": {"ingest", "analysis", "render", "run", "executor", "cli", "capture"},
    "render": {"ingest", "run", "executor", "cli", "capture", "config"},
    "run": {"cli", "capture", "render", "gates"},
    # the way in: the map knows nothing of the reduce or of the way parts travel; the reduce and the wire
    # take the map's FilePart; the alignment is the reduce's first step
    "run/mapper": {"run", "run/reducer", "run/wire", "run/alignment", "cli", "capture", "render", "gates", "config"},
    "run/wire": {"run", "run/reducer", "run/alignment", "cli", "capture", "render", "gates", "config"},
    "run/alignment": {"run", "run/reducer", "run/wire", "cli", "capture", "render", "gates", "config"},
    "run/reducer": {"run", "run/wire", "cli", "capture", "render", "gates", "config"},
    "capture": {"ingest", "analysis", "render", "run", "executor", "cli", "report", "gates"},
}
ALLOWED_BELOW = {"errors", "spans", "options", "report/serving", "report/idle"}  # what "*" still lets a module import
#: Packages each of whose modules is a layer of its own (``report/serving`` may import less than ``report``).
SPLIT = {"report", "run", "gates"}


def _part(parts: list[str]) -> str:
    """The layer of a module given by its parts under the package (``["ingest", "cache", "entries"]`` ->
    ``ingest``; ``["report", "serving"]`` -> ``report/serving``, a module of a SPLIT package; a name that is
    no module of it, ``["report", "Report"]``, is the package's)."""
    sub = parts[1] if parts[0] in SPLIT and len(parts) > 1 else "__init__"
    if sub != "__init__" and (PACKAGE / parts[0] / f"{sub}.py").exists():
        return f"{parts[0]}/{sub}"
    return parts[0]


def _imports(path: Path) -> set[str]:
    """The layers ``path`` imports (``pipebubble.ingest.cache`` -> ``ingest``: ``_part``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "pipebubble" and len(parts) > 1:
                found.add(_part(parts[1:]))
    return found


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        part = _part([p.removesuffix(".py") for p in path.relative_to(PACKAGE).parts])
        if part in FORBIDDEN:
            yield pytest.param(path, part, id=str(path.relative_to(PACKAGE)))


@pytest.mark.parametrize("path, part", list(_modules()))
def test_imports_point_down(path, part):
    imported = _imports(path) - {part}
    rule = FORBIDDEN[part]
    if "*" in rule:
        bad = {name for name in imported if name not in ALLOWED_BELOW}
    else:  # a module of another SPLIT package is its package's, for a rule over packages; of its own, itself
        own = part.split("/")[0]
        bad = {name for name in imported if (name if name.split("/")[0] == own else name.split("/")[0]) in rule}
    assert not bad, f"{path.relative_to(PACKAGE)} imports {sorted(bad)} from a layer above"
