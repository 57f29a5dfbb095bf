"""The HTML page's charts as a reader sees them: tick values in 1-2-5 steps labelled in the unit that suits them,
an x-axis and a y-axis on every chart with its unit, every text inside the drawing (the p99 label at the right
edge of a latency CDF too), findings marked on the GPU timeline by their words and never cut inside a word; and
the terminal's kernel table giving a kernel's name the columns it needs. Drawn from hand-built reports whose
every figure is known, and from the real traces (skipped where they are absent)."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import replace

import pytest
from conftest import shared
from test_render import MS, gpu_time_report

from pipebubble.options import Scale as RunScale
from pipebubble.render import axis, html, render, terminal
from pipebubble.render.sections import findings, gpu_timeline, gputime, requests
from pipebubble.render.sections.memory import memory_svg
from pipebubble.report.findings import Finding, Where
from pipebubble.report.memory import Memory, MemoryDevice
from pipebubble.report.requests import RequestRow, Requests
from pipebubble.report.strips import CLASSES, Strip, Strips
from pipebubble.run import run

SVG = "{http://www.w3.org/2000/svg}"
GIB = 1 << 30
NUMBER = re.compile(r"^\d+(\.\d+)?$")


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def box(root: ET.Element) -> tuple[float, float]:
    _, _, w, h = (float(v) for v in root.get("viewBox").split())
    return w, h


def shown(text: ET.Element) -> str:
    """A text element's own words, without its tooltip."""
    return (text.text or "") + "".join(child.tail or "" for child in text)


def texts(root: ET.Element) -> list[str]:
    return [shown(t) for t in root.iter(f"{SVG}text")]


def assert_inside(root: ET.Element) -> None:
    """Every text lies within the viewBox, its width estimated for the SVG's 12px monospace font."""
    w, h = box(root)
    for t in root.iter(f"{SVG}text"):
        words, x, y = shown(t), float(t.get("x")), float(t.get("y"))
        width = len(words) * axis.CHAR_W
        left = x - {"start": 0, "middle": width / 2, "end": width}[t.get("text-anchor", "start")]
        assert -0.5 <= left and left + width <= w + 0.5, (words, left, left + width, w)
        assert 9 <= y <= h, (words, y, h)


def ticks(root: ET.Element, anchor: str = "middle") -> list[str]:
    return [shown(t) for t in root.iter(f"{SVG}text") if t.get("text-anchor") == anchor and NUMBER.match(shown(t))]


# -- the axis helper ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "step"), [(0.3, 0.5), (1, 1), (1.01, 2), (3, 5), (7, 10), (120, 200), (0, 1.0)])
def test_steps_are_1_2_5_times_a_power_of_ten(raw, step):
    assert axis.nice_step(raw) == pytest.approx(step)


@pytest.mark.parametrize(("hi", "unit", "labels"), [
    (1_500 * MS, "ms", ("0", "200", "400", "600", "800", "1000", "1200", "1400")),
    (12_000 * MS, "s", ("0", "2", "4", "6", "8", "10", "12")),
    (800_000, "us", ("0", "100", "200", "300", "400", "500", "600", "700", "800")),
    (37, "ns", ("0", "5", "10", "15", "20", "25", "30", "35")),
])
def test_a_time_axis_is_in_the_largest_unit_its_step_holds_whole(hi, unit, labels):
    scale = axis.time_scale(0, hi, 8)
    assert (scale.unit, scale.labels) == (unit, labels)
    assert scale.ticks[-1] <= hi


def test_a_byte_axis_reaches_the_first_tick_above_its_top_in_a_binary_unit():
    scale = axis.bytes_scale(16 * GIB, 3)
    assert scale.labels == ("0", "10 GiB", "20 GiB") and scale.hi == 20 * GIB
    assert axis.bytes_scale(199 << 20).labels == ("0", "100 MiB", "200 MiB")
    assert axis.bytes_scale(0).labels == ("0", "1 B")
    assert axis.share_scale(2).labels == ("0%", "50%", "100%")


def test_words_wrap_between_words_and_a_label_goes_where_it_fits():
    assert axis.wrap("#1 too few micro-batches", 12) == ["#1 too few", "micro-batches"]
    assert axis.beside(100, "p99 3 ms", 0, 1000) == (104, "start")
    x, anchor = axis.beside(995, "p99 321 ms", 0, 1000)
    assert anchor == "end" and x - len("p99 321 ms") * axis.CHAR_W >= 0


# -- the latency CDFs -----------------------------------------------------------------------------------------


