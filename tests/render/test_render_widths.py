"""The terminal report at any width: piped it is 80 columns unless COLUMNS says otherwise; every table fits by
cutting names in the middle and leaving out its least useful columns before a row would wrap; the stage
table adds up to the window; the timeline keeps its micro-batch numbers readable (every k-th pass, and the
--window that shows them all) and lane rows keep their rank."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import shared
from rich.console import Console
from test_render import (
    GOLDEN,
    MS,
    REPORTS,
    WIDTHS,
    fixed_date,  # noqa: F401  (autouse: the HTML header's date is fixed)
    gpipe_report,
    gpu_time_report,
    interleaved_report,
)

from pipebubble.render import cells, render, sections, terminal
from pipebubble.render.sections import Table, pipeline, timeline

NUMBER = re.compile(r"^-?[\d,]+(\.\d+)?(%|x)?$")


def analyze(*args: str, columns: str | None = None) -> subprocess.CompletedProcess:
    """The CLI with its stdout a pipe, COLUMNS as given (unset: None)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    return subprocess.run([sys.executable, "-m", "pipebubble", "analyze", *args], capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.mark.parametrize("name", ["gpipe", "interleaved", "gpu_time"])
def test_piped_text_is_the_80_column_golden_unless_columns_says(tmp_path, name):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(REPORTS[name]().to_dict()))
    piped = analyze(str(saved))
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == (GOLDEN / f"{name}.80.txt").read_text()
    wide = analyze(str(saved), columns="120")
    assert wide.stdout == (GOLDEN / f"{name}.120.txt").read_text()


def _tables(name: str, width: int) -> list[Table]:
    layout = sections.Layout(bar_width=5 if width < terminal.NARROW else 10, lane_limit=terminal.TERMINAL_LANES)
    report = REPORTS[name]()
    return [t for _, t in sections.walk(report, timeline.origin(report), layout) if t is not None]


def _body_lines(section: Table, width: int) -> list[str]:
    """The table as the terminal prints it, without its title and notes."""
    group = terminal.table(section, width)
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, color_system=None, _environ={}).print(group.renderables[1])
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", REPORTS)
def test_every_table_fits_with_one_line_a_row_and_whole_numbers(name, width):
    for section in _tables(name, width):
        fitted = terminal.fit(section, width)
        heads = max(col.count("\n") for col in fitted.section.columns) + 1
        lines = _body_lines(section, width)
        assert len(lines) == heads + 1 + len(section.rows), (section.title, width)  # headers, rule, a line a row
        assert max(len(line) for line in lines) <= width
        for row in fitted.section.rows:
            for i in fitted.section.numeric:
                assert "…" not in row[i] and (row[i] == "-" or NUMBER.match(row[i].split(" ")[0])), row[i]


def test_names_are_cut_in_the_middle_so_their_ends_still_differ():
    recs = next(t for t in _tables("interleaved", 60) if t.title.startswith("What if"))
    fitted = terminal.fit(recs, 60)
    change = [row[0] for row in fitted.section.rows]
    assert "interleaved_1f1b v=4" in change and any(c.startswith("current: ") and "v=2" in c for c in change)
    assert fitted.dropped == ["schedule"]  # the least useful column goes first, before any name is cut short
    assert cells.shorten("current: interleaved_1f1b v=2, m=8", 20) == "current: in…v=2, m=8"
    assert cells.shorten("rank0/pid12565/tid12565", 16).startswith("rank0/")
    kernel = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
    assert cells.shorten(kernel, 44) == "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(…)"
    assert cells.shorten("short", 12) == "short" and len(cells.shorten(kernel, 12)) <= 12


def test_a_column_left_out_is_named_and_the_least_useful_go_first():
    text = render(gpu_time_report(), "text", width=60)
    assert "not shown at 60 columns: std ms, min ms, max ms," in text
    assert "kernel" in text and "total" in text and "share" in text


