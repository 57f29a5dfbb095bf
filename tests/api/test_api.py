"""The Python API (``import pipebubble``): the same report, cache and gates as the command line, tables as
DataFrames, errors as one-line pipebubble errors."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import traceback
from dataclasses import fields
from pathlib import Path

import polars as pl
import pytest

import pipebubble as pb
from pipebubble.api import frames
from pipebubble.cli import flags
from pipebubble.errors import OutputError, PipebubbleError, TraceFormatError

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
ONE_F_ONE_B = SAMPLES / "pipeline_1f1b"
# Every bundled capture: a folder with capture.json (sample_traces/memory holds four of them)
CAPTURES = sorted(p.parent for p in SAMPLES.rglob("capture.json"))
pytestmark = pytest.mark.skipif(not ONE_F_ONE_B.exists(), reason="sample traces absent")


@pytest.fixture(scope="module")
def report() -> pb.Report:
    return pb.analyze(ONE_F_ONE_B)


def cli_json(*args: str) -> dict:
    proc = subprocess.run([sys.executable, "-m", "pipebubble", "analyze", *args, "--format", "json", "-q"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("folder", CAPTURES, ids=[str(p.relative_to(SAMPLES)) for p in CAPTURES])
def test_to_dict_is_the_cli_json_for_every_sample(folder):
    assert len(CAPTURES) >= 7
    assert pb.analyze(folder, cache=False).to_dict() == cli_json(str(folder), "--no-cache")


def test_settings_give_the_cli_options_and_its_cache_entry():
    """Named as the flags, laid over pipebubble.toml the same way: the same Options, so the same cache key."""
    given = {"stage_by": "rank", "stage": ["a=rank0", "b=rank[123]"], "pp_size": 4, "rank_order": "pp-dp-tp",
             "wait_threshold": 0.02, "gpu_cost": 3.0, "memory_limit": "80GiB", "tbt_slo": 20.0}
    expected = flags.options(None, **{**given, "stage_by": flags.StageBy.rank}, no_align=True)
    assert pb.Settings(**given, no_align=True).options() == expected
    assert pb.Settings(**given, align=False).options() == expected
    assert pb.Settings(**{**given, "stage": {"a": "rank0", "b": "rank[123]"}}, no_align=True).options() == expected
    assert pb.Settings(workers=2, memory_budget="2G", cache=False).scale() == flags.scale(
        "local", 2, None, "2G", no_cache=True)


def test_every_cli_analysis_flag_is_a_setting():
    """A flag added to the CLI and not to the API fails here (--no-cache is cache=False)."""
    names = {f.name for f in fields(pb.Settings)}
    assert {name.replace("no_cache", "cache") for name in flags.ANALYSIS_FLAGS} <= names


def test_the_api_reads_the_cache_the_cli_filled(monkeypatch, tmp_path):
    cli_json(str(ONE_F_ONE_B))
    import pipebubble.run
    from pipebubble.ingest.cache import entries

    entries.code_identity.cache_clear()  # the package's files as the CLI just saw them, edited since or not

    monkeypatch.setattr(pipebubble.run, "execute", lambda *a, **k: pytest.fail("the report was computed again"))
    assert pb.analyze(ONE_F_ONE_B).pipeline.bubble_fraction > 0


def bare(value):
    """``value`` without the null entries of its mappings: a struct column gives every row each key any row has."""
    if isinstance(value, dict):
        return {k: bare(v) for k, v in value.items() if v is not None}
    return [bare(v) for v in value] if isinstance(value, list) else value


def test_tables_are_dataframes_of_the_json_rows(report):
    data = report.to_dict()
    assert report.tables == tuple(frames.TABLES)
    for name in report.tables:
        table = getattr(report, name)
        assert isinstance(table, pl.DataFrame) and table is report.table(name)
        assert table.height == len(frames.rows(data, name))  # each cell: tests/api/test_frames_sections.py
        flattened = [c for c in frames._schema(name) if c not in table.columns]  # nested rows as columns
        assert all(any(col.startswith(c.removesuffix("_causes")) for col in table.columns) for c in flattened)
    assert report.stages.height == 4 and report.stages["busy_ns"].dtype == pl.Int64
    assert report.stages["lanes"].dtype == pl.List(pl.String)


def test_an_unknown_column_is_typed_not_null():
    """The serve sample's GPU lane has no stream: still Int64, unknown as null."""
    lanes = pb.analyze(SAMPLES / "serve").lanes
    assert lanes["stream"].dtype == pl.Int64 and lanes["stream"].null_count() == lanes.height


