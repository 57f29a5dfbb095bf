"""Prefill/decode interference: exact numbers on hand-built label sequences, the project's serving captures
(chunked prefill against whole-prompt prefill) and a real SGLang trace."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pipebubble.analysis.serving.interference import interference as analyse
from pipebubble.analysis.serving.steps_inferred import infer_steps
from pipebubble.analysis.serving.steps_llm import find_steps
from pipebubble.ingest import load
from pipebubble.report import Interference, Report
from pipebubble.spans import conform, empty
from tests.conftest import ROOT, shared

MS = 1_000_000
LANE = "rank0/pid1/tid1"


def interference(spans: pl.DataFrame, **options) -> tuple[dict | None, list]:
    """The section as the JSON report writes it (its public form), and the timeline segments."""
    section, segments = analyse(spans, **options)
    return (None if section is None else section.to_dict()), segments


def labels(names_ms: list[tuple[str, float]], gap_ms: float = 1.0, lane: str = LANE) -> pl.DataFrame:
    """Back-to-back CPU step ranges on one thread: (label, duration ms), ``gap_ms`` apart."""
    rows, t = [], 0
    for name, dur in names_ms:
        rows.append({"kind": "annotation", "name": name, "start": t, "end": t + int(dur * MS), "lane": lane,
                     "pid": 1, "tid": 1, "rank": 0, "source": "t.json"})
        t += int(dur * MS) + int(gap_ms * MS)
    return conform(pl.DataFrame(rows))


def vllm(c: int, ctx: int, g: int) -> str:
    return f"execute_context_{c}({ctx})_generation_{g}({g})"


SEQUENCE = [(vllm(1, 100, 0), 10), (vllm(0, 0, 1), 2), (vllm(1, 50, 1), 6), (vllm(0, 0, 2), 4),
            (vllm(2, 80, 2), 8), (vllm(0, 0, 0), 1), (vllm(0, 0, 2), 3)]


def test_vllm_labels_give_exact_counts_and_medians():
    report, segments = interference(labels(SEQUENCE))
    assert report["steps"] == 7
    assert report["iterations"] == {"prefill": 1, "decode": 3, "mixed": 2, "idle": 1}
    assert report["source"] == "labels:vllm"
    assert report["step_ms"]["decode"]["p50"] == 3.0  # 2, 3, 4
    assert report["step_ms"]["mixed"]["p50"] == 7.0  # 6, 8
    assert report["decode_slowdown_when_mixed"] == pytest.approx(7 / 3, abs=1e-4)
    # Decode-carrying steps end at 13, 20, 25, 34, 40 ms (1 ms gaps): intervals 7, 5, 9, 6 ms.
    assert report["tbt_intervals"] == 4
    assert report["tbt_ms"]["p50"] == 6.5
    assert report["gpu_idle_between_steps_ns"] is None  # CPU only
    assert [s.phase for s in segments] == ["prefill", "decode", "mixed", "decode", "mixed", "decode"]
    assert {s.stage for s in segments} == {0}
    assert [s.step for s in segments] == [0, 1, 2, 3, 4, 6]


def test_worst_episodes_are_the_intervals_holding_prompt_work():
    report, _ = interference(labels(SEQUENCE))
    worst = report["worst_episodes"]
    # Intervals holding prompt work: 7 ms (mixed, 50 tok) and 9 ms (mixed, 80 tok); the pure-decode ones: 5, 6.
    assert [(e["dur_ns"], e["class"], e["prefill_tokens"]) for e in worst] == [(9 * MS, "mixed", 80),
                                                                              (7 * MS, "mixed", 50)]
    assert worst[0]["slowdown"] == pytest.approx(9 / 5.5, abs=1e-4)
    assert report["decode_slowdown_when_prefill"] == pytest.approx(8 / 5.5, abs=1e-4)


def test_stalls_behind_whole_prompt_steps():
    seq = [(vllm(0, 0, 4), 2)] * 5 + [(vllm(1, 400, 0), 20), (vllm(0, 0, 4), 2), (vllm(0, 0, 4), 2)]
    report, _ = interference(labels(seq, gap_ms=0))
    assert report["decode_slowdown_when_mixed"] is None  # nothing mixed
    assert report["generation_stalls"] == 1  # the 22 ms interval, 11x the 2 ms median
    assert report["decode_slowdown_when_prefill"] == pytest.approx(11.0)
    assert report["worst_episodes"][0]["class"] == "prefill"


def test_fit_recovers_per_token_cost_and_slo_chunk():
    # dur = 1 ms + 0.02 ms/token + 0.5 ms/decode request, exactly.
    combos = [(0, 4), (0, 8), (100, 4), (300, 0), (200, 8), (500, 2)]
    seq = [(vllm(1 if p else 0, p, d), 1 + 0.02 * p + 0.5 * d) for p, d in combos]
    report, _ = interference(labels(seq), tbt_slo_ms=10.0)
    assert report["ms_per_1k_prefill_tokens"] == pytest.approx(20.0, abs=1e-3)
    assert report["ms_per_decode_request"] == pytest.approx(0.5, abs=1e-3)
    # Median decode batch over decode-carrying steps (4, 8, 4, 8, 2) is 4: (10 − 1 − 2) / 0.02 = 350 tokens.
    assert report["chunk_for_slo_tokens"] == 350
    assert report["tbt_slo_ms"] == 10.0


def test_sglang_trtllm_and_detailed_vllm_labels():
    seq = [("step[EXTEND bs=2 toks=300]", 5), ("step[DECODE bs=4]", 1), ("step[MIXED bs=5]", 3),
           ("step[IDLE bs=0]", 1), ("[Executor] _forward_step 7: 2 ctx reqs, 3 gen reqs", 4),
           ("[Executor] _forward_step 8: 0 ctx reqs, 0 ctx tokens, 32 gen reqs", 1),
           ("execute_1025_context_1(sq1024sk1024sqsq1048576sqsk1048576)_generation_1(sq1sk900sqsq1sqsk900)", 6)]
    steps = find_steps(labels(seq))
    assert steps["cls"].to_list() == ["prefill", "decode", "mixed", "idle", "mixed", "decode", "mixed"]
    assert steps["prefill_tokens"].to_list() == [300, None, None, None, None, 0, 1024]
    assert steps["decode_reqs"].to_list() == [None, 4, None, None, 3, 32, 1]
    assert steps["source_label"].to_list() == ["sglang"] * 4 + ["trtllm"] * 2 + ["vllm"]
    report, _ = interference(labels(seq))
    assert report["source"] == "labels:sglang+labels:trtllm+labels:vllm"


def test_nested_labels_of_one_step_count_once():
    outer = labels([("execute_300_context_2(sq300sk300sqsq1sqsk1)_generation_0(sq0sk0sqsq0sqsk0)", 10)])
    inner = labels([("step[EXTEND bs=2 toks=300]", 4)]).with_columns(pl.col("start") + 3 * MS,
                                                                      pl.col("end") + 3 * MS)
    steps = find_steps(pl.concat([outer, inner]))
    assert steps.select("name", "prefill_reqs", "prefill_tokens").rows() == [("step[EXTEND bs=2 toks=300]", 2, 300)]


def test_custom_regex():
    seq = [("engine.step P=128 D=0", 5), ("engine.step P=0 D=6", 1), ("engine.step P=32 D=6", 2)]
    regex = r"^engine\.step P=(?P<prefill_tokens>\d+) D=(?P<decode_reqs>\d+)$"
    report, _ = interference(labels(seq), step_regex=regex)
    assert report["iterations"] == {"prefill": 1, "decode": 1, "mixed": 1, "idle": 0}
    assert report["source"] == "labels:custom"
    assert interference(labels(SEQUENCE), step_regex=regex) == (None, [])


def gpu_trace() -> pl.DataFrame:
    """Two steps on one thread, each launching two kernels on GPU 3 (Kineto-style: GPU pid null)."""
    cpu = labels([(vllm(1, 64, 0), 10), (vllm(0, 0, 2), 10)], gap_ms=0)
    rows = []
    for corr, launch_ms, k0, k1 in ((1, 1, 2, 5), (2, 3, 5, 9), (3, 11, 12, 14), (4, 12, 14, 15)):
        rows.append({"kind": "runtime", "name": "cudaLaunchKernel", "start": launch_ms * MS,
                     "end": launch_ms * MS + 1000, "lane": LANE, "pid": 1, "tid": 1, "correlation": corr})
        rows.append({"kind": "kernel", "name": "k", "start": k0 * MS, "end": k1 * MS, "lane": "rank0/gpu3",
                     "device": 3, "stream": 7, "correlation": corr})
    gpu = conform(pl.DataFrame(rows).with_columns(source=pl.lit("t.json"), rank=pl.lit(0)))
    return pl.concat([cpu, gpu])


def test_gpu_work_is_attributed_to_the_launching_step():
    report, segments = interference(gpu_trace())
    assert [(s.stage, s.start_ns, s.end_ns) for s in segments] == [(3, 2 * MS, 9 * MS), (3, 12 * MS, 15 * MS)]
    assert report["gpu_idle_between_steps_ns"] == 3 * MS
    assert report["gpu_step_ms"] == {"prefill": 7.0, "decode": 3.0}
    # Both ranges (10 ms each) outlast their GPU work (7 and 3 ms): the steps are timed by their ranges.
    assert report["step_ms"]["prefill"]["p50"] == report["step_ms"]["decode"]["p50"] == 10.0
    assert report["step_gpu_ms"]["decode"]["p50"] == 3.0
    assert report["launch_lag_ms"] == {c: {"p50": 2.0, "p90": 2.0, "p99": 2.0} for c in ("prefill", "decode")}
    assert (report["clock"], report["steps_timed_by_gpu"], report["steps_with_gpu_work"]) == ("cpu", 0, 2)


def test_a_range_that_closes_before_its_kernels_is_timed_by_them():
    """The decode step's range (10 – 11 ms) launches a kernel that runs 12 – 30 ms: the step lasts 18 ms; the
    prompt step's range (0 – 10 ms) outlasts its kernel (2 – 9 ms) and lasts 10 ms."""
    cpu = labels([(vllm(1, 64, 0), 10), (vllm(0, 0, 2), 1)], gap_ms=0)
    gpu = conform(pl.DataFrame([*launch(1, "cudaLaunchKernel", 1, "k", 2, 9),
                                *launch(2, "cudaLaunchKernel", 10.5, "k", 12, 30)]))
    report, segments = interference(pl.concat([cpu, gpu]))
    assert report["step_ms"]["decode"]["p50"] == 18.0 and report["step_cpu_ms"]["decode"]["p50"] == 1.0
    assert report["step_ms"]["prefill"]["p50"] == 10.0 and report["step_gpu_ms"]["prefill"]["p50"] == 7.0
    assert report["launch_lag_ms"]["decode"]["p50"] == 2.0  # 12 ms, the kernel, less 10 ms, the range
    assert report["steps_timed_by_gpu"] == 1 and report["clock"] == "cpu"  # one of two: not most
    assert report["clock_note"].endswith("; steps longer on the GPU than their range, timed by it: 1 of 2")
    assert [(s.start_ns, s.end_ns) for s in segments] == [(2 * MS, 9 * MS), (12 * MS, 30 * MS)]


