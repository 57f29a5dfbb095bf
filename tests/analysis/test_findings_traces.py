"""Findings end to end: traces of the shapes the findings are for, analysed as a user would (``run``), each
giving its finding first with a hand-computed worth; ``check --max-finding`` gates on them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rootcause_shapes import dp_job
from synth import _x, simulate, write_pipeline

from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]
US = 1_000


def analyse(*paths: Path):
    return run(list(paths), Options(), Scale(use_cache=False, workers=1))


def single_gpu(path: Path, steps: int, kernel_us: int, launch_every_us: int, sync_after: bool) -> Path:
    """One GPU, ``steps`` ProfilerSteps of 20 kernels: each launched ``launch_every_us`` after the last; with
    ``sync_after`` the host synchronizes on each kernel and then works on until the next launch."""
    events, t, corr = [], 1_000_000, 0
    for step in range(steps):
        start = t
        for _ in range(20):
            corr += 1
            events += [_x("cuda_runtime", "cudaLaunchKernel", 1, 1, t, 5 * US, corr),
                       _x("kernel", "gemm", 0, 7, t + 6 * US, kernel_us * US, corr)]
            if sync_after:
                events.append(_x("cuda_runtime", "cudaStreamSynchronize", 1, 1, t + 5 * US, (kernel_us + 2) * US))
            t += launch_every_us * US
        events.append(_x("user_annotation", f"ProfilerStep#{step}", 1, 1, start, t - start))
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_launch_bound_gpu(tmp_path):
    # Kernels of 5 µs launched every 50 µs (each starts 6 µs after its launch): the GPU waits 45 µs for every
    # launch. Per 1,000 µs step: 19 gaps inside it, the 39 µs after its last kernel and the 6 µs before its
    # first (both halves of the gap across a step boundary), less the edges of the trace: steps 0, 1, 2 hold
    # 855 + 39, 6 + 855 + 39 and 6 + 855 µs: a mean of 885 µs a step.
    # The idle is between tiny kernels (the top finding); the account splits each gap into the launching
    # thread's untraced time (the launch comes 45 µs after the GPU ran dry, 6 µs of it its own latency) and
    # the launch: CPU-bound and launch-bound findings, whose worths add up to the same 885 µs.
    report = analyse(single_gpu(tmp_path / "launch.json", 3, 5, 50, sync_after=False))
    top = report.findings[0]
    assert top.kind == "tiny_kernels" and top.where.gpus == ["rank0/gpu0"]
    assert top.worth_ns == 885 * US
    found = {f.kind: f for f in report.findings}
    assert found["cpu_bound"].worth_ns + found["launch_bound"].worth_ns == 885 * US
    assert found["launch_bound"].worth_ns == (20 + 20 + 19) * 6 * US // 3  # each late launch's 6 µs latency


def test_sync_stall(tmp_path):
    # Each kernel (100 µs, from 6 µs after its launch) is waited for by a synchronize of 102 µs (from 5 µs after
    # the launch); the host then works until the next launch at 300 µs. The sync kept the host 102 µs ahead, so
    # the gap after it is the sync's for 102 µs past its return: [106, 209) of each 300 µs, 103 µs; the rest
    # is the host's own. 20 gaps in each step but the last, which has 19: a mean of 59 × 103 / 3 µs a step.
    report = analyse(single_gpu(tmp_path / "sync.json", 3, 100, 300, sync_after=True))
    kinds = [f.kind for f in report.findings]
    sync = report.findings[kinds.index("sync_stall")]
    assert kinds[0] == "sync_stall" and sync.worth_ns == round(59 * 103 * US / 3)
    assert sync.evidence["behind"][0]["call"] == "cudaStreamSynchronize"


def test_too_few_microbatches_replays_a_larger_m(tmp_path):
    forward = [100_000] * 4
    folder = write_pipeline(tmp_path / "pp", simulate("1f1b", 4, 2, forward, [2 * f for f in forward]))
    report = analyse(folder)
    few = next(f for f in report.findings if f.kind == "too_few_microbatches")
    best = min((r for r in report.pipeline.recommendations if r.label.startswith("m=")), key=lambda r: r.step_time_ns)
    current = next(r for r in report.pipeline.recommendations if r.label.startswith("current"))
    assert few.worth_ns == current.step_time_ns - best.step_time_ns > 0
    assert f"{best.microbatches} micro-batches" in few.action


def test_imbalanced_sample_names_stage_3_with_the_rebalanced_saving():
    report = analyse(ROOT / "sample_traces" / "pipeline_1f1b_imbalanced")
    found = next(f for f in report.findings if f.kind == "imbalance")
    recs = {r.label.split(" → ")[0]: r for r in report.pipeline.recommendations}
    saving = recs["current: 1f1b, m=8"].step_time_ns - recs["rebalanced stages"].step_time_ns
    assert found.where.stages == [3] and found.worth_ns == pytest.approx(saving, rel=0.05)


def test_data_loader_rank_is_found_across_ranks(tmp_path):
    report = analyse(*dp_job(tmp_path / "dp", world=4, steps=3, loader_ms={2: 3.0}))
    # Among the top findings (the synthetic GPUs also idle between steps, a launch-bound finding of its own).
    kinds = [f.kind for f in report.findings]
    loader = report.findings[kinds.index("data_loader")]
    assert kinds.index("data_loader") < 2 and loader.where.ranks == [2]
    assert loader.worth_ns == 3_000_000  # the peers' wait for it at each step's all-reduce


def test_findings_sorted_first_in_json_and_gated(tmp_path):
    report = analyse(ROOT / "sample_traces" / "pipeline_1f1b_imbalanced")
    worths = [f.worth_ns for f in report.findings]
    assert worths == sorted(worths, reverse=True) and list(report.to_dict())[:3] == ["schema_version", "ingest",
                                                                                      "findings"]
    share = report.findings[0].worth_share
    cli = [sys.executable, "-m", "pipebubble", "check", str(ROOT / "sample_traces" / "pipeline_1f1b_imbalanced")]
    below = subprocess.run([*cli, "--max-finding", f"{share * 100 - 1:.1f}%"], capture_output=True, text=True)
    above = subprocess.run([*cli, "--max-finding", f"{share * 100 + 1:.1f}%"], capture_output=True, text=True)
    assert (below.returncode, above.returncode) == (1, 0), below.stderr + above.stderr


SHARED = ROOT.parent / "shared" / "traces"


@pytest.mark.skipif(not (SHARED / "kineto").exists(), reason="the shared traces are absent")
def test_critical_path_in_the_report_and_the_export():
    from pipebubble.render import perfetto

    ranks = sorted((SHARED / "kineto").glob("recsys_128rank_sampled_rank-*.json.gz"))
    report = analyse(*ranks)
    assert report.critical_path and report.strips is not None and len(report.strips.rows) == 2
    for path in report.critical_path:
        shares = sum(s.compute_ns + s.memory_ns + s.comm_ns + s.host_ns + s.waiting_ns for s in path.by_rank)
        assert shares == path.length_ns > 0
    kept = [p for p in report.critical_path if p.segments]
    assert len(kept) == 1 and sum(s.end_ns - s.start_ns for s in kept[0].segments) == kept[0].length_ns
    import polars as pl

    from pipebubble.ingest import read_file

    spans = pl.concat([read_file(p, use_cache=False).spans for p in ranks])
    trace = perfetto.build(spans, report)
    assert any(s.category == "pipebubble.critical" for s in trace.slices)


def test_memory_finding_when_the_fastest_what_if_does_not_fit():
    """By hand: current 100 ms; the fastest row (interleaved, 70 ms) does not fit, the best that fits (m=16)
    replays 80 ms: worth 10 ms a step, out of reach until memory is freed."""
    from dataclasses import replace

    from pipebubble.analysis.findings import memory
    from pipebubble.report import Recommendation
    from pipebubble.report.memory import Memory, MemoryStage

    report = analyse(ROOT / "sample_traces" / "memory" / "1f1b_m4")
    recs = [Recommendation("current: 1f1b, m=4", "1f1b", 4, 1, 100_000_000, 0.5, 1.0, "", 6 << 20, True),
            Recommendation("interleaved_1f1b v=2", "interleaved_1f1b", 4, 2, 70_000_000, 0.3, 1.4, "", 9 << 20, False),
            Recommendation("m=16", "1f1b", 16, 1, 80_000_000, 0.4, 1.25, "", 4 << 20, True)]
    stages = [MemoryStage(0, ["rank0/gpu0"], 6 << 20, 0, 0, 1 << 20, 4, capacity_bytes=8 << 20)]
    report = replace(report, pipeline=replace(report.pipeline, recommendations=recs, step_time_ns=100_000_000),
                     memory=Memory(events=1, stages=stages))
    (found,) = memory.findings(report)
    assert found.kind == "memory" and found.worth_ns == 10_000_000
    assert found.evidence["best_fitting"] == "m=16"
    fits = [replace(r, fits=True) for r in recs]
    assert memory.findings(replace(report, pipeline=replace(report.pipeline, recommendations=fits))) == []


@pytest.mark.skipif(not (SHARED / "kineto").exists(), reason="the shared traces are absent")
def test_a_rank_that_entered_its_steps_late_is_named_so(tmp_path):
    """A real DP rank copied into 4, copy 2 entering each step 5 ms late: its finding says it entered late
    (not slow inside the step) and is worth the peers' spin for it, 5 ms a step."""
    from rootcause_shapes import copies_entered_late

    paths = copies_entered_late(SHARED / "kineto" / "resnet_ddp_a100_nccl_rank0.json.gz", tmp_path / "job",
                                world=4, late=2, delay_us=5_000)
    found = next(f for f in analyse(*paths).findings if f.kind == "late_rank")
    assert found.where.ranks == [2] and found.cause == "entered_late" and "enters its steps late" in found.title
    assert found.worth_ns == pytest.approx(5_000_000, rel=0.05)


