"""Findings read as words in every document: a late rank's cause and a finding's kind are said in words in
text, Markdown and HTML (the timeline's marks too), while JSON keeps their names."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_render import MS, gpu_time_report

from pipebubble.analysis.rootcause import findings as late_findings
from pipebubble.analysis.rootcause import late
from pipebubble.render import render
from pipebubble.render.sections import findings
from pipebubble.report import Finding, Where
from pipebubble.report.findings import KINDS
from pipebubble.report.words import LATE_CAUSES, cause_words, kind_words


def _report():
    found = [
        Finding("late_rank", "rank 1 enters its steps late", Where(ranks=[1]), "entered_late", {}, 4 * MS, 8 * MS,
                "capture more steps", "the least peer wait", worth_share=0.08),
        Finding("late_rank", "rank 0 computes longer on its GPU", Where(ranks=[0]), "gpu_compute", {}, 3 * MS,
                6 * MS, "look for uneven work", "the least peer wait", worth_share=0.06),
        Finding("launch_bound", "the GPU waits for launches", Where(gpus=["rank0/gpu0"]),
                "the host launches kernels slower than the GPU runs them", {}, 2 * MS, 4 * MS, "CUDA graphs",
                "per step", worth_share=0.04),
    ]
    return replace(gpu_time_report(), findings=found)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_causes_read_as_words(fmt):
    out = render(_report(), fmt, width=200)
    assert "cause: entered the step late" in out and "cause: GPU compute" in out
    assert "cause: the host launches kernels slower than the GPU runs them" in out
    assert "entered_late" not in out and "gpu_compute" not in out


def test_json_keeps_the_names():
    found = json.loads(render(_report(), "json"))["findings"]
    assert [(f["kind"], f["cause"]) for f in found][:2] == [("late_rank", "entered_late"), ("late_rank", "gpu_compute")]


def test_timeline_marks_say_the_kind_in_words():
    assert findings.marks(_report()) == [(1, "#1 late rank"), (0, "#2 late rank"), ("rank0/gpu0", "#3 launch-bound")]


def test_every_kind_and_late_cause_has_words():
    assert all("_" not in kind_words(k) for k in KINDS)
    causes = {*late.CAUSES.values(), "entered_late", "unknown", *late_findings.WORDS}
    assert causes <= set(LATE_CAUSES) and all("_" not in cause_words(c) for c in causes)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_events_not_kept_are_counted_in_words(fmt):
    report = _report()
    report = replace(report, ingest=replace(report.ingest, skipped={"profiler_trace": 2, "metadata": 12}))
    out = render(report, fmt, width=200)
    assert "not spans: profiler trace 2, metadata 12" in out and "profiler_trace" not in out
