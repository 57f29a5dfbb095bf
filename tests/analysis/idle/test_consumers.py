"""Every consumer of the idle account agrees, on every real trace with GPU work: the breakdown rows' causes,
the timeline strips' bins of the drawn step, the report's ``idle`` table and the findings' worths all read
the same pieces, so their figures are the same ones. Each trace enters through ``run``, as a command does."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
from conftest import SHARED_TRACES, shared

from pipebubble.analysis.findings.gpu import KINDS
from pipebubble.options import Options, Scale
from pipebubble.report import Report
from pipebubble.report.idle import CAUSES
from pipebubble.report.strips import CLASSES
from pipebubble.run import run

TRACES = ["kineto/resnet_ddp_a100_nccl_rank0.json.gz", "kineto/resnet_v100_ns_resolution.json.gz",
          "kineto/mi250_rocm_toy_train.json.gz", "kineto/triton_compile_example.json.gz",
          "kineto/recsys_128rank_sampled_rank-0.json.gz", "inference/sglang_qwen3_8b_prefill_decode.json.gz",
          "kineto/old_category_names_inference.json.gz", "nsys/torchrun_2xh100_nccl.sqlite"]


@cache
def report(name: str) -> Report:
    return run([shared(*name.split("/"))], Options(), Scale(use_cache=False, workers=1))


@pytest.mark.parametrize("name", TRACES)
def test_every_idle_ns_has_exactly_one_cause(name):
    for row in report(name).breakdown:
        assert set(row.idle_causes) == set(CAUSES), row.lane
        assert all(ns >= 0 for ns in row.idle_causes.values())
        assert sum(row.idle_causes.values()) == row.idle_ns, (row.lane, row.step)


@pytest.mark.parametrize("name", TRACES)
def test_the_strips_sum_to_the_breakdown_rows_of_their_step(name):
    r = report(name)
    if r.strips is None or not r.strips.rows:
        pytest.skip("no GPU timeline")
    rows = {(b.lane, b.step): b for b in r.breakdown}
    for strip in r.strips.rows:
        row = rows[(strip.lane, r.strips.step)]
        sums = [sum(b[k] for b in strip.bins) for k in range(len(CLASSES))]
        assert strip.end_ns - strip.start_ns == row.window_ns
        assert sums[:3] == [row.compute_ns, row.comm_exposed_ns, row.memory_exposed_ns]
        assert dict(zip(CLASSES[3:], sums[3:], strict=True)) == row.idle_causes


@pytest.mark.parametrize("name", TRACES)
def test_the_idle_table_never_says_more_than_the_breakdown(name):
    r = report(name)
    whole = {b.lane: b for b in r.breakdown if b.step is None}
    for lane in {i.lane for i in r.idle}:
        for cause in CAUSES:
            named = sum(i.ns for i in r.idle if i.lane == lane and i.cause == cause)
            assert named <= whole[lane].idle_causes[cause], (lane, cause)


@pytest.mark.parametrize("name", TRACES)
def test_an_idle_findings_worth_is_its_causes_idle_on_the_busiest_gpu(name):
    r = report(name)
    stepped = [b for b in r.breakdown if b.step is not None] or [b for b in r.breakdown if b.step is None]
    steps: dict = {}
    for b in stepped:
        steps.setdefault(b.step, []).append(b)
    steps = {k: g for k, g in steps.items() if any(b.window_ns > b.idle_ns for b in g)} or steps  # GPU steps
    for f in (f for f in r.findings if f.kind in KINDS):
        busiest = [max(rows, key=lambda b: b.window_ns - b.idle_ns) for rows in steps.values()]
        want = sum(sum(b.idle_causes[c] for c in KINDS[f.kind]) for b in busiest) / len(busiest)
        assert f.worth_ns == round(want), f.kind


def test_the_traces_are_there_or_the_tests_skip():
    assert all((SHARED_TRACES / n).exists() for n in TRACES) or not SHARED_TRACES.exists()
    assert Path(__file__).name  # the module ran
