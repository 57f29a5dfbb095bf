"""examples/notebook.ipynb runs top to bottom in a real Jupyter kernel, shows the HTML report (its SVG
timeline) and gates the 1F1B sample. Skipped where nbclient or ipykernel is not installed (the dev extra
installs them)."""

from __future__ import annotations

import html
import sys
from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "notebook.ipynb"


def outputs(cell) -> str:
    """All a cell showed: its streams, its results' HTML, Markdown and plain text."""
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts += [data.get(kind, "") for kind in ("text/html", "text/markdown", "text/plain")]
    return "\n".join(parts)


@pytest.mark.slow
def test_the_example_notebook_runs_and_shows_the_report():
    if not (ROOT / "sample_traces" / "pipeline_1f1b").exists():
        pytest.skip("sample traces absent")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK.parent)}})
    limit = sys.getrecursionlimit()
    try:
        client.execute()  # raises CellExecutionError, with the cell's traceback, when a cell fails
    finally:  # the kernel machinery raises this process's recursion limit (to 3000), which changes how deep a
        sys.setrecursionlimit(limit)  # JSON value decodes without repair in the tests that follow
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    shown = html.unescape(outputs(code[0]))  # the report, in its frame
    assert "<iframe srcdoc=" in outputs(code[0]) and "<svg" in shown and "pipebubble report" in shown
    assert "utilization" in outputs(code[1])  # the stage table
    assert "busy" in outputs(code[2])  # the drawn (or tabled) stage time
    assert "passed: False" in outputs(code[3]) and "**failed**" in outputs(code[3])
    assert outputs(code[4]).strip() == "[]"
