"""Pipelines as PiPPy's visualiser and torchtitan write them, read with no flag.

PiPPy: one Chrome trace, one thread per stage, each pass a complete event named ``F_{stage},{mb}`` /
``B_{stage},{mb}`` (``W_{stage},{mb}`` for a weight gradient): the label gives stage and micro-batch.
torchtitan: one Kineto file per rank, ``rank{N}_trace.json.gz``, whose actions are torch.distributed.pipelining's
``PP:{stage}{action}{mb}`` ranges: the compute passes ``F``, ``B``, ``W`` around their kernels, the hand-offs
``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B`` around NCCL SendRecv kernels, and FSDP's ``UNSHARD`` before a
stage's first pass (an all-gather and its copy-out) and ``RESHARD`` after its last. Every expectation is worked
out by hand from the simulated schedule: equal stages, so each stage's idle time is the closed form's.
"""

from __future__ import annotations

import gzip
import json
from fractions import Fraction
from pathlib import Path

import pytest
from synth import simulate

from pipebubble.analysis.schedule.schedules import closed_form_bubble_time
from pipebubble.options import Options, Scale
from pipebubble.run import run

US = 1_000
BASE = 1_000_000  # ns: every trace starts here
F, B, W = 10 * US, 20 * US, 10 * US


def report_of(path: Path):
    """The report with no flag at all: default options."""
    return run([path], Options(), Scale(use_cache=False))


def x(cat: str, name: str, start: int, dur: int, pid: int, tid: int, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start / US, "dur": dur / US}
    if args:
        event["args"] = args
    return event


def closed_form(schedule: str, p: int, m: int, weight: bool) -> Fraction:
    """The bubble fraction of equal stages: idle per stage over the window, idle = the closed form's bubble
    time, the window = m (F + B + W) + idle."""
    passes = (F, B, W if weight else 0)
    idle = closed_form_bubble_time(schedule, p, passes=passes)
    return idle / (m * sum(passes) + idle)


# --- PiPPy ---

PIPPY_PID = 0


def pippy_thread(stage: int) -> int:
    """Thread ids fall as stages rise, and are not the stage: only the labels say which stage a thread is."""
    return 40 - 7 * stage


def write_pippy(path: Path, schedule: str, p: int, m: int, weight: bool = False) -> Path:
    """The visualiser's trace: no Kineto header, one process, each pass an X event of category
    ``computation`` (read as an operator) on its stage's thread, named by phase, stage and micro-batch."""
    sim = simulate(schedule, p, m, [F] * p, [B] * p, weight=[W] * p if weight else None)
    events = [{"ph": "M", "name": "thread_name", "pid": PIPPY_PID, "tid": pippy_thread(s),
               "args": {"name": f"stage {s}"}} for s in range(p)]
    for act in (a for stage in sim.actions for a in stage):
        name = f"{act.action.phase}_{act.stage},{act.action.microbatch}"
        events.append(x("computation", name, BASE + act.start_ns, act.end_ns - act.start_ns, PIPPY_PID,
                        pippy_thread(act.stage)))
    path.write_text(json.dumps({"traceEvents": events}))
    return path


