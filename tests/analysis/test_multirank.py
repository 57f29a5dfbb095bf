"""Multi-rank jobs read as they are: a pipeline only on evidence, collective waits and stragglers for every
job of several ranks, one rank of a bigger job analysed for what it holds."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shapes import MS, all_to_all, data_parallel, one_rank
from synth import simulate, write_pipeline

from pipebubble.options import Options, Scale
from pipebubble.run import run


def analyse(*paths, **settings):
    return run(list(paths), Options.from_settings(settings), Scale(use_cache=False))


def test_data_parallel_job_is_not_a_pipeline_and_its_straggler_is_named(tmp_path):
    """4 ranks compute 2, 2, 2 and 5 ms, then all-reduce, twice. Ranks 0-2 spin 3 ms at each all-reduce
    waiting for rank 3: wait 6 ms each, rank 3 late 18 ms, last at both calls."""
    report = analyse(data_parallel(tmp_path, [2, 2, 2, 5]))
    assert report.pipeline is None and report.stages == []
    assert report.notes[0].startswith("not a pipeline: 4 ranks with no micro-batch labels")
    c = report.collectives
    assert (c.calls, c.unmatched, c.straggler, c.waited_ns) == (2, 0, 3, 18 * MS)
    assert [(r.rank, r.calls, r.wait_ns, r.late_ns, r.last) for r in c.ranks] == [
        (0, 2, 6 * MS, 0, 0), (1, 2, 6 * MS, 0, 0), (2, 2, 6 * MS, 0, 0), (3, 2, 0, 18 * MS, 2)]
    assert [(w.name, w.seq, w.skew_ns, w.last_rank, w.waited_ns, w.ranks) for w in c.worst] == [
        ("all_reduce", 0, 3 * MS, 3, 9 * MS, 4), ("all_reduce", 1, 3 * MS, 3, 9 * MS, 4)]
    assert ("rank 3 arrived last at 2 of 2 collectives; others waited 18.0 ms in all at those calls, summed over "
            "peers and calls (thin evidence: only 2 calls)") in report.notes
    assert len(report.waits) == 6
    assert {(w.cause, w.waited_for, w.dur_ns, w.stage) for w in report.waits} == {("collective", 3, 3 * MS, None)}
    assert sorted(w.rank for w in report.waits) == [0, 0, 1, 1, 2, 2]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(compute=st.lists(st.integers(1, 8), min_size=2, max_size=6), steps=st.integers(1, 3))
def test_collective_waits_equal_the_hand_computed_spin(tmp_path_factory, compute, steps):
    """Any data-parallel job: rank r spins max(compute) − compute[r] at every all-reduce; the last to arrive
    (the slowest, the lowest rank among equals) is late by everyone's spin."""
    report = analyse(data_parallel(tmp_path_factory.mktemp("dp"), compute, steps=steps))
    c, slowest = report.collectives, max(compute)
    assert c.calls == steps and c.unmatched == 0
    assert [r.wait_ns for r in c.ranks] == [steps * (slowest - x) * MS for x in compute]
    late = compute.index(slowest)
    total = steps * sum(slowest - x for x in compute) * MS
    assert [r.late_ns for r in c.ranks] == [total if r == late else 0 for r in range(len(compute))]
    assert c.waited_ns == total and c.straggler == (late if total else None)

def test_a_late_ranks_spin_in_all_and_a_step_are_each_named(tmp_path):
    """The same job: its 3 peers spin 3 ms at each of rank 3's 2 late all-reduces, 18 ms in all (the note); had
    rank 3 come on time each call would release 3 ms sooner, 3 ms a step over its 2 steps (the finding). Both
    say which they are, and the thin evidence is said in the finding itself."""
    report = analyse(data_parallel(tmp_path, [2, 2, 2, 5]))
    found = next(f for f in report.findings if f.kind == "late_rank")
    assert found.worth_ns == 3 * MS and found.cause == "gpu_compute"
    assert found.title == ("rank 3 computes longer on its GPU before the collectives; the others wait 3.0 ms a step "
                           "for it (thin evidence: only 2 calls)")
    assert found.how.startswith("the others waited 18.0 ms in all at the 2 calls it arrived last to (2 steps, "
                                "summed over its peers); on time, each call would release at the second-last "
                                "arrival: 3.0 ms a step")
    assert any("others waited 18.0 ms in all at those calls" in n for n in report.notes)


