"""The finding kinds of copies, streams, kernels and start-up (``analysis/findings``: ``copies``, ``streams``,
``kernels``, ``warmup``, ``framework``): synthetic Kineto traces of each shape analysed as a user would
(``run``), each worth computed by hand; then the real traces that hold the shapes, each figure checked against
a short script over the raw events (gzip + json, sqlite3), not pipebubble's code."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from synth import _x

from pipebubble.analysis.findings import findings
from pipebubble.analysis.findings.framework import comm_action, comm_frameworks, framework, launch_action
from pipebubble.options import Options, Scale
from pipebubble.report import Breakdown, CallStat, Host, KernelStat, Report
from pipebubble.report.breakdown import Facts, StreamStat, ThreadCall
from pipebubble.report.names import short_name
from pipebubble.run import run
from tests.conftest import shared

US = 1_000
MS = 1_000_000
MINE = ("exposed_copy", "comm_on_compute_stream", "tiny_kernels", "layout_conversion", "warmup_profile")


def gpu_row(lane: str, step_: int | None, window: int, idle: int, causes: dict[str, int]) -> Breakdown:
    """One GPU's breakdown row (ms): all its busy time compute."""
    return Breakdown(lane, 0, None, 0, step_, 0, window * MS, (window - idle) * MS, 0, 0, 0, 0, idle * MS,
                     {k: v * MS for k, v in causes.items()})


def analyse(*paths: Path) -> Report:
    return run(list(paths), Options(), Scale(use_cache=False, workers=1))


def by_kind(report: Report) -> dict:
    return {f.kind: f for f in report.findings}