@pytest.mark.parametrize(("schedule", "p", "m", "weight"), [
    ("gpipe", 4, 8, False),
    ("1f1b", 4, 8, False),
    ("gpipe", 3, 2, False),
    ("zero_bubble", 4, 8, True),
])
def test_pippy_trace_is_a_pipeline_with_no_flag(tmp_path, schedule, p, m, weight):
    report = report_of(write_pippy(tmp_path / "pippy.json", schedule, p, m, weight))
    pipe = report.pipeline
    assert pipe is not None, report.notes
    assert (pipe.stages, pipe.microbatches, len(pipe.steps)) == (p, m, 1)
    assert pipe.evidence == ["micro-batch labels (pippy)"]
    # The stage is the label's: stage s is the thread whose passes are named F_s,mb, in the labels' order.
    assert [s.name for s in report.stages] == [f"rank0/pid{PIPPY_PID}/tid{pippy_thread(s)}" for s in range(p)]
    per_pass = F + B + (W if weight else 0)
    assert all(s.busy_ns == m * per_pass and s.microbatches == m for s in report.stages)
    assert [s.fill_ns for s in report.stages] == [s * F for s in range(p)]
    if m >= p:  # the closed form holds once the pipeline fills
        assert pipe.schedule == schedule
        expected = closed_form(schedule, p, m, weight)
        assert Fraction(sum(s.idle_ns for s in report.stages), p * pipe.window_ns) == expected
        assert pipe.bubble_fraction == pytest.approx(float(expected))
    else:  # GPipe with m < p: the window is still (m + p - 1)(F + B)
        assert pipe.window_ns == (m + p - 1) * (F + B)
        assert pipe.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    if schedule == "gpipe" and not weight:
        assert pipe.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_pippy_labels_need_their_comma(tmp_path):
    """``F_3`` (no micro-batch) and ``F_0,1x`` are no PiPPy labels: such a file is one thread's work, no
    pipeline."""
    events = [x("computation", name, BASE + 20 * US * i, 10 * US, 0, 1 + i % 2)
              for i, name in enumerate(["F_3", "B_3", "F_0,1x", "xF_0,1"])]
    path = tmp_path / "plain.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert report_of(path).pipeline is None


# --- torchtitan ---

SEND_NS = 2 * US  # a SendRecv kernel's length
UNSHARD_NS = 6 * US  # FSDP's all-gather before a stage's first pass, and its copy-out after it
GEMM_STREAM, FSDP_STREAM = 7, 21
P2P_STREAMS = {("SEND", "F"): 20, ("SEND", "B"): 22, ("RECV", "F"): 24, ("RECV", "B"): 26}


def write_torchtitan(folder: Path, schedule: str, p: int, m: int, weight: bool = False, info: bool = True) -> Path:
    """One gzipped Kineto file per rank, ``rank{N}_trace.json.gz`` (rank N runs stage N), on one GPU each.
    Each action is a ``user_annotation`` range ``PP:{stage}{action}`` on the main thread around the launch of
    its kernels, the CPU ahead of the GPU: a pass's range closes 500 ns before its gemm (stream 7) runs exactly
    as the schedule has it; a send (``SEND_F`` after a forward, ``SEND_B`` after a backward) and the peer's
    receive (``RECV_F``, ``RECV_B``), each a range of its own on the thread, launch a SendRecv kernel (a stream
    for each of the four) that runs SEND_NS from the pass's end, while the receiver's next pass already runs;
    ``UNSHARD`` launches an all-gather and a copy-out kernel ending 1 µs before the stage's first pass,
    ``RESHARD`` (CPU only, as FSDP2 frees memory) follows the last. None of them is compute. Without ``info``
    the files carry no ``distributedInfo``: only their names give the ranks."""
    folder.mkdir(parents=True, exist_ok=True)
    sim = simulate(schedule, p, m, [F] * p, [B] * p, weight=[W] * p if weight else None)
    events: dict[int, list[dict]] = {s: [] for s in range(p)}
    corr = dict.fromkeys(range(p), 0)
    pid = {s: 4000 + s for s in range(p)}

    def action(s: int, name: str, start: int, dur: int, kernels: list[tuple[str, int, int, int]]) -> None:
        """A ``PP:`` range on rank s's main thread from ``start`` for ``dur`` ns, launching (kernel name,
        stream, start, duration) each from a ``cudaLaunchKernel`` inside it."""
        events[s].append(x("user_annotation", f"PP:{s}{name}", start, dur, pid[s], pid[s]))
        for k, (kernel, stream, at, length) in enumerate(kernels):
            corr[s] += 1
            launch = start + 100 * (k + 1)
            events[s] += [
                x("cuda_runtime", "cudaLaunchKernel", launch, 50, pid[s], pid[s], correlation=corr[s]),
                x("kernel", kernel, at, length, 0, stream, correlation=corr[s], device=0, stream=stream),
            ]

    for s, acts in enumerate(sim.actions):
        first = BASE + min(a.start_ns for a in acts)
        last = BASE + max(a.end_ns for a in acts)
        gather = first - US - UNSHARD_NS
        action(s, "UNSHARD", gather - 1000, UNSHARD_NS // 2, [
            ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", FSDP_STREAM, gather,
             UNSHARD_NS // 2),
            ("void at::native::split_with_sizes_copy_out_contiguous_no_cast_kernel<4>(char**, long*)",
             GEMM_STREAM, gather + UNSHARD_NS // 2, UNSHARD_NS // 2),
        ])
        action(s, "RESHARD", last + US, US, [])
        events[s].append(x("cpu_op", "ProfilerStep#3", gather - 2 * US, last + 3 * US - gather, pid[s], pid[s]))
    for act in (a for stage in sim.actions for a in stage):
        s, a = act.stage, act.action
        start, end = BASE + act.start_ns, BASE + act.end_ns
        action(s, f"{a.phase}{a.microbatch}", start - 1000, 500, [(f"gemm_{a.phase}", GEMM_STREAM, start, end - start)])
        peer = s + 1 if a.phase == "F" else s - 1 if a.phase == "B" else None
        if peer is None or not 0 <= peer < p:
            continue
        kernel = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
        for k, (who, verb) in enumerate(((s, "SEND"), (peer, "RECV"))):
            at = end - 450 + 100 * (2 * k + (a.phase == "B"))  # one rank may send and receive at once
            action(who, f"{verb}_{a.phase}{a.microbatch}", at, 50, [(kernel, P2P_STREAMS[verb, a.phase], end, SEND_NS)])
    for s in range(p):
        doc = {"schemaVersion": 1, "traceEvents": events[s]}
        if info:
            doc["distributedInfo"] = {"rank": s, "world_size": p, "backend": "nccl"}
        with gzip.open(folder / f"rank{s}_trace.json.gz", "wt") as out:
            json.dump(doc, out)
    return folder


