"""Label shapes written as Kineto files: passes that are work spans on one thread per stage, DualPipe's per-layer
labels over DeepEP kernels, and kernels named like DeepEP's, NVSHMEM's and look-alikes.

Times are given in ns and written in µs, as Kineto writes them; every GPU kernel is launched by a
``cudaLaunchKernel`` whose correlation id it shares.
"""

from __future__ import annotations

import json
from pathlib import Path

from synth import simulate

US = 1_000
BASE = 1_000_000  # ns: the traces start here
MAIN = 100  # pid (and the main thread's tid) of the traced process
PASS_REGEX = r"^(?P<phase>[FB])_\d+,(?P<mb>\d+)$"


def x(cat: str, name: str, start: int, dur: int, pid: int = MAIN, tid: int = MAIN, **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start / US, "dur": dur / US}
    if args:
        event["args"] = args
    return event


def write(path: Path, events: list[dict], rank: int = 0, world: int = 1) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"rank": rank, "world_size": world, "backend": "nccl"}
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": info, "traceEvents": events}))
    return path


def thread_of(stage: int) -> int:
    """Stage s runs on thread 300 - 10 s: thread ids fall as stages rise, so only the order in which the
    threads start their first pass puts the stages in pipeline order."""
    return 300 - 10 * stage


# --- (a) passes that are work spans, one thread per stage, one process ---


def write_passes_as_work(path: Path, p: int = 4, m: int = 4, forward: int = 10 * US, backward: int = 20 * US,
                         kind: str = "cpu_op") -> Path:
    """GPipe over ``p`` stages and ``m`` micro-batches whose passes are the work spans themselves, named
    ``F_{stage},{mb}`` / ``B_{stage},{mb}``: CPU operators on the stage's thread (``kind`` cpu_op, each holding a
    nested ``aten::mm``), or kernels on stream 7 + stage launched from the stage's thread (``kind`` kernel).
    The main thread holds the ProfilerStep and an unlabelled operator: it is no stage.

    With F = 10 µs and B = 20 µs (p = m = 4), the window is (m + p - 1)(F + B) = 210 µs; each stage is busy
    m(F + B) = 120 µs and idle 90 µs; stage s starts its first forward s·F after the window opens."""
    sim = simulate("gpipe", p, m, [forward] * p, [backward] * p)
    end = max(a.end_ns for stage in sim.actions for a in stage)
    events = [x("cpu_op", "ProfilerStep#1", BASE - 5 * US, end + 10 * US),
              x("cpu_op", "aten::zeros", BASE - 4 * US, US)]
    for i, act in enumerate(a for stage in sim.actions for a in stage):
        name = f"{act.action.phase}_{act.stage},{act.action.microbatch}"
        start, dur, tid = BASE + act.start_ns, act.end_ns - act.start_ns, thread_of(act.stage)
        if kind == "cpu_op":
            nested = x("cpu_op", "aten::mm", start + US, dur - 2 * US, tid=tid)
            events += [x("cpu_op", name, start, dur, tid=tid), nested]
        else:
            stream = 7 + act.stage
            events += [
                x("cuda_runtime", "cudaLaunchKernel", start - US, US // 2, tid=tid, correlation=i + 1),
                x("kernel", name, start, dur, pid=0, tid=stream, correlation=i + 1, device=0, stream=stream),
            ]
    return write(path, events)


# --- (b) DualPipe labels over DeepEP kernels ---

#: (part, phase, µs) of one layer's forward, backward, and of an overlapped pair in the order DeepSeek's
#: training trace runs them (a backward combine first, the forward combine last).
FORWARD = (("attn", "F", 4), ("dispatch", "F", 2), ("mlp", "F", 4), ("combine", "F", 2))
BACKWARD = (("combine", "B", 2), ("mlp", "B", 6), ("mlp", "W", 2), ("dispatch", "B", 2), ("attn", "B", 6),
            ("attn", "W", 2))
PAIR = (("combine", "B", 2), ("attn", "F", 4), ("mlp", "B", 6), ("dispatch", "F", 2), ("dispatch", "B", 2),
        ("mlp", "W", 2), ("mlp", "F", 4), ("attn", "B", 6), ("attn", "W", 2), ("combine", "F", 2))
DEEPEP = {
    "dispatch": "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*)",
    "combine": "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*)",
}
COMPUTE = {"attn": "void flash::compute_attn_ws<Flash_fwd_kernel_traits<192, 128>>(Flash_fwd_params)",
           "mlp": "void deep_gemm::fp8_gemm_kernel<128, 7168>(__nv_bfloat16*, float*)"}
#: Each rank's chunks: (range name, start µs, parts). Stage 0: forward 0 alone, forward 1 overlapped with
#: backward 0, backward 1 alone after a wait; stage 1 the same 12 µs later, its backward 1 right after.
SCHEDULE = {
    0: (("warmup", 0, FORWARD), ("1F1B", 12, PAIR), ("cooldown", 64, BACKWARD)),
    1: (("warmup", 12, FORWARD), ("1F1B", 24, PAIR), ("cooldown", 56, BACKWARD)),
}
ONE_PAIR = {0: (("1F1B", 0, PAIR),), 1: (("1F1B", 8, PAIR),)}
#: One pair a step, two steps: ProfilerStep ranges (start, µs) hold one pair each.
TWO_STEPS = {0: (("1F1B", 0, PAIR), ("1F1B", 50, PAIR)), 1: (("1F1B", 8, PAIR), ("1F1B", 58, PAIR))}
STEPS = ((-2, 48), (48, 52))


def write_dualpipe(folder: Path, schedule: dict = SCHEDULE, upper: bool = False,
                   steps: tuple[tuple[int, int], ...] = ((-2, 100),)) -> Path:
    """One Kineto file per rank (stage): DualPipe labels ``attn(F)`` ... (``ATTN(F)`` with ``upper``, as
    Megatron-core writes them) on the main thread, each chunk under its range, each label launching one
    kernel that runs exactly as long: compute on stream 7, DeepEP's dispatch and combine on stream 27.

    SCHEDULE by hand (µs): a forward is 8 compute + 4 comm, a backward 12 backward + 4 weight + 4 comm, a pair
    both. Stage 0 computes 48 of the window 0-84 (idle 36, comm 16); stage 1 computes 48 from 12 to 76
    (fill 12, drain 8, idle 36, comm 16); each stage runs forward 16, backward 24, weight 8."""
    for rank, chunks in schedule.items():
        events = [x("cpu_op", f"ProfilerStep#{k + 1}", BASE + at * US, dur * US) for k, (at, dur) in enumerate(steps)]
        corr = rank * 1000
        for range_name, at, parts in chunks:  # a chunk named None has no range around it
            t = BASE + at * US
            if range_name is not None:
                events.append(x("user_annotation", range_name, t, sum(d for _, _, d in parts) * US))
            for part, phase, dur in parts:
                corr += 1
                label = f"{part.upper() if upper else part}({phase})"
                kernel, stream = (DEEPEP[part], 27) if part in DEEPEP else (COMPUTE[part], 7)
                events += [
                    x("user_annotation", label, t, dur * US),
                    x("cuda_runtime", "cudaLaunchKernel", t, US // 2, correlation=corr),
                    x("kernel", kernel, t, dur * US, pid=0, tid=stream, correlation=corr, device=0, stream=stream),
                ]
                t += dur * US
        write(folder / f"rank{rank}.json", events, rank=rank, world=len(schedule))
    return folder


# --- (c) kernels that are communication, and look-alikes that are not ---

COMM_KERNELS = (
    "void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int)",
    "void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int, int)",
    "void deep_ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, void*)",
    "void deep_ep::internode::cached_notify(int, int, int, int, int, int, int, int*)",
    "void deep_ep::internode::combine<__nv_bfloat16, 4, 8, 4, 16, 24>(int4*, float*, bool const*)",
    "void deep_ep::internode_ll::dispatch<true, 3, 10, 7168>(void*, float*, int*, long*, int*)",
    "void deep_ep::internode_ll::clean_low_latency_buffer<256>(int*, int, int*, int)",
    "void deep_ep::elastic::hybrid_dispatch_impl<false, true, 24, 4, 8, 8>(void*, float*)",
    "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, void*)",
    "void dpsk::ep::internode::combine_ll<true, 3, 10, 7168>(void*, void*, int*)",
    "void nvshmemi_proxy_rma_entrypoint<(nvshmemi_op_t)0, 1>(void*, void*, rma_bytesdesc_t, int)",
    "void nvshmemi_int_wait_until_on_stream_kernel(int volatile*, int, int)",
)
COMPUTE_KERNELS = (
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)",
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*)",
    "void deep_ep::elastic::dispatch_copy_epilogue_impl<false, false, true, 24>(void*, void*)",
    "void deep_ep::elastic::combine_reduce_epilogue_impl<false, true, 24, 32>(__nv_bfloat16*, float*)",
    "void cdpsk::ep::DeviceScanKernel<cub::DeviceScanPolicy<int>, int*, int*>(int*, int*, int)",
    "void cub::DeviceRadixSortOnesweepKernel<deep_ep::internode::SourceMeta, int>(int*, int*)",
    "void moe_combine_kernel<__nv_bfloat16>(__nv_bfloat16*, float const*, int const*)",
    "void vllm::moe::moe_align_block_size_kernel<int>(int const*, int*, int*)",
    "fused_moe_dispatch_tokens",
    "void my_gemm_with_nvshmem_tile<128>(float*, nvshmem_team_t)",
)


