"""Serving steps timed by the GPU work they launched: asynchronous engine shapes (vLLM V1 with async scheduling
and CUDA graphs, SGLang, TensorRT-LLM's overlap scheduler) written as Kineto and Nsight files, whose step
durations, slowdowns and times between tokens are computed by hand in ``serving_shapes``; the same work on a
synchronising engine, timed by its ranges; and the serve workload's ``--async`` mode."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from pipebubble.analysis.serving.steps_llm import find_steps
from pipebubble.options import Options, Scale, ServingOptions
from pipebubble.run import run
from pipebubble.spans import conform

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import serving_shapes as shapes
except ImportError:
    import serving_shapes as shapes

MS = 1_000_000


def section(path: Path, tbt_slo_ms: float | None = None) -> dict:
    """The ``interference`` section of the JSON report of ``path``, through the one way in."""
    options = Options(serving=ServingOptions(tbt_slo_ms=tbt_slo_ms))
    return run([path], options, Scale(use_cache=False, workers=1)).to_dict()["interference"]


@pytest.fixture
def async_vllm(tmp_path) -> dict:
    return section(shapes.write_kineto(tmp_path / "vllm_async.json", shapes.async_vllm()), tbt_slo_ms=10.0)


def test_async_steps_last_as_long_as_their_gpu_work(async_vllm):
    it = async_vllm
    assert it["source"] == "labels:vllm"
    assert it["iterations"] == {"prefill": 1, "decode": 4, "mixed": 1, "idle": 0}
    assert it["step_ms"]["prefill"]["p50"] == 8.0  # GPU 1 – 9 ms; its range lasted 2 ms
    assert it["step_ms"]["decode"] == {"p50": 3.0, "p90": 3.0, "p99": 3.0}
    assert it["step_ms"]["mixed"]["p50"] == 6.0
    assert it["step_cpu_ms"] == {"prefill": {"p50": 2.0, "p90": 2.0, "p99": 2.0},
                                 "decode": {"p50": 1.0, "p90": 1.0, "p99": 1.0},
                                 "mixed": {"p50": 1.0, "p90": 1.0, "p99": 1.0}}
    assert it["step_gpu_ms"]["decode"]["p50"] == 3.0 and it["gpu_step_ms"] == {"prefill": 8.0, "decode": 3.0,
                                                                                 "mixed": 6.0}
    # Launch lags of the decodes: 6, 2.5, 5.5, 2.5 ms: the median of four is the mean of the middle two.
    assert it["launch_lag_ms"]["decode"]["p50"] == 4.0
    assert it["launch_lag_ms"]["prefill"]["p50"] == 1.0 and it["launch_lag_ms"]["mixed"]["p50"] == 2.5
    assert (it["clock"], it["steps_timed_by_gpu"], it["steps_with_gpu_work"]) == ("gpu", 6, 6)
    assert it["clock_note"] == ("timed by GPU work: CPU ranges close before the GPU finishes (async engine); "
                                "steps longer on the GPU than their range: 6 of 6")


def test_async_slowdown_and_time_between_tokens_are_completion_to_completion(async_vllm):
    it = async_vllm
    assert it["decode_slowdown_when_mixed"] == 2.0  # 6 / 3 ms (by the ranges: 1 / 1)
    # Completions 12, 15, 21, 24, 27 ms: 3, 6, 3, 3 ms between tokens (the ranges close 6.5, 3, 3, 6 ms apart).
    assert it["tbt_intervals"] == 4
    assert it["tbt_ns"] == {"p50": 3 * MS, "p99": 6 * MS}  # p99: the nearest rank, as the report has always taken it
    assert it["decode_slowdown_when_prefill"] == 2.0  # the 6 ms interval behind S3 against 3 ms
    assert [(e["start_ns"] - 1000 * MS, e["dur_ns"], e["class"], e["prefill_tokens"]) for e in it["worst_episodes"]
            ] == [(15 * MS, 6 * MS, "mixed", 256)]
    assert it["generation_stalls"] == 0
    assert it["overlapped_steps"] == 5
    assert it["gpu_idle_between_steps_ns"] == 0  # each step's work starts as the previous one's ends
    assert it["host_gap_ms"]["p50"] == 2.0  # range to range: 1, 5.5, 2, 2, 5 ms


def test_async_step_time_fit_uses_the_gpu_durations(async_vllm):
    # dur = 2 ms + 3/256 ms per prompt token + 1 ms per decode request, exactly.
    it = async_vllm
    assert it["ms_per_1k_prefill_tokens"] == pytest.approx(1000 * 3 / 256, abs=1e-3)
    assert it["ms_per_decode_request"] == pytest.approx(1.0, abs=1e-3)
    assert it["step_fit_intercept_ms"] == pytest.approx(2.0, abs=1e-3)
    # (10 − 2 − 1·1) / (3/256) = 597.3 prompt tokens beside the median decode batch of 1.
    assert it["chunk_for_slo_tokens"] == 597


def test_a_synchronising_engine_is_timed_by_its_ranges(tmp_path):
    it = section(shapes.write_kineto(tmp_path / "vllm_sync.json", shapes.synchronising_vllm(), sync=True))
    assert it["step_ms"]["prefill"]["p50"] == 9.5 and it["step_ms"]["decode"]["p50"] == 3.5
    assert it["step_ms"]["mixed"]["p50"] == 6.5
    assert it["step_ms"] == it["step_cpu_ms"]
    assert it["step_gpu_ms"]["decode"]["p50"] == 2.5
    assert it["decode_slowdown_when_mixed"] == pytest.approx(6.5 / 3.5, abs=1e-4)
    # Ranges end at 13.5, 20.5, 24.5 ms: TBT 7 and 4 ms, as by the ranges before GPU timing existed.
    assert it["tbt_ns"]["p50"] == 5.5 * MS
    assert (it["clock"], it["steps_timed_by_gpu"], it["steps_with_gpu_work"], it["overlapped_steps"]) == (
        "cpu", 0, 4, 0)
    assert it["clock_note"] == "timed by CPU ranges: the engine synchronises, the GPU work ends inside each range"


def test_single_async_step(tmp_path):
    it = section(shapes.write_kineto(tmp_path / "one.json", shapes.single_step()))
    assert it["steps"] == 1 and it["iterations"]["decode"] == 1
    assert it["step_ms"]["decode"]["p50"] == 10.74 and it["step_cpu_ms"]["decode"]["p50"] == 2.41
    assert it["launch_lag_ms"]["decode"]["p50"] == 1.2
    assert it["tbt_intervals"] == 0 and it["tbt_ns"] == {"p50": None, "p99": None}
    assert it["decode_slowdown_when_mixed"] is None and it["decode_slowdown_when_prefill"] is None
    assert it["clock"] == "gpu" and it["overlapped_steps"] == 0


def test_two_overlapping_steps(tmp_path):
    it = section(shapes.write_kineto(tmp_path / "two.json", shapes.two_overlapping()))
    assert it["source"] == "labels:sglang"
    assert it["step_ns"]["decode"]["p50"] == 4.25 * MS  # 4.5 and 4 ms of GPU work
    assert it["tbt_intervals"] == 1 and it["tbt_ns"]["p50"] == 4 * MS  # completions 5 and 9 ms
    assert it["overlapped_steps"] == 1  # the second range (2 – 3 ms) ran while the first's work did
    assert it["host_gap_ms"]["p50"] == 1.0


@pytest.mark.parametrize("graph_level", [False, True], ids=["graph-nodes", "graph-level"])
def test_trtllm_overlap_scheduler_in_nsight(tmp_path, graph_level):
    """Nsight records a graph replay's kernels under the ``cudaGraphLaunch``'s correlation id, or with
    graph-level tracing one span for the whole graph: either way the graph belongs to its step."""
    path = shapes.write_nsys(tmp_path / "trtllm.sqlite", shapes.async_trtllm(), graph_level)
    it = section(path)
    assert it["source"] == "labels:trtllm"
    assert it["iterations"] == {"prefill": 1, "decode": 2, "mixed": 0, "idle": 0}
    assert it["step_ms"]["prefill"]["p50"] == 10.0 and it["step_ms"]["decode"]["p50"] == 4.0
    assert it["step_cpu_ms"]["decode"]["p50"] == 1.0
    assert it["launch_lag_ms"]["decode"]["p50"] == 5.0  # 7 and 3 ms
    assert it["tbt_ns"]["p50"] == 4 * MS  # decodes complete at 15 and 19 ms
    assert it["clock"] == "gpu" and it["overlapped_steps"] == 2


def test_vllm_v1_labels_give_tokens_and_requests():
    """vLLM V1's ``execute_{n}_context_{c}(…)_generation_{g}(…)``: prompt tokens from the context group's
    ``sq`` count, else n less the generation tokens (one per decoding request when not given)."""
    rows = [{"kind": "annotation", "name": name, "start": i * MS, "end": i * MS + MS // 2, "lane": "t",
             "pid": 1, "tid": 1, "rank": 0, "source": "t.json"} for i, name in enumerate([
                 "execute_300_context_2(…)_generation_4(…)", "execute_4_context_0()_generation_4(4)",
                 shapes.vllm(257, 1, 256, 1), "execute_context_1(64)_generation_3(3)"])]
    steps = find_steps(conform(pl.DataFrame(rows)))
    assert steps.select("cls", "prefill_reqs", "prefill_tokens", "decode_reqs").rows() == [
        ("mixed", 2, 296, 4), ("decode", 0, 0, 4), ("mixed", 1, 256, 1), ("mixed", 1, 64, 3)]


# --- the serve workload's --async mode ---


def test_serve_async_on_cpu_keeps_the_shape_and_its_clock(tmp_path):
    """On CPU every operator runs inside the range that calls it, so an --async capture still holds each
    step's work inside its range: the report is timed by the ranges and says that no GPU work was launched."""
    pytest.importorskip("torch", reason="capture needs torch")
    from pipebubble.capture import CaptureOptions, capture
    from pipebubble.capture.workloads import WorkloadSettings, workload_command

    settings = WorkloadSettings(requests=3, arrival_rate=1000.0, chunked_prefill=64, async_steps=True)
    command, about, options = workload_command("serve", settings, CaptureOptions(out=tmp_path / "out"))
    assert "--async" in command and about["async"] is True
    result = capture(command, options, about)
    assert result.exit_code == 0
    it = section(tmp_path / "out")
    assert it["source"] == "labels:vllm" and it["iterations"]["mixed"] > 0
    assert it["clock"] == "cpu" and it["steps_with_gpu_work"] == 0
    assert it["clock_note"] == "timed by CPU ranges: no GPU work was launched from the steps"
    assert it["step_ms"] == it["step_cpu_ms"] and it["tbt_intervals"] > 0


