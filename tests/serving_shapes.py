"""Serving-engine shapes written as the profilers write them: Kineto JSON for vLLM V1 and SGLang, an Nsight
Systems export for TensorRT-LLM.

Each step is a CPU range on the engine thread, labelled as its engine labels it; the GPU work it launches
carries the correlation id of its launching runtime call (``cudaLaunchKernel`` for eager kernels, one
``cudaGraphLaunch`` for a CUDA graph replay, which every kernel of the graph carries). GPU work runs on one
stream in launch order, each kernel starting at the later of its launch and the previous kernel's end, so an
asynchronous engine (its range closes after launching, before the GPU has run the work) shows its ranges
closing before its kernels start and the next range opening while the GPU still runs the previous step.

Times are given in ms and written in µs (Kineto) or ns (Nsight), exact in both.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

MS = 1_000_000
BASE_MS = 1000.0  # the trace's first instant
ENGINE = 100  # pid and tid of the engine thread
DEVICE, STREAM = 0, 7


@dataclass
class Launch:
    """One runtime call at ``at`` ms: ``call`` launches the kernels (start, end ms) sharing its correlation id."""

    at: float
    kernels: list[tuple[float, float]]
    call: str = "cudaLaunchKernel"
    name: str = "sm90_xmma_gemm_bf16"


@dataclass
class Step:
    label: str
    start: float
    end: float
    launches: list[Launch] = field(default_factory=list)


def graph(at: float, kernels: list[tuple[float, float]]) -> Launch:
    """A CUDA graph replay: one ``cudaGraphLaunch`` whose correlation id all of the graph's kernels carry."""
    return Launch(at, kernels, "cudaGraphLaunch", "void flash_fwd_splitkv_kernel")


def vllm(tokens: int, ctx: int, ctx_tokens: int, gen: int) -> str:
    """vLLM V1's detailed step label (``sq``: query tokens, ``sk``: key tokens, their squares and products)."""
    def part(q: int) -> str:
        return f"sq{q}sk{q}sqsq{q * q}sqsk{q * q}"
    return f"execute_{tokens}_context_{ctx}({part(ctx_tokens)})_generation_{gen}({part(gen)})"


# --- Kineto ---


def _x(cat: str, name: str, start_ms: float, end_ms: float, pid: int = ENGINE, tid: int = ENGINE,
       **args) -> dict:
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": (BASE_MS + start_ms) * 1000,
             "dur": (end_ms - start_ms) * 1000}
    return {**event, "args": args} if args else event


def kineto_events(steps: list[Step], sync: bool = False) -> list[dict]:
    """The events of ``steps``: ranges, launches (10 µs each), kernels and the ``ac2g`` flows that link them.
    With ``sync`` each range also holds a ``cudaStreamSynchronize`` that returns when its last kernel ends."""
    events, corr = [], 0
    for step in steps:
        events.append(_x("user_annotation", step.label, step.start, step.end))
        for launch in step.launches:
            corr += 1
            events.append(_x("cuda_runtime", launch.call, launch.at, launch.at + 0.01, correlation=corr))
            events.append({"ph": "s", "id": corr, "pid": ENGINE, "tid": ENGINE, "ts": (BASE_MS + launch.at) * 1000,
                           "cat": "ac2g", "name": "ac2g"})
            for i, (k0, k1) in enumerate(launch.kernels):
                events.append(_x("kernel", f"{launch.name}_{i}", k0, k1, DEVICE, STREAM, correlation=corr,
                                 device=DEVICE, stream=STREAM))
        if sync and step.launches:
            last = max(k1 for launch in step.launches for _, k1 in launch.kernels)
            events.append(_x("cuda_runtime", "cudaStreamSynchronize", last - 0.2, last + 0.01))
    return events


