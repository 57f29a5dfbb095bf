"""Findings read as words in every document: a late rank's cause and a finding's kind are said in words in
text, Markdown and HTML (the timeline's marks too), while JSON keeps their names."""

from __future__ import annotations

import json
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest
from test_render import MS, gpipe_report, gpu_time_report

from pipebubble.analysis.rootcause import findings as late_findings
from pipebubble.analysis.rootcause import late
from pipebubble.options import Options, Scale
from pipebubble.render import render
from pipebubble.render.sections import findings
from pipebubble.report import Finding, Where
from pipebubble.report.findings import KINDS
from pipebubble.report.words import LATE_CAUSES, cause_words, kind_words, priced_words
from pipebubble.run import run

SAMPLES = Path(__file__).parents[2] / "sample_traces"


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


def _priced(found: list[Finding], cpus: bool = False):
    """``found`` on the gpipe job (idle cost priced) with --gpu-cost 2 dollars an hour; ``cpus``: its lanes
    hold no GPU (a gloo pipeline of CPU ranks)."""
    job = replace(gpipe_report(), findings=[replace(f, cost_per_hour=2.0 * f.worth_gpu_ns / (10 * MS)) for f in found])
    return replace(job, lanes=[replace(lane, kind="cpu", device=None) for lane in job.lanes]) if cpus else job


_FREES = Finding("decode_wait", "decodes wait behind prompts", Where(), "prompt work", {}, 2 * MS, 2 * MS,
                 "chunked prefill", "median", worth_share=0.2)
_TAIL = Finding("tail_interference", "p99 TPOT 20.0 ms, 14.3 ms of it prompt work", Where(), "prefill", {},
                14 * MS, 0, "chunked prefill", "p99", worth_share=0.714)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
@pytest.mark.parametrize("cpus", [False, True])
def test_a_finding_that_frees_no_device_time_prints_no_zero_device_time_or_dollars(fmt, cpus):
    """A latency tail's worth frees no GPU (or CPU) time: its headline says its share and no "0.00 GPU-ms"
    (nor "$0.00/hour"), while a finding that frees some keeps both."""
    out = unescape(render(_priced([_FREES, _TAIL], cpus), fmt, width=300))  # HTML: its list numbers the items
    unit = "CPU" if cpus else "GPU"
    assert "14.00 ms a step (71.4% of the step): p99 TPOT" in out
    assert f"2.00 ms a step (20.0% of the step, 2.00 {unit}-ms, $0.40/hour): decodes wait" in out
    assert f"0.00 {unit}-ms" not in out and "$0.00/hour" not in out
    bare = replace(_TAIL, worth_share=None)
    assert findings.items(replace(_report(), findings=[bare]))[0][0] == \
        "1. 14.00 ms a step: p99 TPOT 20.0 ms, 14.3 ms of it prompt work"


@pytest.mark.parametrize("sample", ["serve", "serve_chunked_prefill"])
def test_serving_sample_findings_print_no_zero_device_time(sample):
    """The serving samples' TPOT-tail finding (worth_gpu_ns 0) read "(71.4 % of the step, 0.00 CPU-ms)"."""
    report = run([SAMPLES / sample], Options(), Scale(use_cache=False))
    assert any(f.worth_gpu_ns == 0 for f in report.findings)
    heads = [head for head, _ in findings.items(report)]
    assert heads and not any("0.00 CPU-ms" in h or "0.00 GPU-ms" in h for h in heads)


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_gpu_cost_on_a_job_without_a_gpu_is_priced_per_cpu_hour_everywhere(fmt):
    """--gpu-cost on a pipeline of CPU ranks: its dollars are said, wherever they appear (the findings, the idle
    cost line, the HTML card), to take the price as a CPU-hour's (one CPU rank's), as its CPU-ms figures count;
    a job with GPUs reads as before, in GPU-hours."""
    on_cpus = unescape(render(_priced([_FREES], cpus=True), fmt, width=400))
    said = priced_words("CPU")
    assert "CPU-hour" in said and "--gpu-cost" in said
    assert f"the gains do not add up: fixing one changes the others; dollars: {said})" in on_cpus
    assert f"idle cost: $12.50/hour, $0.0001/step, $5.25 per useful CPU-hour ({said})" in on_cpus
    assert "GPU-hour" not in on_cpus and "GPU-ms" not in on_cpus
    on_gpus = render(_priced([_FREES]), fmt, width=400)
    assert "CPU-hour" not in on_gpus and "--gpu-cost" not in on_gpus
    assert "idle cost: $12.50/hour, $0.0001/step, $5.25 per useful GPU-hour" in on_gpus
    if fmt == "html":
        assert "idle cost (CPU-hours at --gpu-cost)" in on_cpus and "idle cost (" not in on_gpus
    unpriced = render(replace(_priced([_TAIL], cpus=True), pipeline=None), fmt, width=400)
    assert "dollars:" not in unpriced  # no finding shows dollars: nothing to say how they are priced