def test_serve_async_reads_tokens_back_one_step_late(tmp_path):
    """--async defers each step's token read-back until the next step is launched (vLLM V1's async
    scheduling), so a step's range holds no read-back of its own tokens; the tokens served are the same."""
    pytest.importorskip("torch", reason="capture needs torch")
    import subprocess
    import sys

    def served(*flags: str) -> str:
        command = [sys.executable, "-m", "pipebubble.capture.workloads.serve", "--requests", "4",
                   "--arrival-rate", "1000", "--chunked-prefill", "64", "--print-tokens", *flags]
        return subprocess.run(command, check=True, capture_output=True, text=True).stdout

    plain, deferred = served(), served("--async")
    assert re.search(r"served 4 requests in \d+ steps", plain)
    assert plain == deferred


@pytest.mark.parametrize("fmt", ["text", "markdown", "html"])
def test_every_document_names_the_clock_and_shows_both_parts(tmp_path, fmt):
    """The text, Markdown and HTML reports say which clock timed the steps and show the CPU, GPU and lag
    parts beside the step time (async engine: timed by GPU work)."""
    from pipebubble.render import render

    path = shapes.write_kineto(tmp_path / "vllm_async.json", shapes.async_vllm())
    report = run([path], Options(), Scale(use_cache=False, workers=1))
    text = render(report, fmt, width=160)
    assert "timed by GPU work: CPU ranges close before the GPU finishes (async engine)" in text
    for head in ("cpu p50", "gpu p50", "lag p50"):
        assert head in text
    sync = run([shapes.write_kineto(tmp_path / "vllm_sync.json", shapes.synchronising_vllm(), sync=True)],
               Options(), Scale(use_cache=False, workers=1))
    assert "timed by CPU ranges: the engine synchronises" in render(sync, "text", width=160)
