"""Pipeline metrics on synthetic traces whose timelines are known exactly, and on real CPU pipeline runs."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from conftest import shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from synth import simulate, write_pipeline

from pipebubble.options import Options, PipelineOptions, Scale
from pipebubble.run import run


def analyse(folder, options: Options = Options()):
    return run([folder], options, Scale(use_cache=False))


def exact_bubble(section) -> Fraction:
    p = section.pipeline
    return Fraction(sum(s.idle_ns for s in section.stages), p.stages * p.window_ns)


@pytest.mark.parametrize("p, m", [(4, 8), (2, 2), (3, 5), (8, 16)])
def test_gpipe_equal_stages_is_exactly_theory(tmp_path, p, m):
    section = analyse(write_pipeline(tmp_path, simulate("gpipe", p, m, [10_000] * p, [20_000] * p)))
    assert exact_bubble(section) == Fraction(p - 1, m + p - 1)
    pipe = section.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.schedule) == (p, m, "gpipe")
    assert pipe.theoretical_bubble_fraction == pytest.approx(float(Fraction(p - 1, m + p - 1)))
    assert pipe.excess_bubble_fraction == pytest.approx(0, abs=1e-12)
    # p stages idle (p-1)(F+B) each per step: (p-1) fills and drains of one micro-batch's forward and backward.
    assert pipe.idle_gpu_ns_per_step == p * (p - 1) * 30_000


def test_hand_computed_gpipe_two_stages(tmp_path):
    """p=2, m=2, F=10 µs, B=20 µs. Stage 0: F0 0-10, F1 10-20, B0 50-70, B1 70-90.
    Stage 1: F0 10-20, F1 20-30, B0 30-50, B1 50-70. Window 0-90 µs."""
    section = analyse(write_pipeline(tmp_path, simulate("gpipe", 2, 2, [10_000] * 2, [20_000] * 2)))
    s0, s1 = section.stages
    assert (s0.busy_ns, s0.fill_ns, s0.drain_ns, s0.steady_idle_ns, s0.idle_ns) == (60_000, 0, 0, 30_000, 30_000)
    assert (s1.busy_ns, s1.fill_ns, s1.drain_ns, s1.steady_idle_ns, s1.idle_ns) == (60_000, 10_000, 20_000, 0, 30_000)
    assert (s0.forward_ns, s0.backward_ns) == (20_000, 40_000)
    assert section.pipeline.window_ns == 90_000 and s0.utilization == pytest.approx(60 / 90)
    waits = [(w.stage, w.cause, w.dur_ns) for w in section.waits]
    assert (0, "downstream", 30_000) in waits and (1, "fill", 10_000) in waits and (1, "drain", 20_000) in waits


def test_imbalanced_stage(tmp_path):
    forward = [10_000, 10_000, 16_000, 10_000]
    section = analyse(write_pipeline(tmp_path, simulate("1f1b", 4, 8, forward, [2 * f for f in forward])))
    pipe = section.pipeline
    busy = [s.busy_ns for s in section.stages]
    assert busy == [8 * 3 * f for f in forward]
    assert pipe.imbalance == pytest.approx(max(busy) / (sum(busy) / 4))
    assert pipe.throughput_bound == pytest.approx(1e9 / max(busy))
    assert pipe.bubble_fraction > pipe.theoretical_bubble_fraction
    assert pipe.excess_causes["imbalance"] == pytest.approx(pipe.excess_bubble_fraction)
    assert pipe.schedule == "1f1b"


def test_spinning_comm_kernels_are_comm_not_compute(tmp_path):
    plain = analyse(write_pipeline(tmp_path / "a", simulate("gpipe", 4, 4, [10_000] * 4, [20_000] * 4)))
    spun = analyse(
        write_pipeline(tmp_path / "b", simulate("gpipe", 4, 4, [10_000] * 4, [20_000] * 4), spin_before_forward=5_000)
    )
    assert [s.busy_ns for s in spun.stages] == [s.busy_ns for s in plain.stages]
    assert [s.idle_ns for s in spun.stages] == [s.idle_ns for s in plain.stages]
    assert spun.stages[0].comm_ns == 0 and all(s.comm_ns > 0 for s in spun.stages[1:])
    assert spun.pipeline.bubble_fraction == plain.pipeline.bubble_fraction


@pytest.mark.parametrize(
    "schedule, chunks, expected",
    [("1f1b", 1, "1f1b"), ("interleaved_1f1b", 2, "interleaved_1f1b"), ("zero_bubble", 1, "zero_bubble")],
)
def test_schedules_detected(tmp_path, schedule, chunks, expected):
    weight = [10_000] * 4 if schedule == "zero_bubble" else None
    sim = simulate(schedule, 4, 8, [10_000] * 4, [10_000 if weight else 20_000] * 4, chunks, weight)
    pipe = analyse(write_pipeline(tmp_path, sim)).pipeline
    assert (pipe.schedule, pipe.chunks, pipe.microbatches) == (expected, chunks, 8)
    assert pipe.bubble_fraction == pytest.approx(sim.bubble_fraction)


def test_gpu_cost(tmp_path):
    folder = write_pipeline(tmp_path, simulate("gpipe", 4, 8, [10_000] * 4, [20_000] * 4))
    pipe = analyse(folder, Options(PipelineOptions(gpu_cost=3.0))).pipeline
    utilization = 1 - 3 / 11
    assert pipe.effective_price_per_useful_gpu_hour == pytest.approx(3.0 / utilization)
    assert pipe.idle_cost_per_hour == pytest.approx(3.0 * 4 * 3 / 11)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    p=st.integers(2, 5),
    m=st.integers(1, 8),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
    forward=st.lists(st.integers(1_000, 50_000), min_size=5, max_size=5),
    ratio=st.integers(1, 3),
    data=st.data(),
)
def test_properties(tmp_path_factory, p, m, schedule, forward, ratio, data):
    folder = tmp_path_factory.mktemp("prop")
    sim = simulate(schedule, p, m, forward[:p], [f * ratio for f in forward[:p]])
    section = analyse(write_pipeline(folder, sim))
    window = section.pipeline.window_ns
    for s in section.stages:
        assert s.busy_ns + s.idle_ns == window
        assert s.fill_ns + s.drain_ns <= s.idle_ns
        assert s.steady_idle_ns >= 0
    assert 0 <= section.pipeline.bubble_fraction < 1
    assert section.pipeline.bubble_fraction == pytest.approx(sim.bubble_fraction)


def test_shared_cpu_pipelines():
    gpipe = analyse(shared("pipeline_cpu", "gpipe")).pipeline
    assert (gpipe.stages, gpipe.microbatches, gpipe.schedule) == (4, 8, "gpipe")
    inter = analyse(shared("pipeline_cpu", "interleaved1f1b")).pipeline
    assert (inter.stages, inter.microbatches, inter.schedule, inter.chunks) == (4, 8, "interleaved_1f1b", 2)
    one = analyse(shared("pipeline_cpu", "1f1b")).pipeline
    assert one.stages == 4 and one.microbatches_inferred and one.microbatches and one.schedule == "1f1b"
    assert any("inferred" in note for note in one.notes)


def test_not_a_pipeline_gives_nothing():
    section = analyse(shared("kineto", "resnet_v100_ns_resolution.json.gz"))
    assert section.pipeline is None and section.stages == [] and section.waits == []


def test_one_file_of_two_gpus_without_pipeline_evidence_is_not_a_pipeline():
    """Nsight export of a 2-GPU expert-parallel job: its ncclSend/ncclRecv ranges lie inside nccl:all_to_all
    (NCCL's all_to_all is grouped send/recv), so there is no send/recv between stages and no pipeline; the
    all_to_alls are matched across the two processes instead."""
    report = run([shared("nsys", "torchrun_2xh100_nccl.sqlite")], Options(), Scale(use_cache=False))
    assert report.pipeline is None and report.stages == []
    assert report.notes[0].startswith("not a pipeline: 2 GPUs")
    assert report.collectives.calls == 33 and report.collectives.unmatched == 0
    assert {w.name for w in report.collectives.worst} == {"all_to_all"}
    assert all(w.cause == "collective" and w.waited_for is None and w.waited_for_pid in (144, 145)
               for w in report.waits)
    two = run([shared("nsys", "torchrun_2xh100_nccl.sqlite")], Options.from_settings({"stage_by": "device"}),
              Scale(use_cache=False))
    assert [s.name for s in two.stages] == ["pid144/device0", "pid145/device1"]
    assert two.pipeline.evidence == ["--stage-by device"]
    for s in two.stages:
        assert s.busy_ns + s.idle_ns == two.pipeline.window_ns


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_unlabelled_gpu_passes_are_inferred_from_their_launching_operators(tmp_path, schedule):
    """No labels: a pass is a burst of kernels between communication kernels, backward when autograd's
    operator launched it; the n-th forward burst of a stage is micro-batch n."""
    sim = simulate(schedule, 4, 8, [10_000] * 4, [20_000] * 4)
    folder = write_pipeline(tmp_path, sim, labels=False, context=True, spin_before_every_pass=2_000)
    pipe = analyse(folder).pipeline
    assert pipe.microbatches_inferred and (pipe.stages, pipe.microbatches, pipe.schedule) == (4, 8, schedule)
    assert pipe.bubble_fraction == pytest.approx(sim.bubble_fraction)


def test_pipeline_groups_from_pg_config_are_replicas(tmp_path):
    """8 ranks: two data-parallel replicas of a 4-stage pipeline, pipeline groups [0,2,4,6] and [1,3,5,7]
    (the second replica twice as slow). The ranks' pg_config names the pipeline groups: 4 stages, 2 replicas,
    the slow one analysed (the job waits for it)."""
    groups = [
        {"pg_name": "0", "pg_desc": "default_pg", "ranks": list(range(8))},
        {"pg_name": "1", "pg_desc": "mesh_pp", "ranks": [0, 2, 4, 6]},
        {"pg_name": "2", "pg_desc": "mesh_pp", "ranks": [1, 3, 5, 7]},
        {"pg_name": "3", "pg_desc": "mesh_dp", "ranks": [0, 1]},
    ]
    fast = simulate("1f1b", 4, 8, [10_000] * 4, [20_000] * 4)
    slow = simulate("1f1b", 4, 8, [20_000] * 4, [40_000] * 4)
    write_pipeline(tmp_path, fast, rank_of=lambda s: 2 * s, world=8, groups=groups)
    write_pipeline(tmp_path, slow, rank_of=lambda s: 2 * s + 1, world=8, groups=groups)
    report = analyse(tmp_path)
    assert [s.name for s in report.stages] == ["pp0", "pp1", "pp2", "pp3"]
    assert [s.lanes for s in report.stages] == [[f"rank{2 * s + 1}/gpu0"] for s in range(4)]
    assert [(s.rank, s.replica) for s in report.stages] == [(2 * s + 1, 1) for s in range(4)]
    assert report.pipeline.bubble_fraction == pytest.approx(slow.bubble_fraction)
    rows = report.pipeline.replicas.rows
    assert [r.bubble_fraction for r in rows] == pytest.approx([fast.bubble_fraction, slow.bubble_fraction])
    assert [r.step_time_ns for r in rows] == [fast.step_time_ns, slow.step_time_ns]


def test_what_if_current_row_has_the_measured_bubble():
    """One number per quantity: the what-if's current row, replayed to the measured 360.05 ms step, shows the
    measured bubble (41.3 %), not the replay's own (42.0 %, which counts the compute outside the passes as
    idle); every row's bubble is the measured compute over p times its step."""
    report = analyse(Path(__file__).parents[3] / "sample_traces" / "pipeline_1f1b")
    pipe = report.pipeline
    current = next(r for r in pipe.recommendations if r.label.startswith("current:"))
    assert current.step_time_ns == pytest.approx(pipe.step_time_ns, rel=1e-3)
    assert current.bubble_fraction == pytest.approx(pipe.bubble_fraction, abs=5e-4)
    assert f"{current.replay_bubble_fraction:.3f}" != f"{pipe.bubble_fraction:.3f}"  # the replay's own differs
    assert current.label.endswith(f"→ bubble {pipe.bubble_fraction * 100:.1f} %")
    compute = sum(s.busy_ns for s in report.stages) / len(pipe.steps)
    for r in pipe.recommendations:
        assert r.bubble_fraction == pytest.approx(1 - compute / (pipe.stages * r.step_time_ns), abs=1e-6)


def test_cv_does_not_depend_on_the_order_of_its_values():
    from pipebubble.analysis.pipeline.metrics import cv

    values = [0.1, 0.7, 1e9, 3.3, 2e-5, 17.0]
    assert len({cv(values), cv(values[::-1]), cv(sorted(values)), cv(values[2:] + values[:2])}) == 1