def test_typed_section_with_gpu_parts_round_trips():
    section, _ = analyse(gpu_trace())
    decode = next(c for c in section.classes if c.name == "decode")
    assert decode.cpu_ns["p50"] == 10 * MS and decode.gpu_ns["p50"] == 3 * MS and decode.lag_ns["p50"] == 2 * MS
    assert Interference.from_dict(section.to_dict()) == section
    older = {k: v for k, v in section.to_dict().items() if not k.endswith("_ns")}  # ms keys only
    assert Interference.from_dict(older).classes[1].gpu_ns["p50"] == pytest.approx(3 * MS)


@pytest.mark.parametrize("frame", [empty(), labels([("forward", 1)])], ids=["empty", "one-span"])
def test_degenerate_tables(frame):
    assert interference(frame) == (None, [])


def serve(folder: str) -> dict:
    report, _ = interference(load(sorted((ROOT / "sample_traces" / folder).glob("*.json.gz"))).spans)
    return report


def test_chunked_prefill_lowers_interference_on_our_serving_captures():
    # 32 requests, one every 4 engine steps, prompts 512-740 tokens; chunking with a 256-token budget.
    # Committed samples: slowdown 16.3 (whole prompts, decodes stalled) against 5.8 mixed / 5.6 with prefill;
    # p99 TBT 103.6 ms against 43.1 ms; step CV 1.42 against 0.54.
    plain, chunked = serve("serve"), serve("serve_chunked_prefill")
    assert plain["steps"] == 132 and chunked["steps"] == 134  # arrivals count steps: every capture schedules alike
    assert plain["iterations"] == {"prefill": 32, "decode": 100, "mixed": 0, "idle": 0}
    assert chunked["iterations"]["mixed"] > 80
    assert plain["decode_slowdown_when_mixed"] is None  # nothing mixed: whole-prompt steps stall the decodes
    assert plain["decode_slowdown_when_prefill"] > 8
    assert chunked["decode_slowdown_when_mixed"] < 0.5 * plain["decode_slowdown_when_prefill"]
    assert chunked["decode_slowdown_when_prefill"] < 0.5 * plain["decode_slowdown_when_prefill"]
    assert chunked["tbt_ms"]["p99"] < 0.6 * plain["tbt_ms"]["p99"]
    assert chunked["generation_stalls"] < plain["generation_stalls"]
    assert chunked["step_cv"] < 0.6 * plain["step_cv"]