def write(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def launched(events: list, corr: int, cat: str, name: str, at_us: float, start_us: float, dur_us: float,
             stream: int = 7, call: str = "cudaLaunchKernel", call_us: float = 5) -> int:
    """A GPU operation on device 0 and its launch call on the host thread (pid 1, tid 1); the next id."""
    events += [_x("cuda_runtime", call, 1, 1, round(at_us * US), round(call_us * US), corr),
               _x(cat, name, 0, stream, round(start_us * US), round(dur_us * US), corr)]
    return corr + 1


def step(events: list, k: int, start_us: float, dur_us: float) -> None:
    events.append(_x("user_annotation", f"ProfilerStep#{k}", 1, 1, round(start_us * US), round(dur_us * US)))


# -- exposed_copy -------------------------------------------------------------------------------------------


def pageable_job(path: Path) -> Path:
    """Three 1,000 µs steps of a job streaming its weights from pageable memory: each step copies host to
    device for 880 µs (the host blocked in the copy), then runs a 40 µs kernel and a 20 µs memset."""
    events, corr = [], 1
    for k in range(3):
        t = 1000 * k
        step(events, k, t, 1000)
        corr = launched(events, corr, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", t, t + 10, 880,
                        call="cudaMemcpyAsync", call_us=895)
        corr = launched(events, corr, "kernel", "gemm", t + 900, t + 910, 40)
        corr = launched(events, corr, "gpu_memset", "Memset (Device)", t + 950, t + 955, 20, call="cudaMemsetAsync")
    return write(path, events)


def test_a_job_mostly_of_pageable_copies_opens_with_exposed_copy(tmp_path):
    report = analyse(pageable_job(tmp_path / "pageable.json"))
    top = report.findings[0]
    assert top.kind == "exposed_copy" and top.where.gpus == ["rank0/gpu0"]
    # exposed memory a step: the copy (880) and the memset (20), under no compute; the copies' share of the
    # memory time is 880 / 900: 880 µs a step
    assert top.worth_ns == 880 * US
    assert top.evidence["memory_exposed_ns"] == 900 * US
    assert top.evidence["by_direction"] == {"HtoD pageable": {"count": 3, "total_ns": 3 * 880 * US}}
    assert top.evidence["pageable_share"] == 1.0 and top.evidence["bytes"] is None
    assert top.evidence["hideable_ns"] == 40 * US  # the compute beside the copies bounds what overlap hides
    assert "HtoD from pageable memory" in top.title and "pin_memory=True" in top.action
    assert "non_blocking=True" in top.action and "resident" in top.action


def test_copy_actions_follow_the_direction_and_host_memory():
    rows = [gpu_row("rank0/gpu0", None, 100, idle=10, causes={})]
    rows = [replace(rows[0], memory_ns=80 * MS, memory_exposed_ns=80 * MS, compute_ns=10 * MS)]

    def copy(*stats: tuple[str, str, int]):
        streams = [StreamStat("rank0/gpu0", 7, kind, tag, 4, ms * MS) for kind, tag, ms in stats]
        return {f.kind: f for f in findings(Report(breakdown=rows, host=Host(facts=Facts(streams=streams))))}

    pinned = copy(("memcpy", "HtoD pinned", 60), ("memset", None, 20))["exposed_copy"]
    assert pinned.worth_ns == 60 * MS  # 80 ms exposed, three quarters of the memory time copies
    assert "already come from pinned memory" in pinned.action and "pin_memory=True" not in pinned.action
    back = copy(("memcpy", "DtoH pageable", 50), ("memcpy", "DtoD", 30))["exposed_copy"]
    assert "mostly DtoH to pageable memory (62% of copy time)" in back.title and "read results back" in back.action
    assert back.evidence["pageable_share"] == 50 / 80


# -- warmup_profile -----------------------------------------------------------------------------------------


def warmup_job(path: Path) -> Path:
    """Two steps: the first holds start-up (cudaFree 3 ms, cuModuleLoadData 1 ms, cudaMalloc 0.5 ms) between
    two kernels; the second only runs a kernel."""
    events, corr = [], 1
    step(events, 0, 0, 6000)
    corr = launched(events, corr, "kernel", "init_kernel", 0, 6, 50)
    events += [_x("cuda_runtime", "cudaFree", 1, 1, 60 * US, 3000 * US),
               _x("cuda_driver", "cuModuleLoadData", 1, 1, 3060 * US, 1000 * US),
               _x("cuda_runtime", "cudaMalloc", 1, 1, 4060 * US, 500 * US)]
    corr = launched(events, corr, "kernel", "gemm", 4560, 4570, 1400)
    step(events, 1, 6000, 1500)
    launched(events, corr, "kernel", "gemm", 6000, 6010, 1480)
    return write(path, events)


def test_a_warm_up_profile_says_so_first(tmp_path):
    report = analyse(warmup_job(tmp_path / "warmup.json"))
    top = report.findings[0]
    assert top.kind == "warmup_profile"
    # 4.5 ms of start-up calls inside the GPU window, over 2 profiled steps
    assert top.worth_ns == 4500 * US // 2
    assert top.evidence["startup_ns"] == 4500 * US and top.evidence["leads"]
    assert top.worth_gpu_ns == 0  # start-up happens once: a steady step is no shorter for it
    assert top.evidence["calls"]["cudaFree"] == {"count": 1, "total_ns": 3000 * US, "inside_ns": 3000 * US}
    assert "mostly start-up" in top.title and "cudaFree 3.0 ms" in top.title
    assert "torch.profiler.schedule(wait=1, warmup=1, active=3)" in top.action
    from pipebubble.render.sections.findings import summary

    assert "start-up first, then biggest;" in summary(report)


def test_start_up_calls_lead_only_when_they_fill_the_step():
    rows = [gpu_row("rank0/gpu0", None, 100, idle=40, causes={"launch": 30, "allocator": 10})]
    calls = [ThreadCall("rank0/pid1/tid1", "cuModuleLoadData", 2, 20 * MS, 20 * MS),
             ThreadCall("rank0/pid1/tid1", "cudaMalloc", 4, 5 * MS, 5 * MS),
             ThreadCall("rank0/pid1/tid2", "cudaMalloc", 1, 9 * MS, 9 * MS)]
    found = {f.kind: f for f in findings(Report(breakdown=rows, host=Host(facts=Facts(calls=calls))))}
    warm = found["warmup_profile"]
    assert warm.worth_ns == 25 * MS and not warm.evidence["leads"]  # thread tid1: 20 + 5 of a 100 ms window
    assert warm.where.ranks == [0] and warm.evidence["thread"] == "rank0/pid1/tid1"
    assert findings(Report(breakdown=rows, host=Host(facts=Facts(calls=calls))))[0].kind != "warmup_profile"
    # allocations alone are start-up only where they fill half the step (else the allocator's idle says it)
    alloc = [ThreadCall("rank0/pid1/tid1", "cudaMalloc", 4, 30 * MS, 30 * MS)]
    kinds = {f.kind for f in findings(Report(breakdown=rows, host=Host(facts=Facts(calls=alloc))))}
    assert "warmup_profile" not in kinds
    alloc = [ThreadCall("rank0/pid1/tid1", "cudaFree", 4, 60 * MS, 55 * MS)]
    found = findings(Report(breakdown=rows, host=Host(facts=Facts(calls=alloc))))
    assert found[0].kind == "warmup_profile" and found[0].worth_ns == 55 * MS and found[0].evidence["leads"]


# -- comm_on_compute_stream ---------------------------------------------------------------------------------


def comm_job(path: Path, comm_stream: int) -> Path:
    """Two 1,000 µs steps on one GPU: 600 µs of compute, then a 300 µs all-reduce on ``comm_stream``, and a
    100 µs all-reduce on stream 20 under the compute."""
    events, corr = [], 1
    for k in range(2):
        t = 1000 * k
        step(events, k, t, 1000)
        corr = launched(events, corr, "kernel", "gemm", t, t + 6, 600)
        corr = launched(events, corr, "kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", t + 10,
                        t + 606, 300, stream=comm_stream)
        corr = launched(events, corr, "kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)", t + 20,
                        t + 100, 100, stream=20)
    events.append(_x("user_annotation", "DistributedDataParallel.forward", 1, 1, 0, 1900 * US))
    return write(path, events)


def test_communication_on_the_compute_stream(tmp_path):
    found = by_kind(analyse(comm_job(tmp_path / "same.json", comm_stream=7)))["comm_on_compute_stream"]
    # per step 300 µs of all-reduce on stream 7 (the compute stream), all of it exposed
    assert found.worth_ns == 300 * US
    assert found.evidence["compute_streams"]["rank0/gpu0"] == {
        "stream": 7, "compute_ns": 1200 * US, "comm_ns": 600 * US, "comm_share": 600 / 800}
    assert "rank0/gpu0 stream 7" in found.title and "async_op=True" in found.action
    assert "DDP" in found.action  # the job is DDP's and runs all-reduce
    assert found.evidence["frameworks"] == {"ddp": ["DistributedDataParallel.forward"]}
    assert "comm_on_compute_stream" not in by_kind(analyse(comm_job(tmp_path / "side.json", comm_stream=30)))


# -- tiny_kernels -------------------------------------------------------------------------------------------


def tiny_job(path: Path, graphs: bool = False) -> Path:
    """One step: 40 kernels of 5 µs launched every 40 µs (35 µs idle between each two), then a 300 µs
    kernel after an 80 µs gap; with ``graphs``, a cudaGraphLaunch before them."""
    events, corr = [], 1
    step(events, 0, 0, 2000)
    for k in range(40):
        corr = launched(events, corr, "kernel", "vectorized_elementwise_kernel", 40 * k, 40 * k + 6, 5)
    corr = launched(events, corr, "kernel", "gemm", 1600, 1641, 300)
    if graphs:
        events.append(_x("cuda_runtime", "cudaGraphLaunch", 1, 1, 1950 * US, 10 * US, corr))
    return write(path, events)


def test_tiny_kernels_worth_the_idle_between_them(tmp_path):
    found = by_kind(analyse(tiny_job(tmp_path / "tiny.json")))["tiny_kernels"]
    assert found.worth_ns == 39 * 35 * US  # the 39 gaps between tiny kernels; not the one before the gemm
    assert (found.evidence["tiny_kernels"], found.evidence["kernels"]) == (40, 41)
    assert found.evidence["tiny_share_of_kernel_time"] == pytest.approx(200 / 500)
    assert found.title.startswith("40 of 41 kernels run under 10 µs") and "CUDA graphs" in found.action
    graphed = by_kind(analyse(tiny_job(tmp_path / "graphs.json", graphs=True)))["tiny_kernels"]
    assert "already replays CUDA graphs" in graphed.action


# -- layout_conversion --------------------------------------------------------------------------------------

NCHW2NHWC = ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
             "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)")