def test_to_pandas(report, monkeypatch):
    pd = pytest.importorskip("pandas")
    stages = report.to_pandas("stages")
    assert isinstance(stages, pd.DataFrame) and list(stages.columns) == report.stages.columns
    assert str(stages["busy_ns"].dtype) == "Int64" and stages["busy_ns"].tolist() == report.stages["busy_ns"].to_list()
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(PipebubbleError, match="pip install pandas"):
        report.to_pandas("stages")


def test_an_unknown_table_names_the_known(report):
    with pytest.raises(PipebubbleError, match="unknown table 'stage'.*stages"):
        report.table("stage")


@pytest.mark.parametrize("name", ["r.html", "r.json", "r.md", "r.csv", "r.txt"])
def test_save_picks_the_format_from_the_suffix(report, tmp_path, name, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    fmt = {".html": "html", ".json": "json", ".md": "markdown", ".csv": "csv", ".txt": "text"}[Path(name).suffix]
    assert report.save(tmp_path / name, width=100).read_text() == report.render(fmt, width=100)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left beside it


def test_save_and_render_refuse_what_the_cli_refuses(report, tmp_path):
    with pytest.raises(PipebubbleError, match=r"r\.pdf: expected an output name ending in .*\.html"):
        report.save(tmp_path / "r.pdf")
    with pytest.raises(OutputError, match="is a directory"):
        report.save(tmp_path, format="json")
    with pytest.raises(PipebubbleError, match="csv"):
        report.render("html", table="stages")
    with pytest.raises(PipebubbleError, match="unknown output option 'colour'"):
        report.render("text", colour=True)
    with pytest.raises(PipebubbleError, match="timeunit='min'"):
        report.render("text", timeunit="min")
    assert report.render("csv", table="stages", timeunit="us").startswith("stage,name,lanes,busy_us")


def test_a_notebook_shows_the_html_report_in_a_frame_of_its_own(report, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    shown = report._repr_html_()
    assert shown.startswith("<iframe srcdoc=\"") and "<style>" not in shown  # no page style leaks out
    page = html.unescape(re.search(r'srcdoc="([^"]*)"', shown).group(1))
    assert page == report.render("html") and "<svg" in page


def test_repr_is_the_headline(report):
    text = repr(report)
    assert text.splitlines()[0].startswith("pipebubble.Report of 4 files: ")
    assert "bubble, measured: " in text and "stages (4)" in text and len(text.splitlines()) < 12


def test_check_gates_without_exiting(report, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no pipebubble.toml to lay thresholds under these
    result = pb.check(report, max_bubble=0.05)
    assert result.passed is False and not result and [g.status for g in result.gates] == ["fail"]
    assert pb.check(ONE_F_ONE_B, max_bubble="90%", max_imbalance=1.5)
    assert pb.check(report.to_dict(), max_bubble=0.9).passed
    assert repr(result).startswith("FAIL  bubble") and "**failed**: 0 passed, 1 failed" in result._repr_markdown_()
    assert json.loads(result.render("json"))["passed"] is False
    assert "<testsuites" in result.render("junit") and result.timestamp and result.seconds is not None
    with pytest.raises(PipebubbleError, match="did you mean 30%"):
        pb.check(report, max_bubble=30)
    with pytest.raises(PipebubbleError, match="no gates"):
        pb.check(report)
    with pytest.raises(PipebubbleError, match="apply to traces, not to a report"):
        pb.check(report, max_bubble=0.3, pp_size=2)


def test_check_takes_the_settings_file(report, tmp_path):
    toml = tmp_path / "pipebubble.toml"
    toml.write_text("[check]\nmax-bubble = 0.05\n")
    assert pb.check(report, config=toml).passed is False
    assert pb.check(report, config=toml, max_bubble=0.99).passed


def test_check_names_the_input_as_the_cli(report):
    assert pb.check(ONE_F_ONE_B, max_bubble=0.5).source == str(ONE_F_ONE_B)
    assert pb.check(report, max_bubble=0.5).source is None


def test_diff(report, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    same = pb.diff(report, report)
    assert same.regressions == [] and same.improvements == [] and same and same.passed
    assert repr(same).startswith("no regression beyond 5.0%")
    saved = report.save(tmp_path / "base.json")
    worse = pb.diff(saved, SAMPLES / "pipeline_1f1b_imbalanced", tolerance="1%")
    assert not worse and worse.regressions and worse.base == str(saved)
    assert {d.status for d in worse.regressions} == {"regressed"}
    with pytest.raises(PipebubbleError, match="tolerance 5: a bare number"):
        pb.diff(report, report, tolerance=5)


def test_a_missing_path_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "absent"
    with pytest.raises(TraceFormatError, match=f"{re.escape(str(missing))}: no such file") as caught:
        pb.analyze(missing)
    # the traceback ends at the API's door, not in the reader that found it
    frames_shown = [f.filename for f in traceback.extract_tb(caught.value.__traceback__)]
    assert not any("ingest" in name or "run.py" in name for name in frames_shown), frames_shown
    for call in (lambda: pb.check(missing, max_bubble=0.3), lambda: pb.diff(missing, ONE_F_ONE_B)):
        with pytest.raises(PipebubbleError, match=re.escape(str(missing))):
            call()


def test_bad_settings_are_pipebubble_errors():
    with pytest.raises(PipebubbleError, match="unknown setting 'pp_sise'; did you mean 'pp_size'"):
        pb.analyze(ONE_F_ONE_B, pp_sise=4)
    with pytest.raises(PipebubbleError, match="stage_by='ranks': expected one of rank"):
        pb.analyze(ONE_F_ONE_B, stage_by="ranks")
    with pytest.raises(PipebubbleError, match="workers=0"):
        pb.analyze(ONE_F_ONE_B, workers=0)
    with pytest.raises(PipebubbleError, match="contradict"):
        pb.analyze(ONE_F_ONE_B, align=True, no_align=True)
    with pytest.raises(PipebubbleError, match="no paths given"):
        pb.analyze([])
    with pytest.raises(PipebubbleError, match="memory budget"):
        pb.analyze(ONE_F_ONE_B, memory_budget="lots")


def test_settings_change_the_analysis_as_flags_do():
    one_clock = pb.analyze(ONE_F_ONE_B, no_align=True, cache=False).to_dict()
    assert one_clock == cli_json(str(ONE_F_ONE_B), "--no-align", "--no-cache")


def test_read_warnings_are_python_warnings(tmp_path):
    cut = tmp_path / "rank0.pt.trace.json"
    text = (ROOT / "sample_traces" / "toy_train" / "rank0.pt.trace.json.gz").read_bytes()
    import gzip

    whole = gzip.decompress(text).decode()
    cut.write_text(whole[: len(whole) * 2 // 3])
    with pytest.warns(UserWarning, match="^pipebubble: "):
        report = pb.analyze(cut)
    assert report.warnings


def test_signatures_show_the_settings():
    import inspect

    for func in (pb.analyze, pb.check, pb.diff):
        params = inspect.signature(func).parameters
        assert {f.name for f in fields(pb.Settings)} <= params.keys() and "config" in params
        assert func.__doc__ and ">>>" in func.__doc__