def test_sglang_trace_yields_its_extend_step():
    path = shared("inference", "sglang_qwen3_8b_prefill_decode.json.gz")
    spans = load([Path(path)]).spans
    steps = find_steps(spans)
    # The capture holds one labelled forward: step[EXTEND ...] nested in a vLLM-style range; no DECODE label.
    assert steps.select("name", "cls", "prefill_reqs", "prefill_tokens").rows() == [
        ("step[EXTEND bs=15 toks=15360]", "prefill", 15, 15360)]
    report, segments = interference(spans)
    assert report["source"] == "labels:sglang"
    assert report["iterations"] == {"prefill": 1, "decode": 0, "mixed": 0, "idle": 0}
    # The GPU runs the 36 layers long after the CPU range closes (nothing synchronises inside it): the step is
    # timed by its GPU work, first kernel start to last kernel end (checked by hand in the trace: 524 kernels
    # launched from the range, 185.945 222 ms to 679.474 429 ms after the trace's second 1779988464).
    assert report["step_cpu_ms"]["prefill"]["p50"] == pytest.approx(28.9159, abs=1e-4)
    assert report["step_ms"]["prefill"]["p50"] == report["step_gpu_ms"]["prefill"]["p50"] == 493.5292
    assert report["launch_lag_ms"]["prefill"]["p50"] == 0.104  # 104 012 ns from range start to first kernel
    assert report["gpu_step_ms"]["prefill"] == 493.5292
    assert (report["clock"], report["steps_timed_by_gpu"], report["steps_with_gpu_work"]) == ("gpu", 1, 1)
    assert report["clock_note"].startswith("timed by GPU work: CPU ranges close before the GPU finishes")
    assert [(s.stage, s.phase) for s in segments] == [(9, "prefill")]


