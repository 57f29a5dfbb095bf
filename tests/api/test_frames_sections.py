"""Every section of the JSON report as a DataFrame of a notebook's Report, equal to the CLI's JSON, in every
unit and from the job's start; the span table itself; one section shown alone."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import pipebubble as pb
from pipebubble.api import frames
from pipebubble.render.sections.timeline import origin

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ["pipeline_1f1b", "toy_train", "serve"]


@pytest.fixture(scope="module", params=SAMPLES)
def report(request):
    return pb.analyze(ROOT / "sample_traces" / request.param, cache=False)


def json_rows(report, name):
    return frames.rows(report.to_dict(), name)


@pytest.mark.parametrize("name", list(frames.TABLES))
def test_each_table_equals_the_json(report, name):
    table, rows = report.table(name), json_rows(report, name)
    assert table.height == len(rows)
    for got, row in zip(table.to_dicts(), rows, strict=True):
        for key, value in row.items():
            if key in frames.FLATTENED:
                prefix, suffix = frames.FLATTENED[key]
                assert {k: got[f"{prefix}{k}{suffix}"] for k in value} == value
            elif isinstance(value, dict) and key not in frames.KEPT_STRUCTS:
                assert {k: got[f"{key}_{k}"] for k in value} == value
            elif key in frames.KEPT_STRUCTS:
                assert {k: v for k, v in got[key].items() if k in value} == value
            else:
                assert got[key] == value, (name, key)


@pytest.mark.parametrize("unit", ["us", "ms", "s"])
@pytest.mark.parametrize("name", ["lanes", "stages", "waits", "kernels", "timeline", "critical_path", "steps"])
def test_times_in_every_unit_and_from_the_start(report, name, unit):
    rows = json_rows(report, name)
    table = report.table(name, unit=unit, relative=True)
    start = origin(report.data)
    scale = frames.UNITS[unit]
    for got, row in zip(table.to_dicts(), rows, strict=True):
        for key, value in row.items():
            if key.endswith("_ns") and isinstance(value, int | float):
                expected = (value - start if key in frames.INSTANTS else value) / scale
                assert got[key.removesuffix("_ns") + f"_{unit}"] == pytest.approx(expected)
    assert not any(c.endswith("_ns") for c in table.columns if c.removesuffix("_ns") + f"_{unit}" in table.columns)


def test_report_wide_defaults_and_the_texts_at_column():
    """``unit`` and ``relative`` on the Report set every table's; a wait's start from the job's start is the
    "at" the text prints."""
    r = pb.analyze(ROOT / "sample_traces" / "pipeline_1f1b", cache=False)
    r.unit, r.relative = "ms", True
    waits = r.waits
    assert "start_ms" in waits.columns and "start_ns" not in waits.columns
    text = r.render("text", width=200)
    first = f"{waits['start_ms'][0]:,.2f}"
    assert first in text
    assert r.table("waits", unit="ns", relative=False)["start_ns"][0] == r.to_dict()["waits"][0]["start_ns"]


def test_the_span_table_is_the_traces_on_the_jobs_clock():
    r = pb.analyze(ROOT / "sample_traces" / "pipeline_1f1b", cache=False)
    spans = r.spans
    assert {"name", "kind", "lane", "rank", "stream", "correlation", "start", "end"} <= set(spans.columns)
    assert spans.height == r.data.ingest.spans
    lanes = spans.group_by("lane").agg(pl.col("start").min())
    assert set(lanes["lane"]) >= {lane["lane"] for lane in r.to_dict()["lanes"]}
    r.relative = True
    assert r.spans["start"].min() <= 0 < r.spans["end"].max()


def test_show_one_section():
    r = pb.analyze(ROOT / "sample_traces" / "pipeline_1f1b", cache=False)
    assert r.show("idle").equals(r.idle)  # a table only a frame holds
    html = r.show("findings")._repr_html_()
    assert "iframe" in html and "Findings" in html and "Stages" not in html
    with pytest.raises(pb.PipebubbleError, match="unknown section 'nope'"):
        r.show("nope")