@pytest.mark.parametrize("name", ["gpipe", "interleaved"])
def test_the_stage_columns_add_up_to_the_window_and_comm_is_inside_the_idle(name):
    report = REPORTS[name]()
    section = pipeline.stage_table(report, bar_width=0)
    assert section.columns[1:7] == ["busy", "+ fill", "+ drain", "+ steady idle", "= window", "comm in idle"]
    assert "comm in idle: the part of that idle spent communicating, not added again" in section.title
    for row, stage in zip(section.rows, report.stages, strict=True):
        busy, fill, drain, steady, window, comm = (float(cell.replace(",", "")) for cell in row[1:7])
        assert busy + fill + drain + steady == pytest.approx(window, abs=0.011)
        assert comm <= fill + drain + steady + 0.01
        assert stage.busy_ns + stage.fill_ns + stage.drain_ns + stage.steady_idle_ns == stage.busy_ns + stage.idle_ns


def _timeline(text: str) -> list[str]:
    return text.split("Timeline", 1)[1].split("\n\n", 1)[0].splitlines()[1:]


def test_a_dense_timeline_numbers_every_kth_pass_under_its_capital_and_says_so():
    report = interleaved_report()
    grid = timeline.build(report, 80)
    assert grid.every == 2 and grid.gaps and grid.zoom == (0, 50 * MS)
    text = render(report, "text", width=80)
    assert "the number under it is its micro-batch (.1: chunk 1), on every 2nd pass with room" in \
        text.replace("\n  ", " ")
    assert "--window 0:50 numbers every pass in its first 50 ms" in text.replace("\n  ", " ")
    lines = _timeline(text)
    for row, numbers in zip(lines[0:8:2], lines[1:8:2], strict=True):
        starts = [m.start() for m in re.finditer(r"\d+(\.\d+)?", numbers)]
        assert len(starts) >= 8, numbers  # a readable density: about one number every 8 columns
        assert all(row[col].isupper() for col in starts), (row, numbers)
    zoomed = timeline.build(report, 80, window=grid.zoom)
    assert zoomed.every in (0, 1) and not zoomed.gaps  # the hint keeps its word: there every pass has its number
    assert timeline.build(report, 200).every == 1 and timeline.build(report, 400).every == 0  # more room, more


def test_a_timeline_with_room_keeps_the_numbers_in_the_cells():
    grid = timeline.build(gpipe_report(), 200)
    assert grid.every == 0 and grid.zoom is None and all(not row.numbers for row in grid.rows)
    assert "F0" in grid.rows[0].cells and "F3 = micro-batch 3 starts" in timeline.legend(grid)


def test_lane_rows_keep_their_rank_and_stay_apart():
    labels = timeline.lane_labels([f"rank{r}/pid{12565 + r}/tid{12565 + r}" for r in range(4)])
    assert labels == [f"r{r}/…/tid{12565 + r}" for r in range(4)]
    same_tail = timeline.lane_labels(["rank0/pid1/tid7", "rank0/pid2/tid7", "rank12/gpu0/stream13"])
    assert len(set(same_tail)) == 3 and all(label.startswith(("r0/", "r12/")) for label in same_tail)
    text = render(interleaved_report(), "text", width=80, lanes=True)
    rows = [line for line in _timeline(text) if "│" in line]
    assert [row.split("│")[0].strip() for row in rows] == [f"r{r}/…/tid{12565 + r}" for r in range(4)]


@pytest.mark.parametrize("width", [80, 120])
def test_the_real_interleaved_trace_keeps_its_numbers_and_fits(width):
    """The trace the issue was filed on: no micro-batch number at 120 columns before; now every row has some."""
    path = shared("pipeline_cpu", "interleaved1f1b")
    proc = analyze(str(path), "--width", str(width), "-q")
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= width
    lines = _timeline(proc.stdout)
    numbered = [line for line in lines if re.match(r"^\s+\d", line) and "│" not in line]
    assert len(numbered) == 4 and all(len(re.findall(r"\d+\.\d+", line)) >= 6 for line in numbered)
    assert "--window 0:" in proc.stdout
    lanes = analyze(str(path), "--width", str(width), "--lanes", "-q")
    rows = [line for line in _timeline(lanes.stdout) if "│" in line]
    assert [row.split("│")[0].strip()[:3] for row in rows] == ["r0/", "r1/", "r2/", "r3/"]