SGLANG = "/sgl-workspace/sglang/python/sglang/srt/model_executor/"


def span(kind: str, name: str, start_ms: float, end_ms: float, **extra) -> dict:
    cpu = extra.get("device") is None
    return {"kind": kind, "name": name, "start": int(start_ms * MS), "end": int(end_ms * MS),
            "lane": LANE if cpu else "rank0/gpu0", "pid": 1 if cpu else None, "tid": 1 if cpu else None,
            "rank": 0, "source": "t.json", **extra}


def launch(corr: int, call: str, at_ms: float, kernel: str, k0: float, k1: float) -> list[dict]:
    return [span("runtime", call, at_ms, at_ms + 0.01, correlation=corr),
            span("kernel", kernel, k0, k1, device=0, stream=7, correlation=corr)]


def sglang_frames() -> pl.DataFrame:
    """An unlabelled SGLang-like trace: an extend step (eager prompt attention), then two decode steps that
    replay a CUDA graph."""
    rows = [span("annotation", SGLANG + "model_runner.py(3123): forward", 0, 10),
            span("annotation", SGLANG + "model_runner.py(3003): forward_extend", 1, 9),
            *launch(1, "cudaLaunchKernel", 2, "FmhaBatchPrefillWithPagedKVCacheKernel", 3, 12)]
    for i, t in enumerate((20, 30)):
        rows += [span("annotation", SGLANG + "model_runner.py(3123): forward", t, t + 4),
                 span("annotation", SGLANG + "model_runner.py(2950): forward_decode", t + 1, t + 3),
                 span("annotation", SGLANG + "cuda_graph_runner.py(800): replay", t + 1.5, t + 2.5),
                 *launch(10 + i, "cudaGraphLaunch", t + 2, "gemm", t + 3, t + 5)]
    return conform(pl.DataFrame(rows))


