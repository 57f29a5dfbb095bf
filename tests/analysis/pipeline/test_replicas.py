"""DP × PP jobs: p stages × d replicas that sync gradients every step. A heavy stage (slow in every replica)
and a slow worker (one GPU slower than the same stage in the other replicas) are told apart, each with the
step the job would get back, checked against closed forms of the generator's GPipe schedule. The jobs enter
as a command does (``run``): Megatron's step-timer timeline (one file, ``pid`` = DP rank), per-rank files
with pipeline process groups, and per-rank files staged by ``--pp-size``."""

from __future__ import annotations

import statistics

import pytest
from conftest import shared
from megatron_timers import SYNC_US, write_rank_files, write_step_timers

from pipebubble.options import Options, PipelineOptions, Scale, StageOptions
from pipebubble.run import run

STEPS = (3, 4, 9)  # sampled, not contiguous


def analyse(paths, options=Options()):
    return run(paths, options, Scale(use_cache=False))


def job_windows(passes, dp):
    """Per step, the job's window in µs: first to last pass over every replica."""
    out = []
    for step in STEPS:
        rows = [row for d in range(dp) for row in passes[(d, step)].values()]
        out.append(max(e for row in rows for *_, e in row) - min(s for row in rows for _, _, s, _ in row))
    return out


def gpipe_step_us(m, p, per_mb_us):
    """GPipe's step with equal stages, each pass pair (F + B) of a micro-batch ``per_mb_us``: (m + p − 1) · t."""
    return (m + p - 1) * per_mb_us


def test_heavy_stage_in_every_replica_is_imbalance_first(tmp_path):
    m, p, dp = 16, 4, 2
    path, passes = write_step_timers(tmp_path / "heavy.json", pp=p, dp=dp, m=m, heavy={3: 1.6}, steps=STEPS)
    report = analyse([path])
    rep = report.pipeline.replicas
    assert (rep.count, len(report.pipeline.steps)) == (dp, len(STEPS))
    first = report.findings[0]
    assert first.kind == "imbalance" and first.where.stages == [3]
    assert "1.60× heavier than the median stage in every replica" in first.title
    # Balanced: every stage at the mean load, F = 115 µs, B = 230 µs, in both replicas.
    measured = statistics.mean(job_windows(passes, dp))
    saving = (measured - gpipe_step_us(m, p, 3 * 100 * (3 + 1.6) / 4)) * 1000
    assert first.worth_ns == pytest.approx(saving, rel=0.10)
    assert not any(f.kind == "slow_worker" for f in report.findings)  # every worker computes as its peers


def test_one_slow_worker_is_named_first_with_half_the_step(tmp_path):
    m, p, dp = 16, 4, 4
    path, passes = write_step_timers(tmp_path / "slow.json", pp=p, dp=dp, m=m, slow={(0, 0): 2.2}, steps=STEPS)
    report = analyse([path])
    first = report.findings[0]
    assert first.kind == "slow_worker"
    assert (first.evidence["stage"], first.evidence["replica"]) == (0, 0)
    assert "worker pp0/dp0 (stage 0, replica 0)" in first.title and "2.20× longer" in first.title
    measured = statistics.mean(job_windows(passes, dp))
    saving = (measured - gpipe_step_us(m, p, 300)) * 1000  # at its peers' median, every replica is the others'
    assert first.worth_ns == pytest.approx(saving, rel=0.10)
    assert 0.4 < first.worth_ns / (measured * 1000) < 0.6
    assert not any(f.kind == "imbalance" for f in report.findings)  # no stage is heavy in every replica


def test_replica_figures_against_the_passes(tmp_path):
    m, p, dp = 4, 4, 3
    path, passes = write_step_timers(tmp_path / "job.json", pp=p, dp=dp, m=m, slow={(2, 1): 1.5}, steps=STEPS)
    report = analyse([path])
    rep = report.pipeline.replicas
    # The slowest replica is the one analysed: its stages, named by their coordinates.
    assert rep.analysed == 1
    assert [(s.name, s.replica, s.lanes) for s in report.stages] == [
        (f"pp{s}", 1, [f"pp{s}/dp1 compute"]) for s in range(p)]
    for d, row in enumerate(rep.rows):
        windows, busy = [], 0.0
        for step in STEPS:
            rows = passes[(d, step)].values()
            windows.append(max(e for r in rows for *_, e in r) - min(s for r in rows for _, _, s, _ in r))
            busy += sum(e - s for r in rows for _, _, s, e in r)
        assert row.step_time_ns == pytest.approx(statistics.mean(windows) * 1000, abs=1)
        assert row.bubble_fraction == pytest.approx(1 - busy / (p * sum(windows)), abs=1e-9)
    job = job_windows(passes, dp)
    busy = sum(e - s for rows in passes.values() for r in rows.values() for _, _, s, e in r)
    assert rep.step_time_ns == pytest.approx(statistics.mean(job) * 1000, abs=1)
    assert rep.bubble_fraction == pytest.approx(1 - busy / (p * dp * sum(job)), abs=1e-9)
    # Each worker of stage 2 waits at the gradient sync for the slow one, from its own last backward.
    sync = [w for w in report.waits if w.cause == "dp_sync" and w.stage == 2]
    assert sync and all("pp2/dp1" in w.after for w in sync)
    for w in sync:
        d = int(w.lane.split("/dp")[1].split()[0])
        step = STEPS[w.step]
        own, slow = passes[(d, step)][2][-1][3], passes[(1, step)][2][-1][3]
        assert w.dur_ns == pytest.approx((slow - own) * 1000, abs=1)
    assert SYNC_US > 0