def write_kernel_names(path: Path, names: tuple[str, ...] = COMM_KERNELS + COMPUTE_KERNELS) -> Path:
    """One 10 µs kernel per name on stream 7, one after another, each launched from the main thread."""
    events = []
    for i, name in enumerate(names):
        start = BASE + 20 * US * i
        events += [
            x("cuda_runtime", "cudaLaunchKernel", start - 2 * US, US, correlation=i + 1),
            x("kernel", name, start, 10 * US, pid=0, tid=7, correlation=i + 1, device=0, stream=7),
        ]
    return write(path, events)


# --- (d) passes named in any spelling ---


def write_named_passes(path: Path, names: list[str], mirror: bool = True) -> Path:
    """One 10 µs pass per name, one after another on the main thread: a ``user_annotation`` range of that
    name around the ``cudaLaunchKernel`` of one 8 µs kernel on stream 7 and, with ``mirror``, the
    ``gpu_user_annotation`` Kineto writes on the stream for the same range (over the kernel)."""
    events = []
    for i, name in enumerate(names):
        start = BASE + 20 * US * i
        events += [
            x("user_annotation", name, start, 10 * US),
            x("cuda_runtime", "cudaLaunchKernel", start + US, US // 2, correlation=i + 1),
            x("kernel", f"gemm_{i}", start + 2 * US, 8 * US, pid=0, tid=7, correlation=i + 1, device=0, stream=7),
        ]
        if mirror:
            events.append(x("gpu_user_annotation", name, start + 2 * US, 8 * US, pid=0, tid=7, device=0, stream=7))
    return write(path, events)