def test_unlabelled_engine_frames_and_graph_replays_give_inferred_steps():
    steps = infer_steps(sglang_frames())
    assert steps.select("cls", "source_label", "kernels").rows() == [
        ("prefill", "inferred", 1), ("decode", "inferred", 1), ("decode", "inferred", 1)]
    assert steps["prefill_tokens"].null_count() == 3  # no sizes without labels
    report, segments = interference(sglang_frames())
    assert report["source"] == "inferred"
    assert report["iterations"] == {"prefill": 1, "decode": 2, "mixed": 0, "idle": 0}
    assert report["tbt_intervals"] == 1 and report["tbt_ms"]["p50"] == 10.0  # decode steps end at 24, 34 ms
    assert [(s.stage, s.phase, s.start_ns) for s in segments] == [(0, "prefill", 3 * MS), (0, "decode", 23 * MS),
                                                                  (0, "decode", 33 * MS)]


def gpu_bursts(extra: list[dict] = ()) -> pl.DataFrame:
    """No CPU frames: GPU bursts 5 ms apart: a prompt (varlen attention), two graph replays (decode), and a
    burst with both (mixed)."""
    rows = [*launch(1, "cudaLaunchKernel", 0, "flash_fwd_varlen_kernel", 1, 3),
            *launch(2, "cudaLaunchKernel", 0.1, "gemm", 3, 4),
            *launch(3, "cudaGraphLaunch", 5, "gemm", 9, 10), *launch(4, "cudaGraphLaunch", 12, "gemm", 15, 16),
            *launch(5, "cudaLaunchKernel", 18, "context_attention_fwd", 21, 23),
            *launch(6, "cudaGraphLaunch", 18.1, "gemm", 23, 25), *extra]
    return conform(pl.DataFrame(rows))


def test_gpu_bursts_are_steps_when_no_frames():
    report, segments = interference(gpu_bursts())
    assert report["iterations"] == {"prefill": 1, "decode": 2, "mixed": 1, "idle": 0}
    assert [(s.phase, s.start_ns, s.end_ns) for s in segments] == [
        ("prefill", 1 * MS, 4 * MS), ("decode", 9 * MS, 10 * MS), ("decode", 15 * MS, 16 * MS),
        ("mixed", 21 * MS, 25 * MS)]
    assert report["gpu_idle_between_steps_ns"] == (5 + 5 + 5) * MS
    assert report["decode_slowdown_when_mixed"] == 4.0  # 4 ms mixed against 1 ms decode bursts
    assert report["clock"] == "gpu"
    assert report["clock_note"] == "timed by GPU work: the steps are bursts of GPU work (no CPU ranges)"