def layout_job(path: Path) -> Path:
    """One 1,100 µs step: ten times a 20 µs nchwToNhwc conversion then a 60 µs convolution, each launched by a
    10 µs call, 20 µs idle after each pair."""
    events, corr = [], 1
    step(events, 0, 0, 1100)
    for k in range(10):
        t = 100 * k
        corr = launched(events, corr, "kernel", NCHW2NHWC, t, t + 10, 20, call_us=10)
        corr = launched(events, corr, "kernel", "implicit_convolve_sgemm", t + 12, t + 30, 60, call_us=10)
    return write(path, events)


def test_layout_conversions_worth_their_time_where_the_gpu_is_busy(tmp_path):
    found = by_kind(analyse(layout_job(tmp_path / "layout.json")))["layout_conversion"]
    # the step holds 800 µs of work in 1,100 µs: busy share 8/11; conversions: 200 µs of GPU time and 10
    # launches of 10 µs; worth = 200 x 8/11 + 10 x 10 x 3/11
    assert found.worth_ns == round(200 * US * 8 / 11 + 10 * 10 * US * 3 / 11)
    assert found.evidence["per_step"] == {"count": 10, "gpu_ns": 200 * US, "busy_share": pytest.approx(8 / 11)}
    assert found.evidence["conversions"] == 10
    assert found.title.startswith("layout conversions (nchwToNhwcKernel): 10 kernels and 0.2 ms of GPU time a step")
    assert "channels_last" in found.action


