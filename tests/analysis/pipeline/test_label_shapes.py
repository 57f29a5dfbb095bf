"""Label shapes: passes that are work spans on one thread per stage (``--stage-by thread`` with
``--microbatch-regex``), DualPipe's per-layer labels over DeepEP kernels, and which kernels are communication.
Every number is worked out by hand in the builders' docstrings (``label_shapes``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from fractions import Fraction

import label_shapes as shapes
import polars as pl
import pytest

from pipebubble.analysis.pipeline.labels import LABEL_PATTERNS, attribute, labels
from pipebubble.ingest import load, read_file
from pipebubble.options import Options, Scale
from pipebubble.run import run

THREADED = {"stage_by": "thread", "microbatch_regex": shapes.PASS_REGEX}


def analyse(path, settings: dict | None = None):
    return run([path], Options.from_settings(settings or {}), Scale(use_cache=False))


# --- (a) passes that are work spans, one thread per stage ---


@pytest.mark.parametrize("kind", ["cpu_op", "kernel"])
def test_passes_that_are_work_spans_on_thread_stages(tmp_path, kind):
    report = analyse(shapes.write_passes_as_work(tmp_path / "pipe.json", kind=kind), THREADED)
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.schedule, len(pipe.steps)) == (4, 4, "gpipe", 1)
    assert pipe.window_ns == 210_000
    assert Fraction(sum(s.idle_ns for s in report.stages), 4 * pipe.window_ns) == Fraction(3, 7)
    # Stages in pipeline order although their thread ids fall; the main thread (no labels) is no stage.
    assert [s.name for s in report.stages] == [f"rank0/pid100/tid{shapes.thread_of(s)}" for s in range(4)]
    rows = [(s.busy_ns, s.idle_ns, s.fill_ns, s.forward_ns, s.backward_ns, s.microbatches) for s in report.stages]
    assert rows == [(120_000, 90_000, 10_000 * s, 40_000, 80_000, 4) for s in range(4)]
    # GPU work follows the thread that launched it: every stage's kernels sit on the one GPU.
    threads = {f"rank0/pid100/tid{shapes.thread_of(s)}" for s in range(4)}
    assert {lane for s in report.stages for lane in s.lanes} == ({"rank0/gpu0"} if kind == "kernel" else threads)


def test_a_labelled_operator_labels_what_is_nested_in_it(tmp_path):
    spans = read_file(shapes.write_passes_as_work(tmp_path / "p.json"), use_cache=False).spans
    found, pattern = labels(spans, shapes.PASS_REGEX)
    assert pattern == "custom" and found.height == 4 * 4 * 2
    ops = spans.filter((pl.col("kind") == "cpu_op") & (pl.col("tid") != shapes.MAIN))
    labelled = attribute(ops, spans, found).sort("lane", "start")
    passes = labelled.filter(pl.col("name") != "aten::mm")
    nested = labelled.filter(pl.col("name") == "aten::mm")
    # F_2,3 is forward micro-batch 3, and so is the aten::mm inside it.
    assert [(n[0], int(n.split(",")[1])) for n in passes["name"]] == [
        (phase[0].upper(), mb) for phase, mb in passes.select("phase", "microbatch").rows()]
    assert nested.select("phase", "microbatch").rows() == passes.select("phase", "microbatch").rows()
    # Without the regex, PiPPy's built-in pattern reads the same operators: the same labels.
    plain, pattern = labels(spans)
    assert pattern == "pippy" and plain.equals(found)
    # Where a range matches the regex, ranges are the labels and operators of the same name are not.
    ranged = spans.filter(pl.col("name") == "F_0,0").with_columns(kind=pl.lit("annotation").cast(spans["kind"].dtype))
    found, _ = labels(pl.concat([spans, ranged]), shapes.PASS_REGEX)
    assert found.height == 1


def test_thread_stages_from_the_command_line(tmp_path):
    path = shapes.write_passes_as_work(tmp_path / "pipe.json", kind="kernel")
    args = ["analyze", str(path), "--stage-by", "thread", "--microbatch-regex", shapes.PASS_REGEX, "--format", "json",
            "--no-cache"]
    proc = subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    pipe = json.loads(proc.stdout)["pipeline"]
    assert (pipe["stages"], pipe["microbatches"], pipe["window_ns"]) == (4, 4, 210_000)
    helped = subprocess.run([sys.executable, "-m", "pipebubble", "analyze", "--help"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert "thread" in helped.stdout and "--microbatch-regex" in helped.stdout


# --- (b) DualPipe labels ---


@pytest.mark.parametrize("upper", [False, True], ids=["deepseek", "megatron-core"])
def test_dualpipe_labels_over_deepep_kernels(tmp_path, upper):
    report = analyse(shapes.write_dualpipe(tmp_path, upper=upper))
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, len(pipe.steps), pipe.window_ns) == (2, 2, 1, 84_000)
    assert "micro-batch labels (dualpipe)" in pipe.evidence
    s0, s1 = report.stages
    assert (s0.busy_ns, s0.comm_ns, s0.idle_ns, s0.fill_ns, s0.drain_ns) == (48_000, 16_000, 36_000, 0, 0)
    assert (s1.busy_ns, s1.comm_ns, s1.idle_ns, s1.fill_ns, s1.drain_ns) == (48_000, 16_000, 36_000, 12_000, 8_000)
    for s in (s0, s1):  # DeepEP's kernels are communication: in comm, never in busy or a pass's time
        assert (s.forward_ns, s.backward_ns, s.weight_ns, s.microbatches) == (16_000, 24_000, 8_000, 2)


def test_one_overlapped_pair_is_one_step(tmp_path):
    """DeepSeek's published window: each rank runs one forward chunk overlapped part by part with one
    backward chunk. The forward's parts interleave with the backward's; they are still one pass, one step."""
    report = analyse(shapes.write_dualpipe(tmp_path, shapes.ONE_PAIR))
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, len(pipe.steps), pipe.window_ns) == (2, 1, 1, 36_000)
    assert [(s.busy_ns, s.forward_ns, s.backward_ns, s.weight_ns) for s in report.stages] == [
        (24_000, 8_000, 12_000, 4_000)] * 2


def test_one_pair_a_step_counts_afresh_each_step(tmp_path):
    """Two ProfilerSteps of one overlapped pair each: every step's forward is micro-batch 0 again, and the
    ProfilerStep its launches fall in tells the two steps apart."""
    report = analyse(shapes.write_dualpipe(tmp_path, shapes.TWO_STEPS, steps=shapes.STEPS))
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.step_time_ns) == (2, 1, 36_000)
    assert [(s.window_start_ns - shapes.BASE, s.window_end_ns - shapes.BASE) for s in pipe.steps] == [
        (2_000, 38_000), (52_000, 88_000)]
    assert [(s.busy_ns, s.idle_ns) for s in report.stages] == [(48_000, 24_000)] * 2


def dualpipe_labels(folder) -> list[tuple[str, str, int]]:
    spans = load([folder / "rank0.json"], use_cache=False).spans
    found, pattern = labels(spans)
    assert pattern == "dualpipe"
    named = found.join(spans.select("lane", "start", "end", "name"), on=["lane", "start", "end"])
    return named.sort("start").select("name", "phase", "microbatch").rows()


def test_dualpipe_passes_are_numbered_by_their_enclosing_range(tmp_path):
    rows = dualpipe_labels(shapes.write_dualpipe(tmp_path))
    assert len(rows) == 4 + 10 + 6
    warmup, pair, cooldown = rows[:4], rows[4:14], rows[14:]
    assert {(phase, mb) for _, phase, mb in warmup} == {("forward", 0)}
    assert {(phase, mb) for _, phase, mb in pair} == {("forward", 1), ("backward", 0), ("weight", 0)}
    assert {(phase, mb) for _, phase, mb in cooldown} == {("backward", 1), ("weight", 1)}
    assert pair[0] == ("combine(B)", "backward", 0) and pair[1] == ("attn(F)", "forward", 1)


def test_dualpipe_labels_outside_any_range_group_by_their_run(tmp_path):
    """Only the overlapped pair has a range: the forward before it and the backward after it are runs of
    their own."""
    bare = {r: tuple((name if name == "1F1B" else None, at, parts) for name, at, parts in chunks)
            for r, chunks in shapes.SCHEDULE.items()}
    rows = dualpipe_labels(shapes.write_dualpipe(tmp_path, bare))
    assert {(phase, mb) for _, phase, mb in rows[:4]} == {("forward", 0)}
    assert {(phase, mb) for _, phase, mb in rows[4:14]} == {("forward", 1), ("backward", 0), ("weight", 0)}
    assert {(phase, mb) for _, phase, mb in rows[14:]} == {("backward", 1), ("weight", 1)}


def test_names_only_like_dualpipe_are_no_labels():
    names = ["attn(F)", "MLP(W)", "dispatch(B)", "COMBINE(F)", "attn(f)", "attn (F)", "self_attn(F)", "mlp(F)x",
             "moe_combine(B)", "dispatch(W)x"]
    hits = pl.Series(names).filter(pl.Series(names).str.contains(dict(LABEL_PATTERNS)["dualpipe"])).to_list()
    assert hits == ["attn(F)", "MLP(W)", "dispatch(B)", "COMBINE(F)"]


# --- (c) which kernels are communication ---


def test_deepep_and_nvshmem_kernels_are_communication(tmp_path):
    spans = load([shapes.write_kernel_names(tmp_path / "k.json")], use_cache=False).spans
    kinds = dict(spans.filter(pl.col("device").is_not_null()).select("name", "kind").rows())
    assert {kinds[n] for n in shapes.COMM_KERNELS} == {"comm"}
    assert {n: kinds[n] for n in shapes.COMPUTE_KERNELS} == {n: "kernel" for n in shapes.COMPUTE_KERNELS}


def test_nsight_classifies_them_the_same_way(tmp_path):
    import nsys_fixtures as fx

    names = shapes.COMM_KERNELS + shapes.COMPUTE_KERNELS
    trace = fx.Trace(processes={100: "python3"})
    trace.gpu = [fx.Gpu(100, 0, 7, 1_000 * i, 1_000 * i + 500, name=n, correlation=i + 1, launch_tid=11)
                 for i, n in enumerate(names)]
    spans = load([fx.write(trace, tmp_path / "k.sqlite")], use_cache=False).spans
    kinds = dict(spans.filter(pl.col("device").is_not_null()).select("name", "kind").rows())
    assert [kinds[n] for n in names] == ["comm"] * len(shapes.COMM_KERNELS) + ["kernel"] * len(shapes.COMPUTE_KERNELS)