@pytest.mark.parametrize(("how", "skew_us"), [("groups", 0.0), ("pp_size", 0.0), ("groups", 1300.0)])
def test_rank_files_name_the_slow_workers_rank(tmp_path, how, skew_us):
    """Per-rank files, the ranks' clocks apart by up to 2.6 ms in one case: put on one clock by the passes'
    order within each replica, the slow worker is named by its rank."""
    m, p, dp = 16, 4, 2
    _, passes = write_step_timers(tmp_path / "job.json", pp=p, dp=dp, m=m, slow={(1, 1): 2.0}, steps=STEPS)
    rank_of = write_rank_files(tmp_path / "ranks", passes, p, dp, groups=how == "groups", skew_us=skew_us)
    options = Options(PipelineOptions(StageOptions(pp_size=p))) if how == "pp_size" else Options()
    report = analyse([tmp_path / "ranks"], options)
    rep = report.pipeline.replicas
    assert rep is not None and rep.count == dp
    first = report.findings[0]
    assert first.kind == "slow_worker"
    assert first.where.ranks == [rank_of[(1, 1)]] and f"rank {rank_of[(1, 1)]}" in first.title
    assert [s.rank for s in report.stages] == [rank_of[(s, rep.analysed)] for s in range(p)]
    measured = statistics.mean(job_windows(passes, dp))
    assert rep.step_time_ns == pytest.approx(measured * 1000, rel=0.01)


def test_a_real_pipeline_twice_is_two_equal_replicas(tmp_path):
    """The shared GPipe job (torch pipelining on 4 gloo ranks) as the first replica of a DP × PP job and, its
    ranks renumbered 4-7, as the second: staged by ``--pp-size 4 --rank-order pp-dp-tp``, two replicas whose
    figures are the one pipeline's, no worker slower than its peer, and the pipeline as analysed alone."""
    import gzip
    import json

    source = shared("pipeline_cpu", "gpipe")
    alone = analyse([source])
    for path in sorted(source.glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for replica in (0, 1):
            rank = doc["distributedInfo"]["rank"] if replica == 0 else doc["distributedInfo"]["rank"] + 4
            copy = {**doc, "distributedInfo": {**doc["distributedInfo"], "rank": rank, "world_size": 8}}
            (tmp_path / f"rank{rank}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(copy).encode()))
    options = Options(PipelineOptions(StageOptions(pp_size=4, rank_order="pp-dp-tp")))
    report = analyse([tmp_path], options)
    rep = report.pipeline.replicas
    assert rep.count == 2
    assert [r.step_time_ns for r in rep.rows] == [alone.pipeline.step_time_ns] * 2
    assert [r.bubble_fraction for r in rep.rows] == pytest.approx([alone.pipeline.bubble_fraction] * 2)
    assert report.pipeline.bubble_fraction == pytest.approx(alone.pipeline.bubble_fraction)
    assert all(w.ratio == pytest.approx(1.0) for w in rep.workers)
    assert not any(f.kind == "slow_worker" for f in report.findings)


def test_a_replicated_job_in_every_format(tmp_path, capsys, monkeypatch):
    """The step-timer DP × PP job through the command line in every analyze format (CSV with each table, the
    replicas' and workers' too): each exits 0 with output its format promises, and the text names the slow
    worker and shows the replicas."""
    from every_format import assert_valid, cases

    from pipebubble import cli

    path, _ = write_step_timers(tmp_path / "slow.json", pp=4, dp=4, m=8, slow={(0, 0): 2.2}, steps=STEPS)
    monkeypatch.chdir(tmp_path)
    for what, args in cases():
        with pytest.raises(SystemExit) as done:
            cli.main(["analyze", str(path), *args])
        out, err = capsys.readouterr()
        assert done.value.code == 0, f"{what}: {err}"
        assert_valid(path, what, out)
        if what == "text":
            flat = " ".join(out.split())
            assert "worker pp0/dp0 (stage 0, replica 0)" in flat and "Replicas (4;" in flat
        if what == "csv workers":
            assert out.splitlines()[1].startswith("0,0,pp0/dp0,,")


def test_a_whole_slow_replica_is_named_as_one(tmp_path):
    """Every worker of replica 1 1.5× slower (one slow node): one worker's fix gives the job little back, the
    replica's much more: the finding names the replica, worth its step over the others' (closed forms)."""
    m, p, dp = 16, 4, 3
    slow = {(s, 1): 1.5 for s in range(p)}
    path, passes = write_step_timers(tmp_path / "node.json", pp=p, dp=dp, m=m, slow=slow, steps=STEPS)
    report = analyse([path])
    first = report.findings[0]
    assert first.kind == "slow_worker" and first.title.startswith("replica 1 computes 1.50× longer")
    measured = statistics.mean(job_windows(passes, dp))
    assert first.worth_ns == pytest.approx((measured - gpipe_step_us(m, p, 300)) * 1000, rel=0.10)
    best = max(w.worth_ns or 0 for w in report.pipeline.replicas.workers)
    assert first.worth_ns > 1.5 * best