# -- framework ----------------------------------------------------------------------------------------------


def kernel(name: str, kind: str = "compute") -> KernelStat:
    return KernelStat(short_name(name), name, kind, 1, 1, 1.0, 1.0, 1, 1, 0.0, 0.1)


def test_framework_from_names():
    host = Host(api=[CallStat("cudaGraphLaunch", 10, 100, 10.0, 10)],
                ranges=[CallStat("DistributedDataParallel.forward", 1, 10, 10.0, 10)],
                facts=Facts(calls=[ThreadCall("rank0/pid1/tid1", "FSDP::all_gather", 2, 1, 1),
                                   ThreadCall("rank0/pid1/tid1", "nccl:all_to_all", 2, 1, 1)]))
    report = Report(host=host, kernels=[kernel("void fbgemm_gpu::permute_2D_lengths_kernel<int>(int)"),
                                        kernel("ncclDevKernel_SendRecv(ncclDevKernelArgs)", "comm")])
    assert framework(report) == {"cuda_graphs", "ddp", "fsdp", "torchrec", "all_to_all"}
    assert framework(Report()) == set()
    # only the all-to-all runs: no all-reduce or all-gather kernels, so no DDP or FSDP advice
    assert comm_frameworks(report) == {"cuda_graphs", "torchrec", "all_to_all"}
    assert "TrainPipelineSparseDist" in comm_action({"torchrec", "all_to_all"})
    assert "expert" not in comm_action({"torchrec", "all_to_all"}) and "expert" in comm_action({"all_to_all"})
    assert "bucket" in comm_action({"ddp"}) and "async_op=True" in comm_action(set())
    assert "already replays CUDA graphs" in launch_action({"cuda_graphs"})
    assert "torch.compile" in launch_action(set())
    # a kernel merely named with a transpose parameter is no conversion; a tensor-parallel pair is no FSDP
    tp = Report(kernels=[kernel("ncclDevKernel_AllGather_RING_LL(x)", "comm"),
                         kernel("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(x)", "comm")])
    assert framework(tp) == set()


def test_facts_round_trip_through_json():
    facts = Facts(streams=[StreamStat("rank0/gpu0", 7, "memcpy", "HtoD pageable", 3, 30, 0, 0)],
                  calls=[ThreadCall("rank0/pid1/tid1", "cudaFree", 1, 5, 4)])
    report = Report(host=Host(facts=facts))
    assert Report.from_dict(json.loads(json.dumps(report.to_dict()))) == report
    assert Report.from_dict({"host": {"api": []}}).host.facts == Facts()  # a report saved before facts