@pytest.mark.parametrize(("schedule", "p", "m", "weight"), [
    ("gpipe", 4, 8, False),
    ("1f1b", 4, 8, False),
    ("zero_bubble", 4, 8, True),
])
def test_torchtitan_rank_files_are_a_pipeline_with_no_flag(tmp_path, schedule, p, m, weight):
    report = report_of(write_torchtitan(tmp_path / "iteration_3", schedule, p, m, weight))
    pipe = report.pipeline
    assert pipe is not None, report.notes
    assert (pipe.stages, pipe.microbatches, pipe.schedule, len(pipe.steps)) == (p, m, schedule, 1)
    assert "micro-batch labels (torch_pipelining)" in pipe.evidence
    assert [s.name for s in report.stages] == [f"rank{s}" for s in range(p)]
    per_pass = F + B + (W if weight else 0)
    # Sends, receives and FSDP's unshard are no compute: each stage's busy time is its passes alone, and
    # the window runs from stage 0's first forward to its last backward.
    assert [s.busy_ns for s in report.stages] == [m * per_pass] * p
    assert [(s.forward_ns, s.backward_ns, s.weight_ns, s.microbatches) for s in report.stages] == [
        (m * F, m * B, m * W if weight else 0, m)] * p
    assert [s.fill_ns for s in report.stages] == [s * F for s in range(p)]
    expected = closed_form(schedule, p, m, weight)
    assert pipe.window_ns == m * per_pass + closed_form_bubble_time(schedule, p, passes=(F, B, W if weight else 0))
    assert Fraction(sum(s.idle_ns for s in report.stages), p * pipe.window_ns) == expected
    assert pipe.bubble_fraction == pytest.approx(float(expected))
    # The hand-offs are point-to-point operations, paired send with receive.
    assert pipe.p2p is not None and pipe.p2p["pairs"] == 2 * m * (p - 1)


@pytest.mark.parametrize("info", [True, False], ids=["distributed-info", "file-names"])
def test_torchtitan_gpipe_bubble_is_the_closed_form(tmp_path, info):
    """GPipe, p = 4, m = 4: (p - 1)/(m + p - 1) = 3/7, the ranks from ``distributedInfo`` or from the files'
    names alone."""
    report = report_of(write_torchtitan(tmp_path / "t", "gpipe", 4, 4, info=info))
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.schedule) == (4, 4, "gpipe")
    assert [s.name for s in report.stages] == [f"rank{s}" for s in range(4)]
    assert pipe.bubble_fraction == pytest.approx(3 / 7)