def served(ttft_ms: list[int]) -> Requests:
    """Requests whose TTFT and e2e are the given ms (p50 and p99 as ``numpy.percentile`` gives them)."""
    rows = [RequestRow(f"r{i}", i * MS, 0, v * MS, None, 2 * v * MS, v * MS, None, 10, 1)
            for i, v in enumerate(ttft_ms)]
    values = sorted(ttft_ms)

    def q(p: float, scale: int) -> float:
        rank = p * (len(values) - 1)
        low = int(rank)
        high = min(low + 1, len(values) - 1)
        return (values[low] + (rank - low) * (values[high] - values[low])) * MS * scale

    return Requests(count=len(rows), rows=rows, ttft_ns={"p50": q(0.5, 1), "p90": q(0.9, 1), "p99": q(0.99, 1)},
                    e2e_ns={"p50": q(0.5, 2), "p90": q(0.9, 2), "p99": q(0.99, 2)})


def test_each_cdf_has_a_share_axis_and_a_latency_axis_in_ms():
    root = parse(requests.svg(served(list(range(1, 101)))))  # 1..100 ms: p50 50.5 ms, p99 99.01 ms
    words = texts(root)
    assert words.count("0%") == 2 and words.count("50%") == 2 and words.count("100%") == 2
    assert "TTFT (ms)" in words and "e2e (ms)" in words
    first = ticks(root)[:6]
    assert first == ["0", "10", "20", "30", "40", "50"]
    assert "p50 50.5 ms" in words and "p99 99 ms" in words and "p99 198 ms" in words
    assert_inside(root)


def test_a_p99_at_the_right_edge_is_labelled_inside_the_plot():
    # 1..100 ms: the p99 (99.01 ms) is drawn at 99% of the plot's width, its label would run off the right
    root = parse(requests.svg(served(list(range(1, 101)))))
    p99 = [t for t in root.iter(f"{SVG}text") if shown(t).startswith("p99")]
    assert len(p99) == 2 and all(t.get("text-anchor") == "end" for t in p99)
    p50 = [t for t in root.iter(f"{SVG}text") if shown(t).startswith("p50")]
    assert all(t.get("text-anchor") == "start" for t in p50)
    assert_inside(root)


# -- the GPU timeline -----------------------------------------------------------------------------------------


def strip(lane: str, rank: int, start: int, end: int, busy: int) -> Strip:
    """A GPU's step in two bins: compute for ``busy`` ns, then idle for a launch."""
    half = (end - start) // 2
    first = [0] * len(CLASSES)
    first[CLASSES.index("compute")] = busy
    first[CLASSES.index("launch")] = half - busy
    second = [0] * len(CLASSES)
    second[CLASSES.index("launch")] = end - start - half
    return Strip(lane, rank, start, end, [first, second])


def marked_report():
    """Two GPUs of a 10 ms step, rank 1 starting 2 ms late; three findings on rank 0's GPU."""
    where = Where(ranks=[], gpus=["rank0/gpu0"])
    found = [Finding(kind, kind, where, "cause", {}, 1_000_000 - k, 0, "try", "how")
             for k, kind in enumerate(("launch_bound", "exposed_comm", "too_few_microbatches"))]
    strips = Strips(3, [strip("rank0/gpu0", 0, 100 * MS, 110 * MS, 3 * MS),
                        strip("rank1/gpu0", 1, 102 * MS, 110 * MS, 2 * MS)])
    return replace(gpu_time_report(), findings=found, strips=strips)


def test_the_timeline_marks_findings_by_their_words_never_cut():
    report = marked_report()
    assert findings.marks(report)[0] == ("rank0/gpu0", "#1 launch-bound")
    root = parse(gpu_timeline.svg(report.strips, findings.marks(report)))
    words = texts(root)
    assert {"#1 launch-bound", "#2 exposed comm", "#3 too few micro-batches"} <= set(words)
    assert not any("_" in w or "…" in w for w in words)
    assert_inside(root)


def test_the_timeline_has_a_time_axis_and_a_gpu_axis():
    report = marked_report()
    root = parse(gpu_timeline.svg(report.strips, findings.marks(report)))
    assert ticks(root) == ["0", "2", "4", "6", "8", "10"]  # 10 ms from rank 0's start
    assert "time from the step's earliest start on a GPU (ms)" in texts(root)
    lines = list(root.iter(f"{SVG}line"))
    vertical = [ln for ln in lines if ln.get("x1") == ln.get("x2") == f"{gpu_timeline.LABEL_W:.1f}"]
    assert vertical, "a y-axis along the GPUs' names"
    marks = [ln for ln in lines if ln.get("y1") != ln.get("y2") and float(ln.get("y2")) - float(ln.get("y1")) == 4]
    assert len(marks) == 6  # a tick mark at each label