# -- real traces: each figure against a script over the raw events ------------------------------------------

NCCL = re.compile(r"(?i)^(void )?(nccl|rccl)|AllReduce|ReduceScatter|AllGather|SendRecv")
LAYOUT = re.compile(r"nchwToNhwc|nhwcToNchw")
LAUNCH = re.compile(r"^cudaLaunchKernel")


def raw(path: Path) -> tuple[list[tuple], list[tuple], list[tuple]]:
    """(device, start, end, name, class) of a Kineto file's GPU operations, (start, end, name) of its runtime
    calls, its ProfilerStep ranges; times in ns."""
    events = json.load(gzip.open(path))["traceEvents"]
    ops, calls, steps = [], [], []
    for e in events:
        if e.get("ph") != "X":
            continue
        start = round(float(e["ts"]) * 1000)
        end = start + round(float(e.get("dur", 0)) * 1000)
        cat = e.get("cat", "")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            cls = "copy" if cat != "kernel" else "comm" if NCCL.search(e["name"]) else "compute"
            ops.append((e["pid"], start, end, e["name"], cls))
        elif cat == "cuda_runtime":
            calls.append((start, end, e["name"]))
        elif cat == "user_annotation" and e["name"].startswith("ProfilerStep#"):
            steps.append((start, end))
    return ops, calls, sorted(steps)


def merged(intervals) -> list[list[int]]:
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def inside(intervals, lo: int, hi: int) -> int:
    return sum(max(0, min(e, hi) - max(s, lo)) for s, e in intervals)


def tiny_gaps(ops) -> list[tuple[int, int]]:
    """Gaps of the busy union between two kernels under 10 µs, each at most 1 ms."""
    tiny = [o[4] != "copy" and o[2] - o[1] < 10_000 for o in ops]
    order = sorted(range(len(ops)), key=lambda i: (ops[i][1], ops[i][2]))
    gaps, reach, last = [], None, None
    for i in order:
        if reach is not None and ops[i][1] > reach and tiny[i] and tiny[last] and ops[i][1] - reach <= 1_000_000:
            gaps.append((reach, ops[i][1]))
        if reach is None or ops[i][2] > reach:
            reach, last = ops[i][2], i
    return gaps


def per_step_on_busiest(ops, steps, figure) -> float:
    """The mean over ProfilerSteps of ``figure(device ops, lo, hi)`` on the step's busiest device."""
    values = []
    for lo, hi in steps:
        devices = {o[0] for o in ops}
        busy = {d: inside(merged((o[1], o[2]) for o in ops if o[0] == d), lo, hi) for d in devices}
        d = max(devices, key=busy.get)
        values.append(figure([o for o in ops if o[0] == d], lo, hi))
    return statistics.mean(values)


def test_resnet_ddp_layout_conversions_as_counted_from_the_trace():
    path = shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")
    ops, calls, steps = raw(path)
    launch = statistics.mean(e - s for s, e, name in calls if LAUNCH.match(name))

    def conversions(device_ops, lo, hi):
        mine = [o for o in device_ops if LAYOUT.search(o[3].split("(")[0]) and lo <= o[1] < hi]
        share = inside(merged((o[1], o[2]) for o in device_ops), lo, hi) / (hi - lo)
        g, n = sum(o[2] - o[1] for o in mine), len(mine)
        return g * share + n * launch * (1 - share)

    found = by_kind(analyse(path))["layout_conversion"]
    assert found.evidence["conversions"] == sum(1 for o in ops if LAYOUT.search(o[3].split("(")[0])) == 633
    assert found.worth_ns == pytest.approx(per_step_on_busiest(ops, steps, conversions), rel=0.01)
    assert found.evidence["per_step"]["count"] == 211  # 633 over three steps


@pytest.mark.parametrize("name", ["resnet_ddp_a100_nccl_rank0.json.gz", "recsys_128rank_sampled_rank-0.json.gz",
                                  "recsys_128rank_sampled_rank-1.json.gz"])