@pytest.mark.skipif(not (SHARED / "kineto").exists(), reason="the shared traces are absent")
def test_a_late_ranks_numbers_say_what_each_is():
    """The real two-rank recsys job (2 of 128 ranks, 2 steps): rank 1 arrives last at every matched call. The
    others' spin there in all (the note), what they wait a step for it, and the part of that its cause
    explains (the worth) are three numbers, each named for what it is; the thin evidence is in the title."""
    report = analyse(*(SHARED / "kineto" / f"recsys_128rank_sampled_rank-{k}.json.gz" for k in (0, 1)))
    found = next(f for f in report.findings if f.kind == "late_rank")
    ev = found.evidence
    in_all = sum(c.waited_ns for c in report.collectives.worst if c.last_rank == 1)  # 5 calls, all among the worst
    a_step = sum(ev["worth_ns_per_step"]) / 2
    assert found.worth_ns == round(ev["worth_by_cause_ns"][found.cause] / 2) < a_step
    assert f": {found.worth_ns / 1e6:.1f} ms of the {a_step / 1e6:.1f} ms a step the others wait for it" in found.title
    assert found.title.endswith("(thin evidence: 2 of 128 ranks traced)")
    assert f"the others waited {in_all / 1e6:.1f} ms in all at the 5 calls it arrived last to (2 steps" in found.how
    assert f"{ev['worth_by_cause_ns']['entered_late'] / 2e6:.1f} ms (entering late lies before its steps" in found.how
    assert any(f"others waited {in_all / 1e6:.1f} ms in all at those calls" in n for n in report.notes)
