"""Micro-batch labels in the spellings pipeline code writes (NVTX and record_function ranges, in Kineto and
Nsight traces), ordinary names that are no labels, and a 4-stage pipeline in one Nsight export whose NVTX
ranges are named ``forward-mb{j}`` / ``backward-mb{j}``. Every expectation is worked out by hand."""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction

import label_shapes as shapes
import nsys_fixtures as fx
import nsys_pipeline as nsp
import polars as pl
import pytest
from synth import simulate

from pipebubble.analysis.pipeline.labels import LABEL_PATTERNS, attribute, labels
from pipebubble.analysis.pipeline.stages import assign
from pipebubble.ingest import read_file
from pipebubble.options import Options, Scale
from pipebubble.run import of_results, run

#: (forward, backward, weight or None: each formatted with the micro-batch), the pattern that reads them.
SPELLINGS = [
    ("forward-mb{}", "backward-mb{}", None, "phase_mb"),
    ("forward_mb{}", "backward_mb{}", None, "phase_mb"),
    ("fwd_{}", "bwd_{}", "wgrad_{}", "phase_mb"),
    ("fwd-mb-{}", "bwd-mb-{}", None, "phase_mb"),
    ("forward_microbatch_{}", "backward_microbatch_{}", None, "phase_mb"),
    ("forward microbatch {}", "backward microbatch {}", None, "phase_mb"),
    ("forward_micro_batch_{}", "backward_micro_batch_{}", None, "phase_mb"),
    ("forward_step_mb{}", "backward_step_mb{}", None, "phase_mb"),
    ("forward_mb{}", "backward_input_mb{}", "backward_weight_mb{}", "phase_mb"),
    ("Forward-MB{}", "Backward-MB{}", None, "phase_mb"),
    ("F{}", "B{}", "W{}", "zero_bubble"),  # sail-sg's ZeroBubbleScheduler
    ("F{}.1", "B{}.1", "W{}.1", "zero_bubble"),  # its V schedule: micro-batch.chunk
    ("F{}.0.0", "B{}.0.0", "W{}.0.0", "zero_bubble"),  # its runtime: micro-batch.chunk.sequence split
    ("Forward {}", "Backward {}", None, "gpipe"),  # torch / PiPPy / torchtitan ScheduleGPipe and Schedule1F1B
]
IDS = [s[0].format("J") for s in SPELLINGS]
M = 3  # micro-batches in each spelling's trace


def passes(forward: str, backward: str, weight: str | None) -> list[tuple[str, str, int]]:
    """(name, phase, micro-batch) of m forwards, then m backwards each followed by its weight pass."""
    rows = [(forward.format(j), "forward", j) for j in range(M)]
    for j in range(M):
        rows.append((backward.format(j), "backward", j))
        if weight:
            rows.append((weight.format(j), "weight", j))
    return rows


def write(fmt: str, path, names: list[str]):
    if fmt == "kineto":
        return shapes.write_named_passes(path.with_suffix(".json"), names)
    return nsp.write_named_passes(path.with_suffix(".sqlite"), names, layout=fmt.split("-")[1])


@pytest.mark.parametrize("fmt", ["kineto", "nsys-2026", "nsys-2023"])
@pytest.mark.parametrize("spelling", SPELLINGS, ids=IDS)
def test_each_spelling_labels_its_passes(tmp_path, spelling, fmt):
    *names, pattern = spelling
    expected = passes(*names)
    spans = read_file(write(fmt, tmp_path / "t", [n for n, _, _ in expected]), use_cache=False).spans
    found, matched = labels(spans)
    assert matched == pattern
    # One label per pass, on the CPU: Kineto's gpu_user_annotation twin over the kernel is no second label.
    assert found["device"].null_count() == found.height == len(expected)
    assert found.sort("start").select("phase", "microbatch").rows() == [(ph, mb) for _, ph, mb in expected]
    # Each pass's kernel (launched inside its range) is that pass's work.
    kernels = spans.filter(pl.col("kind") == "kernel")
    got = attribute(kernels, spans, found).sort("start").select("phase", "microbatch").rows()
    assert got == [(ph, mb) for _, ph, mb in expected]


#: Names of ranges and operators in real traces that a label pattern must leave alone.
NOT_LABELS = [
    "aten::mm", "aten::linear", "MmBackward0", "AddmmBackward0", "autograd::engine::evaluate_function: MmBackward0",
    "ProfilerStep#3", "F.linear", "F3x", "xF3", "F_3", "B3.", "W_clear.0", "IF3.0.0", "IB3.0.0", "T-Broadcast3.0.0",
    "forward", "backward", "forward_3", "backward 3", "forward pass 3", "Forward_Layer_3", "fwd_kernel_3",
    "flash_fwd_3", "mb3", "1F1B 3", "DeepSpeedEngine.forward", "DeepSpeedEngine.backward", "nccl:send",
    "SEND_FORWARD.3_RECV_BACKWARD.2", "iter_0_3", "forward_step", "Optimizer.step#SGD.step",
    "void cutlass::Kernel<cutlass_80_tensorop_f16_s16816gemm_relu_f16_64x64_32x6_tn_align8>(Params)",
]


@pytest.mark.parametrize("name", NOT_LABELS)
def test_no_pattern_takes_an_ordinary_name(name):
    assert [k for k, regex in LABEL_PATTERNS if re.search(regex, name)] == []


