"""The multi-rank parts of a report in every document format, on hand-built reports: the collectives section,
waits of a job that is not a pipeline, job notes, pipeline evidence, both throughput bounds, the what-if
replay, the utilization legend, and text that folds without parting a number from its unit."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from runs import run_cli
from test_render import (
    MS,
    NOT_A_PIPELINE,
    REPORTS,
    STRAGGLER,
    T0,
    collectives_report,
    fixed_date,  # noqa: F401  (autouse: the HTML header's date is fixed)
    gpipe_report,
    gpu_time_report,
    lanes_report,
)

from pipebubble import spans as span_schema
from pipebubble.render import perfetto, render, sections, terminal
from pipebubble.render.sections import collectives, pipeline
from pipebubble.report import Report, Wait

DOCUMENTS = ("text", "markdown", "html")
UNITS = re.compile(r"^\s*(ms|steps/s|GPU-ms|chunks|stages|micro-batches|collectives|tokens)\b")


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_collectives_section_in_every_document(fmt):
    out = render(collectives_report(), fmt, width=120).replace("&#x27;", "'")
    for text in ("Collectives", "8 collective calls matched across 8 ranks by their kernels' ends",
                 "1 call left out (not matched on every rank)", "collective wait: 34.00 ms over all ranks",
                 "straggler: rank 7 arrived last at 5 of 8 collectives; others waited 31.20 ms in all at those calls",
                 "Collectives per rank", "Worst collective calls", "arrived last", "skew ms"):
        assert text in out, text
    at = [out.index(t) for t in ("Biggest waits", "Collectives per rank", "Worst collective calls", "Lanes")]
    assert at == sorted(at)


def test_rank_table_puts_the_latest_first_and_the_calls_keep_report_order():
    report = collectives_report()
    ranks = collectives.rank_table(report)
    assert ranks.columns == ["rank", "lane", "calls", "wait ms", "late ms", "arrived last"]
    assert [row[0] for row in ranks.rows[:2]] == ["7", "3"]  # late 31.2 ms, then 0.5 ms
    assert ranks.rows[0] == ["7", "rank7/gpu0", "8", "0.00", "31.20", "5"]
    calls = collectives.call_table(report, T0)
    assert calls.rows[0][1:] == ["3", "40.00", "9.50", "rank 7", "52.10", "8"]
    assert [row[1] for row in calls.rows] == ["3", "0"]


def test_a_report_without_collectives_has_no_section():
    for fmt in DOCUMENTS:
        assert "Collectives" not in render(gpipe_report(), fmt, width=120)


def test_terminal_caps_the_rank_table_and_the_documents_list_every_rank():
    report = collectives_report(1000)
    text = terminal.render(report, width=120)
    rows = [line for line in text.splitlines() if re.match(r"\d+ +rank\d+/gpu0 ", line)]
    assert len(rows) == terminal.TERMINAL_RANKS and rows[0].startswith("7 ")
    assert f"{1000 - terminal.TERMINAL_RANKS} more ranks not shown" in text
    markdown = render(report, "markdown")
    assert sum(bool(re.match(r"\| \d+ \| rank\d+/gpu0 \|", line)) for line in markdown.splitlines()) == 1000


def test_waits_without_a_stage_show_the_rank_and_who_was_waited_for():
    table = pipeline.wait_table(collectives_report(), T0)
    assert table.columns[-1] == "waited for"
    assert table.rows[0] == ["rank 0", "40.00", "9.50", "collective", "aten::mm", "ncclDevKernel_AllReduce",
                             "rank 7"]
    assert table.rows[2][0] == "rank 2" and table.rows[2][-1] == "-"  # a host wait: nobody to wait for
    lone = Wait(None, T0, MS, "collective", None, None, lane="rank9/gpu0")  # no rank known: the lane says where
    assert pipeline.wait_table(Report(waits=[lone]), T0).rows[0][0] == "rank9/gpu0"
    assert "waited for" not in pipeline.wait_table(gpipe_report(), T0).columns  # pipeline waits: no such column
    assert "| rank 0 | 40.00 | 9.50 | collective | aten::mm | ncclDevKernel_AllReduce | rank 7 |" in render(
        collectives_report(), "markdown")


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_job_notes_come_before_the_pipeline_headline(fmt):
    report = replace(gpipe_report(), notes=["one rank (rank 3) of a 64-rank job: the others were not traced"])
    out = render(report, fmt, width=200)
    assert out.index("note: one rank (rank 3) of a 64-rank job") < out.index("pipeline: p=4 stages")
    out = render(collectives_report(), fmt, width=200)
    assert out.index(f"note: {NOT_A_PIPELINE}") < out.index("Biggest waits")
    assert f"note: {STRAGGLER}" in out


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_headline_says_evidence_and_both_bounds(fmt):
    out = render(gpipe_report(), fmt, width=200)
    assert "pipeline evidence: micro-batch labels (torch_pipelining); send/recv between ranks" in out
    assert "throughput: compute-only bound 47.62 steps/s; with exposed comm 40.00 steps/s" in out
    assert "utilization 56.6% (1 − bubble; efficiency 93.0% of theory&#x27;s)" in out if fmt == "html" else \
        "utilization 56.6% (1 − bubble; efficiency 93.0% of theory's)" in out


def test_unknown_parts_of_the_headline_are_left_out():
    pipe = replace(gpipe_report().pipeline, evidence=[], throughput_bound_with_comm=0.0, pipeline_efficiency=None)
    lines = pipeline.header(replace(gpipe_report(), pipeline=pipe))
    assert not any(line.startswith("pipeline evidence") for line in lines)
    assert "throughput: compute-only bound 47.62 steps/s" in lines and "efficiency" not in " ".join(lines)


def test_current_row_of_the_what_if_shows_the_replay_against_the_measured_step():
    """The hand-built rows carry no ``replay_bubble_fraction`` (a report saved before it): their bubble is the
    replay's own, and the current row's note says so beside the measured one."""
    table = pipeline.recommendation_table(gpipe_report())
    current = next(row for row in table.rows if row[0].startswith("current"))
    assert current[-1] == "[2]"
    assert table.notes[1] == ("current: replay 20.00 ms vs measured 23.60 ms (−15.3%), bubble 42.9% in the replay vs"
                              " 43.4% measured; speedups are against the measured step")
    assert "bubble as measured" not in table.title
    for fmt in DOCUMENTS:
        assert "replay 20.00 ms vs measured 23.60 ms (−15.3%)" in render(gpipe_report(), fmt, width=200)
    unreplayed = replace(gpipe_report().pipeline, replay_error=None)
    table = pipeline.recommendation_table(replace(gpipe_report(), pipeline=unreplayed))
    assert len(table.notes) == 1 and all(row[-1] != "[2]" for row in table.rows)


def _as_measured(report: Report, current_bubble: float, replayed_ns: int) -> Report:
    """``report`` with its what-if rows as the analysis writes them now: every bubble as the measured one is
    defined (``replay_bubble_fraction`` the replay's own), the current row replayed in ``replayed_ns``."""
    p = report.pipeline
    recs = [replace(r, replay_bubble_fraction=r.bubble_fraction + 0.007) for r in p.recommendations]
    recs = [replace(r, step_time_ns=replayed_ns, bubble_fraction=current_bubble) if r.label.startswith("current")
            else r for r in recs]
    error = (replayed_ns - p.step_time_ns) / p.step_time_ns
    return replace(report, pipeline=replace(p, recommendations=recs, replayed_step_ns=replayed_ns, replay_error=error))


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_what_if_current_row_shows_the_measured_bubble_where_the_replay_meets_the_step(fmt):
    """One number per quantity: a replay that meets the measured step shows the headline's bubble on the current
    row (41.3 % in both, not the replay's own 42.0 %), and the table says how its bubbles are defined."""
    job = gpipe_report()
    met = _as_measured(replace(job, pipeline=replace(job.pipeline, bubble_fraction=0.413)), 0.413,
                       job.pipeline.step_time_ns)
    table = pipeline.recommendation_table(met)
    current = next(row for row in table.rows if row[0].startswith("current"))
    assert current[5] == "41.3%" and "bubble: 41.3% measured" in "\n".join(pipeline.header(met))
    assert "bubble as measured: 1 − the measured compute / (p · the row's step)" in table.title
    assert table.notes[-1] == "current: replay 23.60 ms vs measured 23.60 ms (+0.0%); speedups are against the" \
                              " measured step"
    out = render(met, fmt, width=200)
    assert "42.0%" not in out and "41.3%" in out
    off = _as_measured(job, 0.4290, 20 * MS)  # a replay 15.3 % short of the step: the bubbles differ, and it says so
    assert pipeline.recommendation_table(off).notes[-1] == (
        "current: replay 20.00 ms vs measured 23.60 ms (−15.3%), bubble 42.9% at the replayed step vs 43.4% measured;"
        " speedups are against the measured step")


@pytest.mark.parametrize("fmt", DOCUMENTS)
def test_legend_defines_each_utilization_figure_shown(fmt):
    full = render(replace(gpipe_report(), breakdown=gpu_time_report().breakdown), fmt, width=400)
    for part in sections.LEGEND.values():
        assert part in full, part
    lanes = render(lanes_report(), fmt, width=400)
    assert sections.LEGEND["lanes"] in lanes and sections.LEGEND["pipeline"] not in lanes
    assert sections.LEGEND["stages"] not in lanes
    assert "legend:" not in render(Report(), fmt, width=400)


@pytest.mark.parametrize("width", range(40, 141, 7))
@pytest.mark.parametrize("name", REPORTS)
def test_a_number_never_parts_from_its_unit(name, width):
    lines = render(REPORTS[name](), "text", width=width).splitlines()
    whole = set(render(REPORTS[name](), "text", width=1000).splitlines())  # lines that are not folds
    for line, following in zip(lines, lines[1:], strict=False):
        folded = following not in whole
        assert not (folded and re.search(r"\d$", line) and UNITS.match(following)), (line, following)
    assert max(len(line) for line in lines) <= width


def test_the_sample_headline_keeps_step_and_unit_together_at_100_columns():
    pipe = replace(gpipe_report().pipeline, step_time_ns=360_050_000, throughput_bound=4.35,
                   throughput_bound_with_comm=2.9, schedule="1f1b", microbatches=8)
    text = render(replace(gpipe_report(), pipeline=pipe), "text", width=100)
    assert "step 360.05 ms" in text and "compute-only bound 4.35 steps/s; with exposed comm 2.90 steps/s" in text


def test_wrap_folds_at_clause_ends_and_keeps_numbers_with_units():
    line = "utilization 58.7% (1 − bubble), stage time CV 0.06, imbalance 1.09, step 360.05 ms, efficiency 80.8%"
    assert terminal.wrap(line, 200) == line
    folded = terminal.wrap(line, 80).splitlines()
    assert folded == ["utilization 58.7% (1 − bubble), stage time CV 0.06, imbalance 1.09,",
                      "  step 360.05 ms, efficiency 80.8%"]
    narrow = terminal.wrap("one column = 0.248 ms; axis in ms", 16).splitlines()
    assert "0.248 ms;" in " ".join(narrow) and all(len(part) <= 16 for part in narrow)


def test_perfetto_puts_collective_waits_on_the_waiting_rank_track():
    report = collectives_report()
    overlapping = Wait(None, T0 + 41 * MS, 10 * MS, "collective", None, None, lane="rank0/gpu0", rank=0,
                       waited_for=7)
    trace = perfetto.build(span_schema.empty(), replace(report, waits=[*report.waits, overlapping]))
    names = {t.uuid: t for t in trace.tracks}
    waits = [s for s in trace.slices if s.name == "wait: collective"]
    assert len(waits) == 3
    def chain(uuid):  # a track and its ancestors, innermost first
        while uuid is not None:
            yield names[uuid]
            uuid = names[uuid].parent

    for s in waits:
        args = dict(s.args)
        waits_track = next(t for t in chain(s.track) if t.name.startswith("collective waits"))
        rank = names[waits_track.parent]
        assert rank.name == f"rank {args['rank']}" and rank.parent is None
        assert args["waited_for"] in (3, 7)
    # rank 0's two overlapping waits: the second on a child track of the first's (its overlap track)
    tracks = [s.track for s in waits if dict(s.args)["rank"] == 0]
    assert len(set(tracks)) == 2
    inner = next(t for t in tracks if names[t].name.startswith("overlapping"))
    outer = next(t for t in tracks if t != inner)
    assert names[inner].parent == outer
    assert perfetto.to_proto(trace) and json.loads(perfetto.to_chrome_json(trace))["traceEvents"]


def test_a_saved_report_reads_back_and_renders_the_same():
    report = collectives_report()
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    for fmt in DOCUMENTS:
        assert render(again, fmt, width=100) == render(report, fmt, width=100)


@pytest.mark.parametrize("env", [{"NO_COLOR": "1"}, {}])
def test_piped_text_is_plain_and_fits(tmp_path, env):
    saved = tmp_path / "report.json"
    saved.write_text(json.dumps(collectives_report().to_dict()))
    proc = run_cli("analyze", str(saved), "--width", "100", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b[" not in proc.stdout and "Collectives per rank" in proc.stdout and "legend: lane idle" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100
