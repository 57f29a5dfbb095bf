"""FLOPs tell a slow GPU from a heavy stage: Megatron-style pipelines whose passes are ``aten::mm`` calls with
recorded shapes, one worker slower at the same FLOPs, one stage with 1.6× the FLOPs (and time)."""

from __future__ import annotations

import pytest
from megatron_timers import write_rank_files, write_step_timers

from pipebubble.options import Options, Scale
from pipebubble.run import run

STEPS = (3, 4, 9)
M, P = 16, 4
EVEN = dict.fromkeys(range(P), (64, 64, 100))
HEAVY = {**EVEN, 3: (64, 64, 160)}  # stage 3: K 1.6× as large, 1.6× the FLOPs


def analyse(tmp_path, dp, heavy=None, slow=None, shapes=EVEN):
    _, passes = write_step_timers(tmp_path / "job.json", pp=P, dp=dp, m=M, heavy=heavy, slow=slow, steps=STEPS)
    write_rank_files(tmp_path / "ranks", passes, P, dp, shapes=shapes)
    return run([tmp_path / "ranks"], Options(), Scale(workers=1, use_cache=False))


def gpipe_us(forward_us: list[float]) -> float:
    """GPipe's step with stage s's forward ``forward_us[s]`` and backward twice it: Σ (F+B) + (m−1)·max (F+B)."""
    passes = [3 * f for f in forward_us]
    return sum(passes) + (M - 1) * max(passes)


def test_a_slow_gpu_and_a_heavy_stage_are_two_findings_each_with_its_worth(tmp_path):
    report = analyse(tmp_path, dp=2, heavy={3: 1.6}, slow={(1, 0): 2.0}, shapes=HEAVY)
    kinds = {f.kind: f for f in report.findings}
    slow, heavy = kinds["slow_worker"], kinds["imbalance"]
    assert "pp1/dp0" in slow.title and "at the same FLOPs (0.50× their FLOP/s)" in slow.title
    assert slow.evidence["flops_ratio"] == pytest.approx(1.0) and slow.evidence["rate_ratio"] == pytest.approx(0.5)
    assert "check the GPU" in slow.action
    # its worth: replica 0 with pp1 at its peers' pace replays as replica 1 does
    assert slow.worth_ns == pytest.approx((gpipe_us([100, 200, 100, 160]) - gpipe_us([100, 100, 100, 160])) * 1e3,
                                          rel=0.02)
    assert heavy.where.stages == [3] and "holds 1.60× its FLOPs" in heavy.title
    assert heavy.evidence["flops_ratio"] == pytest.approx(1.6) and "(with pp1/dp0 at its peers' pace)" in heavy.title
    # its worth: the job with pp1/dp0 paced, against the same with every stage's FLOPs even (115 µs forwards)
    assert heavy.worth_ns == pytest.approx((gpipe_us([100, 100, 100, 160]) - gpipe_us([115] * 4)) * 1e3, rel=0.02)
    stages = {(s.stage, s.replica): s for s in report.flops.by_stage}
    assert len(stages) == P * 2 and stages[(3, 1)].flops == pytest.approx(1.6 * stages[(0, 1)].flops)
    assert stages[(1, 0)].flops_per_s == pytest.approx(stages[(1, 1)].flops_per_s / 2)


def test_one_replica_slow_at_the_same_flops_is_a_slow_gpu_and_flops_move_by_rate(tmp_path):
    report = analyse(tmp_path, dp=1, slow={(1, 0): 2.0})
    first = report.findings[0]
    assert first.kind == "slow_worker" and first.where.stages == [1]
    assert "at the same FLOPs (0.50× their FLOP/s)" in first.title
    rebalanced = next(r for r in report.pipeline.recommendations if r.label.startswith("rebalanced"))
    # FLOPs move at each stage's own rate: every stage then computes 4 / (3/100 + 1/200) µs a forward
    even = 4 / (3 / 100 + 1 / 200)
    assert rebalanced.step_time_ns == pytest.approx(gpipe_us([even] * 4) * 1e3, abs=1e3)
    assert "FLOPs" in rebalanced.note


def test_one_replica_with_a_heavy_stage_is_imbalance_with_its_flops(tmp_path):
    report = analyse(tmp_path, dp=1, heavy={3: 1.6}, shapes=HEAVY)
    first = report.findings[0]
    assert first.kind == "imbalance" and "holds 1.60× the median stage's FLOPs" in first.title
    assert first.worth_ns == pytest.approx((gpipe_us([100, 100, 100, 160]) - gpipe_us([115] * 4)) * 1e3, rel=0.02)