def test_training_and_forward_only_work_are_not_inferred_steps():
    backward = launch(9, "cudaLaunchKernel", 30, "flash_bwd_dq_dk_dv_kernel", 31, 32)
    assert interference(gpu_bursts(backward)) == (None, [])
    prompts_only = conform(pl.DataFrame(launch(1, "cudaLaunchKernel", 0, "flash_fwd_kernel", 1, 3)))
    assert interference(prompts_only) == (None, [])


def test_sglang_trace_holds_no_decode_step():
    """The capture stops after its one forward: no decode is there to find, by label or by heuristic."""
    spans = load([Path(shared("inference", "sglang_qwen3_8b_prefill_decode.json.gz"))]).spans
    names = spans["name"]
    assert names.str.contains(r"model_runner\.py\(\d+\): forward$").sum() == 1  # one engine step in the trace
    assert names.str.contains(r": forward_decode$|cuda_graph_runner|GraphLaunch").sum() == 0
    attention = spans.filter(pl.col("kind") == "kernel", names.str.contains("(?i)fmha|attention"))["name"]
    assert attention.len() == 36 and attention.str.contains("Prefill").all()  # one per layer of Qwen3-8B
    # Without its labels, the heuristics find the same step from the frame: prefill, launched work on GPU 9.
    unlabelled = spans.filter(~names.str.contains(r"^step\[|^execute_"))
    report, segments = interference(unlabelled)
    assert report["source"] == "inferred"
    assert report["iterations"] == {"prefill": 1, "decode": 0, "mixed": 0, "idle": 0}
    assert report["step_cpu_ms"]["prefill"]["p50"] == pytest.approx(28.94, abs=0.01)
    assert report["step_ms"]["prefill"]["p50"] == pytest.approx(493.53, abs=0.01)  # its GPU work, as above
    assert report["clock"] == "gpu"
    assert [(s.stage, s.phase) for s in segments] == [(9, "prefill")]


@pytest.mark.parametrize("folder", ["serve", "serve_chunked_prefill"])
def test_json_keeps_every_key_it_had(folder):
    """The JSON section is public: every key and value the dict-shaped section had (saved before the section
    became typed) is still there, unchanged; new keys (the ``_ns`` twins) are allowed."""
    from pipebubble.options import Scale
    from pipebubble.run import run

    expected = json.loads((ROOT / "tests" / "golden" / f"interference_{folder}.json").read_text())
    got = run([ROOT / "sample_traces" / folder], scale=Scale(use_cache=False, workers=1)).to_dict()["interference"]
    assert {k: got[k] for k in expected} == expected
    assert got["tbt_ns"]["p50"] == pytest.approx(expected["tbt_ms"]["p50"] * MS, abs=50)


def test_typed_section_is_in_ns_and_round_trips():
    section, _ = analyse(labels(SEQUENCE))
    decode = next(c for c in section.classes if c.name == "decode")
    assert decode.steps == 3 and decode.durations_ns["p50"] == 3 * MS
    assert section.tbt_ns["p50"] == 6.5 * MS
    assert Interference.from_dict(section.to_dict()) == section
    report = Report(interference=section)
    assert Report.from_dict(report.to_dict()).to_dict() == report.to_dict()


def test_an_older_section_in_ms_reads_back_with_its_values():
    """A report saved before the ``_ns`` keys existed (the golden file is one) reads back: every key it had
    keeps its value, and the ``_ns`` keys are added."""
    older = json.loads((ROOT / "tests" / "golden" / "interference_serve.json").read_text())
    section = Interference.from_dict(older)
    written = section.to_dict()
    assert {k: written[k] for k in older} == older
    assert section.tbt_ns["p50"] == pytest.approx(older["tbt_ms"]["p50"] * MS)