def write_kineto(path: Path, steps: list[Step], sync: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    info = {"rank": 0, "world_size": 1, "backend": "nccl"}
    body = {"schemaVersion": 1, "distributedInfo": info, "traceEvents": kineto_events(steps, sync)}
    path.write_text(json.dumps(body))
    return path


# --- the shapes, with their hand-computed figures ---


def async_vllm() -> list[Step]:
    """vLLM V1 with async scheduling and CUDA graphs, one step of look-ahead: the engine opens step n+1's
    range once step n−1 has completed (it reads n−1's sampled tokens), launches and closes it while the GPU
    still runs step n. Decode steps replay a CUDA graph; the prompt (S0) and the mixed step (S3) run eagerly.

    | step | class   | range (ms)   | GPU work (ms) | cpu | gpu | lag | dur | done |
    | S0   | prefill | 0 – 2        | 1 – 9         | 2   | 8   | 1   | 8   | 9    |
    | S1   | decode  | 3 – 4        | 9 – 12        | 1   | 3   | 6   | 3   | 12   |
    | S2   | decode  | 9.5 – 10.5   | 12 – 15       | 1   | 3   | 2.5 | 3   | 15   |
    | S3   | mixed   | 12.5 – 13.5  | 15 – 21       | 1   | 6   | 2.5 | 6   | 21   |
    | S4   | decode  | 15.5 – 16.5  | 21 – 24       | 1   | 3   | 5.5 | 3   | 24   |
    | S5   | decode  | 21.5 – 22.5  | 24 – 27       | 1   | 3   | 2.5 | 3   | 27   |

    Decode-carrying steps complete at 12, 15, 21, 24, 27 ms: time between tokens 3, 6 (behind S3's 256
    prompt tokens), 3, 3 ms; their ranges close at 4, 10.5, 13.5, 16.5, 22.5 (6.5, 3, 3, 6 ms apart). Every
    range after S0 opens before the previous step completes (5 overlapped steps). The durations fit
    dur = 2 ms + 3/256 ms per prompt token + 1 ms per decode request exactly."""
    return [
        Step(vllm(512, 1, 512, 0), 0, 2, [Launch(0.5, [(1, 4)]), Launch(1.0, [(4, 8)]), Launch(1.5, [(8, 9)])]),
        Step(vllm(1, 0, 0, 1), 3, 4, [graph(3.5, [(9, 10), (10, 11), (11, 12)])]),
        Step(vllm(1, 0, 0, 1), 9.5, 10.5, [graph(10, [(12, 13), (13, 14), (14, 15)])]),
        Step(vllm(257, 1, 256, 1), 12.5, 13.5, [Launch(12.8, [(15, 19)]), Launch(13.2, [(19, 21)])]),
        Step(vllm(1, 0, 0, 1), 15.5, 16.5, [graph(16, [(21, 22), (22, 23), (23, 24)])]),
        Step(vllm(1, 0, 0, 1), 21.5, 22.5, [graph(22, [(24, 25), (25, 26), (26, 27)])]),
    ]


def synchronising_vllm() -> list[Step]:
    """The same work on an engine that synchronises before closing each range (vLLM V0, a ``.tolist()`` of
    the sampled tokens inside the range): each range lasts until 0.5 ms after its last kernel.

    | step | class   | range (ms) | GPU work (ms) | cpu | gpu |
    | S0   | prefill | 0 – 9.5    | 1 – 9         | 9.5 | 8   |
    | S1   | decode  | 10 – 13.5  | 10.5 – 13     | 3.5 | 2.5 |
    | S2   | mixed   | 14 – 20.5  | 14.5 – 20     | 6.5 | 5.5 |
    | S3   | decode  | 21 – 24.5  | 21.5 – 24     | 3.5 | 2.5 |"""
    return [
        Step(vllm(512, 1, 512, 0), 0, 9.5, [Launch(0.5, [(1, 4)]), Launch(1.0, [(4, 8)]), Launch(1.5, [(8, 9)])]),
        Step(vllm(1, 0, 0, 1), 10, 13.5, [graph(10.2, [(10.5, 12), (12, 13)])]),
        Step(vllm(257, 1, 256, 1), 14, 20.5, [Launch(14.2, [(14.5, 18)]), Launch(14.4, [(18, 20)])]),
        Step(vllm(1, 0, 0, 1), 21, 24.5, [graph(21.2, [(21.5, 23), (23, 24)])]),
    ]


def single_step() -> list[Step]:
    """One decode step of an async engine, the issue's figures: its range lasts 2.41 ms, its graph's kernels
    span 10.74 ms (1.2 – 11.94 ms), 1.2 ms after the range opened."""
    return [Step(vllm(8, 0, 0, 8), 0, 2.41, [graph(1.0, [(1.2, 4.0), (4.0, 11.94)])])]


def two_overlapping() -> list[Step]:
    """Two SGLang decode steps: the second's range (2 – 3 ms) runs while the first's GPU work (0.5 – 5 ms)
    executes; its own work runs 5 – 9 ms. Completions 5 and 9 ms: 4 ms between tokens (the ranges close
    2 ms apart)."""
    return [Step("step[DECODE bs=4]", 0, 1, [graph(0.2, [(0.5, 5)])]),
            Step("step[DECODE bs=4]", 2, 3, [graph(2.5, [(5, 9)])])]


# --- Nsight Systems (TensorRT-LLM) ---


def trtllm_label(it: int, ctx: int, gen: int) -> str:
    return f"[Executor] _forward_step {it}: {ctx} ctx reqs, {gen} gen reqs"


def async_trtllm() -> list[Step]:
    """TensorRT-LLM's PyExecutor with the overlap scheduler: generation steps replay a CUDA graph launched
    from ``_forward_step``'s NVTX range, which closes before the graph runs.

    | step | class   | range (ms) | GPU work (ms) | cpu | gpu | lag |
    | S0   | prefill | 0 – 3      | 1 – 11        | 3   | 10  | 1   |
    | S1   | decode  | 4 – 5      | 11 – 15       | 1   | 4   | 7   |
    | S2   | decode  | 12 – 13    | 15 – 19       | 1   | 4   | 3   |"""
    return [
        Step(trtllm_label(0, 2, 0), 0, 3, [Launch(0.5, [(1, 6)]), Launch(2.0, [(6, 11)])]),
        Step(trtllm_label(1, 0, 2), 4, 5, [graph(4.5, [(11, 13), (13, 15)])]),
        Step(trtllm_label(2, 0, 2), 12, 13, [graph(12.5, [(15, 17), (17, 19)])]),
    ]


def write_nsys(path: Path, steps: list[Step], graph_level: bool = False) -> Path:
    """``steps`` as an Nsight Systems export (the 2026 layout): NVTX ranges, runtime calls and kernels, or with
    ``graph_level`` (``--cuda-graph-trace=graph``) one GRAPH_TRACE span per graph replay in place of its
    kernels."""
    import nsys_fixtures as fx

    trace, calls, corr = fx.Trace(processes={ENGINE: "trtllm-serve"}), [], 0
    for step in steps:
        trace.nvtx.append(fx.Nvtx(ENGINE, ENGINE, _ns(step.start), _ns(step.end), step.label))
        for launch in step.launches:
            corr += 1
            calls.append((_ns(launch.at), _ns(launch.at + 0.01), corr, trace.sid(launch.call + "_v10000")))
            spans = launch.kernels
            if graph_level and launch.call == "cudaGraphLaunch":
                spans = [(spans[0][0], spans[-1][1])]
            kind = "graph" if graph_level and launch.call == "cudaGraphLaunch" else "kernel"
            trace.gpu += [fx.Gpu(ENGINE, DEVICE, STREAM, _ns(k0), _ns(k1), kind, f"{launch.name}_{i}", corr)
                          for i, (k0, k1) in enumerate(spans)]
    fx.write(trace, path)
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 0, ?, ?, ?, 0)",
                         [(s + fx.CLOCK_AT_SESSION_START, e + fx.CLOCK_AT_SESSION_START, fx.gtid(ENGINE, ENGINE),
                           c, name) for s, e, c, name in calls])
    return path


def _ns(ms: float) -> int:
    return round((BASE_MS + ms) * MS)