def test_ordinary_ranges_and_label_named_work_are_no_labels(tmp_path):
    """A trace of ordinary ranges has no labels; work spans (operators, kernels) named like labels are no
    labels either (built-in patterns read ranges); among labels, the ordinary ranges stay out."""
    spans = read_file(shapes.write_named_passes(tmp_path / "plain.json", NOT_LABELS), use_cache=False).spans
    assert labels(spans)[1] is None
    ops = [shapes.x("cpu_op", name, shapes.BASE + 20 * shapes.US * i, 10 * shapes.US)
           for i, name in enumerate(["F3", "fwd_3", "forward-mb3", "B3"])]
    worked = read_file(shapes.write(tmp_path / "ops.json", ops), use_cache=False).spans
    assert labels(worked)[1] is None
    mixed = shapes.write_named_passes(tmp_path / "mixed.json", [*NOT_LABELS, "forward-mb0", "backward-mb0"])
    found, pattern = labels(read_file(mixed, use_cache=False).spans)
    assert pattern == "phase_mb" and found.sort("start").select("phase", "microbatch").rows() == [
        ("forward", 0), ("backward", 0)]


def test_one_gpu_of_ordinary_ranges_is_no_pipeline(tmp_path):
    report = run([shapes.write_named_passes(tmp_path / "plain.json", NOT_LABELS)], Options(), Scale(use_cache=False))
    assert report.pipeline is None and report.stages == []


# --- a 4-stage pipeline in one Nsight export ---

P, MB, F, B = 4, 8, 10_000, 20_000


def ranked(result, stage_of_pid):
    """The file's spans with ``rank`` filled from each span's process, as an export naming its ranks gives."""
    rank = pl.col("pid").replace_strict(stage_of_pid, default=None, return_dtype=pl.Int32)
    return replace(result, spans=result.spans.with_columns(rank=rank))


@pytest.mark.parametrize("with_ranks", [False, True], ids=["processes", "ranks"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_nsight_pipeline_of_four_processes(tmp_path, schedule, with_ranks):
    """p = 4 equal stages (F = 10 µs, B = 20 µs), m = 8: the window is (m + p - 1)(F + B) = 330 µs, each
    stage busy m(F + B) = 240 µs and idle (p - 1)(F + B) = 90 µs, so the bubble is (p - 1)/(m + p - 1) = 3/11
    under GPipe and 1F1B alike; stage s starts s·F after the window opens. Process ids fall as stages rise,
    so only the GPUs' order (or the ranks) puts the stages in pipeline order."""
    sim = simulate(schedule, P, MB, [F] * P, [B] * P)
    path = nsp.write_pipeline(tmp_path / "pipe.sqlite", sim)
    if with_ranks:
        result = ranked(read_file(path, use_cache=False), {nsp.pid_of(s): s for s in range(P)})
        report = of_results([result], Options())
        names = [f"rank{s}" for s in range(P)]
    else:
        report = run([path], Options(), Scale(use_cache=False))
        names = [f"pid{nsp.pid_of(s)}/device{s}" for s in range(P)]
    pipe = report.pipeline
    assert pipe is not None, report.notes
    assert (pipe.stages, pipe.microbatches, pipe.schedule) == (P, MB, schedule)
    assert "micro-batch labels (phase_mb)" in pipe.evidence
    assert pipe.window_ns == (MB + P - 1) * (F + B)
    assert Fraction(sum(s.idle_ns for s in report.stages), P * pipe.window_ns) == Fraction(P - 1, MB + P - 1)
    assert pipe.bubble_fraction == pytest.approx(3 / 11)
    assert [s.name for s in report.stages] == names
    rows = [(s.busy_ns, s.idle_ns, s.fill_ns, s.forward_ns, s.backward_ns, s.microbatches) for s in report.stages]
    assert rows == [(MB * (F + B), (P - 1) * (F + B), s * F, MB * F, MB * B, MB) for s in range(P)]
    # The SendRecv kernels are communication, never compute: comm is the time they run while no pass does.
    assert [s.comm_ns for s in report.stages] == exposed_sendrecv(sim)
    if schedule == "gpipe":  # equal stages: every pass starts the instant its input arrives
        assert all(s.comm_ns == 0 for s in report.stages)


def exposed_sendrecv(sim) -> list[int]:
    """Per stage, |SendRecv ∪ passes| − |passes|, by merging the fixture's intervals (``nsys_fixtures.union``)."""
    compute: dict[int, list] = {s: [] for s in range(P)}
    comm: dict[int, list] = {s: [] for s in range(P)}
    for act in (a for stage in sim.actions for a in stage):
        s, peer = act.stage, act.stage + 1 if act.action.phase == "F" else act.stage - 1
        compute[s].append((act.start_ns, act.end_ns))
        if 0 <= peer < P:
            comm[s].append((act.end_ns - nsp.SEND_NS, act.end_ns))
            comm[peer].append((act.end_ns, act.end_ns + nsp.SEND_NS))
    return [fx.union(compute[s] + comm[s])[0] - fx.union(compute[s])[0] for s in range(P)]


@pytest.mark.parametrize("layout", ["2022", "2023", "2026"])
def test_each_process_thread_is_its_gpus_stage(tmp_path, layout):
    """CUPTI numbers each process's launches from 1, so the same correlation ids recur in every process of
    the export: a thread follows the kernels it launched in its own process, never another's."""
    path = nsp.write_pipeline(tmp_path / "pipe.sqlite", simulate("1f1b", P, MB, [F] * P, [B] * P), layout=layout)
    mapped = assign(read_file(path, use_cache=False).spans)
    assert mapped.names == [f"pid{nsp.pid_of(s)}/device{s}" for s in range(P)]
    threads = mapped.spans.filter(pl.col("device").is_null()).group_by("pid").agg(pl.col("stage").unique())
    assert dict(threads.select("pid", pl.col("stage").list.sort()).rows()) == {
        nsp.pid_of(s): [s] for s in range(P)}