def test_tiny_kernels_as_counted_from_the_trace(name):
    path = shared("kineto", name)
    ops, _, steps = raw(path)
    kernels = [o for o in ops if o[4] != "copy"]
    expected = per_step_on_busiest(ops, steps, lambda device_ops, lo, hi: inside(tiny_gaps(device_ops), lo, hi))
    found = by_kind(analyse(path))["tiny_kernels"]
    assert found.evidence["tiny_kernels"] == sum(1 for o in kernels if o[2] - o[1] < 10_000)
    assert found.evidence["kernels"] == len(kernels)
    assert found.worth_ns == pytest.approx(expected, rel=0.01)


def test_two_recsys_ranks_read_on_the_gpu_with_the_most_work():
    """Each rank's figures are its own file's; the finding reads the GPU with the most work over both steps."""
    paths = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    work, gaps = {}, {}
    for path in paths:
        ops, _, steps = raw(path)
        device = ops[0][0]
        work[device] = sum(inside(merged((o[1], o[2]) for o in ops), lo, hi) for lo, hi in steps)
        gaps[device] = statistics.mean(inside(tiny_gaps(ops), lo, hi) for lo, hi in steps)
    found = by_kind(analyse(*paths))["tiny_kernels"]
    busiest = max(work, key=work.get)
    assert found.where.gpus == [f"rank{busiest}/gpu{busiest}"]
    assert found.worth_ns == pytest.approx(gaps[busiest], rel=0.01)


def test_torchrun_nccl_on_the_compute_stream_as_counted_from_the_export():
    path = shared("nsys", "torchrun_2xh100_nccl.sqlite")
    db = sqlite3.connect(path)
    rows = db.execute("SELECT k.deviceId, k.streamId, s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k"
                      " JOIN StringIds s ON s.id = k.shortName").fetchall()
    compute, comm = {}, {}
    for device, stream, name, dur in rows:
        into = comm if NCCL.search(name) else compute
        into[(device, stream)] = into.get((device, stream), 0) + dur
    main = {d: max((k for k in compute if k[0] == d), key=compute.get) for d, _ in compute}
    on_main = {d: comm.get(main[d], 0) for d in main}  # the whole window is the step: no ProfilerSteps
    found = by_kind(analyse(path))["comm_on_compute_stream"]
    assert all(on_main.values()) and found.worth_ns == min(on_main.values()) == 8_229_100
    assert framework(analyse(path)) >= {"fsdp", "all_to_all"}
    assert "all-gather" not in found.action and "all-to-all" in found.action  # the exposed collective is all-to-all


def test_a_kernels_first_launch_is_start_up_not_launch_overhead():
    """mi250: one hipLaunchKernel of 6.54 ms (the median launch takes 5.6 µs) while the GPU waits: the kernel's
    first launch loading its code. old_category: one cudaLaunchKernel of 1.41 ms (median 12 µs). Both are
    start-up, first among the findings; what launches cost otherwise stays small."""
    for name, worth in (("kineto/mi250_rocm_toy_train.json.gz", 6_548_604),
                        ("kineto/old_category_names_inference.json.gz", 1_398_000)):
        found = analyse(shared(*name.split("/"))).findings
        assert found[0].kind == "warmup_profile" and found[0].worth_ns == worth, name
        assert "aunchKernel" in found[0].title and found[0].worth_gpu_ns == 0
        assert all(f.worth_ns < worth // 10 for f in found if f.kind == "launch_bound"), name


def test_no_real_trace_is_a_warm_up_profile_or_copy_bound():
    """None of the other shared traces profiles start-up, and none exposes copies for 1 % of a step (largest:
    the torchrun export's 2.8 ms of copies under no compute in its 300 ms window, 0.95 %)."""
    for name in ("kineto/resnet_ddp_a100_nccl_rank0.json.gz", "kineto/resnet_v100_ns_resolution.json.gz",
                 "inference/sglang_qwen3_8b_prefill_decode.json.gz", "nsys/torchrun_2xh100_nccl.sqlite"):
        kinds = set(by_kind(analyse(shared(*name.split("/")))))
        assert not kinds & {"warmup_profile", "exposed_copy"}, name