def test_balanced_data_parallel_job_names_no_straggler(tmp_path):
    report = analyse(data_parallel(tmp_path, [2, 2, 2, 2]))
    assert report.collectives.waited_ns == 0 and report.collectives.straggler is None
    assert report.waits == [] and not any("arrived last" in n for n in report.notes)


def test_bubble_gate_skips_a_data_parallel_job_saying_why(tmp_path):
    folder = data_parallel(tmp_path / "dp", [2, 2, 2, 5])
    result = subprocess.run([sys.executable, "-m", "pipebubble", "check", str(folder), "--max-bubble", "0.3",
                             "--no-cache", "--format", "json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    gate = json.loads(result.stdout)["gates"][0]
    assert gate["status"] == "skip" and gate["note"].startswith("not a pipeline: 4 ranks")


def test_all_to_all_run_as_send_recv_kernels_is_a_collective_not_a_pipeline(tmp_path):
    """NCCL runs all_to_all as SendRecv kernels: the kernel name alone would read as point-to-point, but
    the launch sits inside nccl:all_to_all, so it is a collective and the job no pipeline."""
    report = analyse(all_to_all(tmp_path, world=2, steps=3, late_rank=1, late_ms=2.0))
    assert report.pipeline is None and report.notes[0].startswith("not a pipeline: 2 ranks")
    c = report.collectives
    assert c.calls == 3 and {w.name for w in c.worst} == {"all_to_all"}
    assert [(r.rank, r.wait_ns, r.late_ns, r.last) for r in c.ranks] == [(0, 6 * MS, 0, 0), (1, 0, 6 * MS, 3)]
    assert c.straggler == 1


def test_pipeline_matches_collectives_among_each_stages_peers_only(tmp_path):
    """Two data-parallel replicas of a 2-stage pipeline (ranks 0,1 are stage 0 and 1 of replica 0; ranks
    2,3 of replica 1, shifted 1 ms) with labels: stages hand work over by send/recv; the replicas'
    gradient all-reduces (stage 0 with stage 0) are matched per stage, never across stages."""
    sim = simulate("gpipe", 2, 4, [MS, MS], [2 * MS, 2 * MS])
    groups = [{"pg_name": "1", "pg_desc": "mesh_pp", "ranks": [0, 1]},
              {"pg_name": "2", "pg_desc": "mesh_pp", "ranks": [2, 3]}]
    write_pipeline(tmp_path, sim, rank_of=lambda s: s, world=4, groups=groups)
    write_pipeline(tmp_path, sim, rank_of=lambda s: s + 2, world=4, groups=groups, offset_ns=2 * MS)
    report = analyse(tmp_path)
    assert report.pipeline.stages == 2 and "pipeline process group (pg_config)" in report.pipeline.evidence
    assert report.collectives is None  # no all-reduce written: nothing to match, and no cross-stage pairs


def test_one_rank_of_a_big_job_says_so_and_invents_no_stages(tmp_path):
    report = analyse(one_rank(tmp_path, rank=5, world=64))
    assert report.stages == [] and report.pipeline is None
    assert report.notes == [
        "one rank (rank 5) of a 64-rank job: this file's own lanes and collectives are analysed; "
        "no stages are inferred from one rank (give every rank's trace for the pipeline)"]


def test_one_labelled_rank_of_a_pipeline_gets_its_own_passes_and_waits(tmp_path):
    """One stage's file (labels, a pipeline group of 4): its stage row and waits, no pipeline summary."""
    groups = [{"pg_name": "3", "pg_desc": "pp", "ranks": [1, 17, 33, 49]}]
    report = analyse(one_rank(tmp_path, rank=17, world=64, labels="PP:1{phase}{mb}", groups=groups))
    assert report.pipeline is None and len(report.stages) == 1
    stage = report.stages[0]
    assert stage.name == "pp1" and stage.microbatches == 4
    # 4 forwards of 1 ms and 4 backwards of 2 ms, 0.5 ms apart: busy 12 ms over a 15.5 ms window
    assert (stage.busy_ns, stage.idle_ns) == (12 * MS, 7 * MS // 2)
    assert len(report.waits) == 7 and all(w.dur_ns == MS // 2 for w in report.waits)
    assert report.notes[0].startswith("one rank (rank 17, stage pp1) of a 64-rank job")


def test_shared_recsys_ranks_are_not_a_pipeline():
    """Two sampled ranks of a 128-rank recommendation-model job (data-parallel dense part, all_to_all
    embeddings). The sampling left calls on one rank without their peer's: only the five whose kernels end
    together on both ranks (an all_to_all, two all_reduces, two all_gathers) are collectives; the other 10
    ranks' calls are left out, counted."""
    report = analyse(shared("kineto", "recsys_128rank_sampled_rank-0.json.gz"),
                     shared("kineto", "recsys_128rank_sampled_rank-1.json.gz"))
    assert report.pipeline is None and report.notes[0].startswith("not a pipeline: 2 ranks")
    assert report.notes[1].startswith("2 of a 128-rank job's ranks: collectives are matched among these ranks only")
    c = report.collectives
    assert (c.calls, c.unmatched) == (5, 10)
    assert sorted(w.name for w in c.worst) == ["all_gather", "all_gather", "all_reduce", "all_reduce", "all_to_all"]
    assert all(w.waited_ns == w.skew_ns and w.ranks == 2 for w in c.worst)  # two ranks: the early one spins


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved1f1b"])
def test_shared_cpu_pipelines_say_why_they_are_pipelines(name):
    pipe = analyse(shared("pipeline_cpu", name)).pipeline
    assert pipe.stages == 4 and any(e.startswith("send/recv between ranks") for e in pipe.evidence)


def test_stage_order_comes_from_the_labels_stage_ids_not_rank_numbers(tmp_path):
    """Rank 3 runs stage 0 and rank 0 stage 3 (``PP:{stage}F{mb}`` says so): stages follow the activations."""
    sim = simulate("1f1b", 4, 8, [MS, 2 * MS, MS, MS], [2 * MS, 4 * MS, 2 * MS, 2 * MS])
    report = analyse(write_pipeline(tmp_path, sim, rank_of=lambda s: 3 - s, spin_before_forward=MS // 2))
    assert [s.name for s in report.stages] == ["rank3", "rank2", "rank1", "rank0"]
    assert report.pipeline.bubble_fraction == pytest.approx(sim.bubble_fraction)
    assert [s.busy_ns for s in report.stages] == [8 * 3 * MS, 8 * 6 * MS, 8 * 3 * MS, 8 * 3 * MS]
    assert any(w.cause == "upstream" for w in report.waits)


def test_one_rank_of_an_expert_parallel_job_with_dualpipe_labels_gets_its_passes_and_says_why(tmp_path):
    """A single rank of a 64-rank job, DeepSeek/DualPipe labels (``attn(F)`` ... ``attn(B)``): its own stage
    row (one forward and one backward pass), no pipeline summary, and a note saying what the file is."""
    report = analyse(one_rank(tmp_path, rank=5, world=64, labels="attn({phase})"))
    assert report.pipeline is None and [s.name for s in report.stages] == ["rank5"]
    assert report.stages[0].microbatches == 1
    assert report.stages[0].busy_ns == 4 * MS + 8 * MS
    assert report.notes == [
        "one rank (rank 5, stage rank5) of a 64-rank job: its own passes and waits are analysed; "
        "the pipeline's bubble needs every stage's trace"]


def test_deepep_dispatch_and_combine_kernels_are_matched_collectives(tmp_path):
    """Expert parallel over DeepEP: dispatch and combine kernels are communication, matched across the
    ranks like any collective (rank 1 computes 2 ms longer, so rank 0 spins 2 ms in every dispatch)."""
    from shapes import Rank

    for r in range(2):
        rank = Rank(r, 2)
        for k in range(2):
            base = MS + 10 * MS * k
            rank.step(k, base - 50_000, 9 * MS)
            c = 1 + 2 * r
            rank.kernel("moe_expert_gemm", base, c * MS)
            rank.kernel("void deep_ep::intranode::dispatch<8, 768, 8192>(void*)", base + c * MS,
                        (3 - c) * MS + MS // 2, 20)
            rank.kernel("void deep_ep::intranode::combine<8, 768, 4096>(void*)", base + 4 * MS, MS, 20)
        rank.write(tmp_path)
    report = analyse(tmp_path)
    assert report.pipeline is None
    c = report.collectives
    assert sorted({w.name for w in c.worst}) == ["combine", "dispatch"] and c.calls == 4
    assert [(r.rank, r.wait_ns, r.late_ns) for r in c.ranks] == [(0, 4 * MS, 0), (1, 0, 4 * MS)]