def test_the_text_timeline_cuts_a_mark_between_words():
    report = marked_report()
    lines = gpu_timeline.text(report.strips, 60, findings.marks(report))
    marked = next(line for line in lines if "◀" in line)
    tail = marked.split("◀ ", 1)[1]
    assert tail == "#1 launch-bound…"  # the whole marks that fit, none cut


def test_the_pipeline_timeline_and_memory_have_axes_with_units():
    page = render(marked_report(), "html")
    assert "time from the step&#x27;s earliest start on a GPU (ms)" in page
    device = MemoryDevice(lane="rank0/gpu0", rank=0, device_type="cuda", device=0, events=3,
                          reserved_peak_bytes=None, capacity_bytes=None, start_bytes=0, end_bytes=0,
                          peak_bytes=13 * GIB, peak_at_ns=400 * MS,
                          timeline=[[0, GIB], [400 * MS, 13 * GIB], [1_000 * MS, 2 * GIB]])
    root = parse(memory_svg(Memory(events=3, devices=[device]), origin_ns=0))
    words = texts(root)
    assert {"0", "5 GiB", "10 GiB", "15 GiB", "peak 13.0 GiB", "time from the timeline's start (ms)"} <= set(words)
    assert ticks(root)[:3] == ["0", "100", "200"]
    assert_inside(root)


# -- the terminal's kernel table ------------------------------------------------------------------------------


def test_a_kernel_name_keeps_its_columns_before_the_table_keeps_its_least_useful_ones():
    name = "vectorized_elementwise_kernel[CUDAFunctor_add]"  # 46 characters
    report = gpu_time_report()
    report = replace(report, kernels=[replace(report.kernels[0], name=name), *report.kernels[1:]])
    for width in (80, 100, 120):
        fitted = terminal.fit(gputime.kernel_table(report), width)
        assert len(fitted.section.rows[0][0]) >= terminal.WANT["kernel"], (width, fitted.section.rows[0][0])
    wide = terminal.fit(gputime.kernel_table(report), 120)
    assert wide.section.rows[0][0] == name and not wide.dropped
    narrow = terminal.fit(gputime.kernel_table(report), 80)
    assert narrow.dropped[:2] == ["std ms", "min ms"]  # the least useful go first, named under the table


# -- the real traces ------------------------------------------------------------------------------------------


def test_the_real_kernel_table_shows_whole_names_at_120_columns_with_their_raw_totals():
    path = shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")
    totals: dict[str, float] = defaultdict(float)
    with gzip.open(path) as f:
        for e in json.load(f)["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                totals[e["name"]] += e["dur"]  # µs
    top = sorted(totals.items(), key=lambda kv: -kv[1])[:4]
    report = run([path], scale=RunScale(use_cache=False))
    rows = terminal.fit(gputime.kernel_table(report), 120).section.rows[:4]
    for row, (raw, us) in zip(rows, top, strict=True):
        assert "…" not in row[0] and row[0].split("[")[0] in raw, (row[0], raw)
        assert row[3] == f"{us / 1_000:,.2f}"  # total ms


def test_the_real_gpu_timeline_axis_spans_the_raw_kernels_and_marks_say_words():
    path = shared("nsys", "torchrun_2xh100_nccl.sqlite")
    with sqlite3.connect(path) as db:
        spans = [db.execute(f"SELECT min(start), max(end) FROM {t}").fetchone()
                 for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")]
    span = max(e for _, e in spans) - min(s for s, _ in spans)  # the GPUs' work, ns
    report = run([path], scale=RunScale(use_cache=False))
    marks = findings.marks(report)
    root = parse(gpu_timeline.svg(report.strips, marks))
    assert_inside(root)
    right = box(root)[0] - gpu_timeline._margin([[label for _, label in marks]])
    scale = axis.time_scale(0, span, axis.count_for(right - gpu_timeline.LABEL_W))
    assert ticks(root) == list(scale.labels) and scale.unit == "ms"
    tick_marks = [float(ln.get("x1")) for ln in root.iter(f"{SVG}line")
                  if ln.get("x1") == ln.get("x2") and float(ln.get("y2")) - float(ln.get("y1")) == axis.TICK]
    expected = [gpu_timeline.LABEL_W + (right - gpu_timeline.LABEL_W) * t / span for t in scale.ticks]
    assert tick_marks == pytest.approx(expected, abs=0.06)
    words = set(texts(root))
    assert marks and all(label in words for _, label in marks)
    assert all("_" not in label for _, label in marks)
    assert html.gpu_timeline_section(report)[1] == gpu_timeline.svg(report.strips, marks)
