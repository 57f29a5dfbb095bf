"""The flops section through ``pipebubble.run``: which calls count, the GPU time each launched, MFU by hand,
and the GEMMs of every shared trace with shapes against an independent sum over their raw events."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import shared

from pipebubble.analysis.flops.summary import OPS_KEPT
from pipebubble.options import Options, Scale
from pipebubble.run import run

BF = "c10::BFloat16"
H100 = 989.4e12  # dense bf16 FLOP/s of an H100 SXM


def _x(cat, name, ts_us, dur_us, tid=1, pid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts_us, "dur": dur_us, "args": args}


def _kernel(name, ts_us, dur_us, corr):
    return _x("kernel", name, ts_us, dur_us, pid=0, tid=7, device=0, stream=7, correlation=corr)


def _launch(ts_us, corr):
    return _x("cuda_runtime", "cudaLaunchKernel", ts_us, 1, correlation=corr)


def gpu_job(folder: Path) -> Path:
    """Two steps, each: aten::linear ⊃ aten::addmm ⊃ (aten::copy_ launching a 2 µs copy kernel, then the GEMM's
    launch of a 40 µs kernel); aten::relu launching 5 µs; aten::embedding (no model) launching 20 µs."""
    events = []
    for k in range(2):
        t, c = 1000.0 * k, 10 * k
        mm = {"Input Dims": [[256], [64, 128], [128, 256], [], []], "Input type": [BF, BF, BF, "Scalar", "Scalar"]}
        events += [
            _x("user_annotation", f"ProfilerStep#{k + 1}", t, 990),
            _x("cpu_op", "aten::linear", t + 1, 99, **{"Input Dims": [[64, 128], [256, 128], [256]],
                                                      "Input type": [BF, BF, BF]}),
            _x("cpu_op", "aten::addmm", t + 10, 80, **mm),
            _x("cpu_op", "aten::copy_", t + 12, 3, **{"Input Dims": [[64, 128], [64, 128], []],
                                                      "Input type": [BF, BF, "Scalar"]}),
            _launch(t + 13, c + 2), _kernel("copy_kernel", t + 16, 2, c + 2),
            _launch(t + 20, c + 1), _kernel("sm90_gemm_bf16", t + 30, 40, c + 1),
            _x("cpu_op", "aten::relu", t + 110, 20, **{"Input Dims": [[64, 256]], "Input type": [BF]}),
            _launch(t + 112, c + 3), _kernel("relu_kernel", t + 120, 5, c + 3),
            _x("cpu_op", "aten::embedding", t + 140, 20, **{"Input Dims": [[1000, 64], [32]],
                                                          "Input type": [BF, "long int"]}),
            _launch(t + 141, c + 4), _kernel("embedding_kernel", t + 150, 20, c + 4),
        ]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
                                                     "totalGlobalMem": 85_000_000_000}], "traceEvents": events}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rank0.json").write_text(json.dumps(doc))
    return folder


def analyse(paths, options=Options()):
    return run(list(paths), options, Scale(workers=1, use_cache=False))


def test_the_innermost_product_counts_with_every_kernel_it_launched(tmp_path):
    f = analyse([gpu_job(tmp_path / "job")]).flops
    ops = {o.name: o for o in f.ops}
    gemm = 2 * 64 * 256 * 128
    assert set(ops) == {"aten::addmm", "aten::relu"}  # linear holds addmm; the copy is addmm's own
    assert (ops["aten::addmm"].count, ops["aten::addmm"].flops, ops["aten::addmm"].gpu_ns) == (2, 2 * gemm, 84_000)
    assert ops["aten::addmm"].source == "shapes" and ops["aten::addmm"].bound in ("compute", "memory")
    assert (ops["aten::relu"].flops, ops["aten::relu"].gpu_ns) == (2 * 64 * 256, 10_000)
    assert [(u.name, u.gpu_ns) for u in f.unmodelled] == [("aten::embedding", 40_000)]
    assert f.unmodelled_share == pytest.approx(40 / 134)
    (gpu,) = f.by_gpu
    window = (1170 - 16) * 1000  # the first kernel's start to the last one's end, ns
    assert (gpu.device, gpu.dtype, gpu.flops, gpu.window_ns) == ("NVIDIA H100 80GB HBM3", "bf16", 2 * gemm, window)
    assert gpu.mfu == pytest.approx(2 * gemm / H100 / (window / 1e9))
    assert [s.flops for s in f.by_step] == [gemm, gemm]
    assert f.mfu == pytest.approx(gpu.mfu)


def test_the_flags_replace_the_table_and_give_a_cpu_job_its_peak(tmp_path):
    folder = tmp_path / "cpu"
    folder.mkdir()
    dims = {"Input Dims": [[8, 256], [256, 256]], "Input type": ["float", "float"]}
    events = [_x("cpu_op", "aten::mm", 100.0 * k, 50, **dims) for k in range(4)]
    (folder / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    report = analyse([folder])
    assert report.flops.mfu is None and report.flops.notes  # no peak known for a CPU
    report = analyse([folder], Options.from_settings({"peak_flops": "100G"}))
    (lane,) = report.flops.by_gpu
    flops = 4 * 2 * 8 * 256 * 256
    assert lane.window_ns == 350_000 and lane.flops == flops
    assert 0 < lane.mfu < 1 and lane.mfu == pytest.approx(flops / (0.35e-3 * 100e9))
    assert report.flops.peak_source == "flag"


GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
#: Every shared trace whose operators carry ``Input Dims``.
TRACES = ["inference/sglang_qwen3_8b_prefill_decode.json.gz", "kineto/recsys_128rank_sampled_rank-0.json.gz",
          "kineto/recsys_128rank_sampled_rank-1.json.gz", "kineto/mi250_rocm_toy_train.json.gz",
          "kineto/cpu_only_gloo_rank34.json.gz", "kineto/triton_compile_example.json.gz",
          *(f"pipeline_cpu/{s}/rank{r}.pt.trace.json.gz" for s in ("gpipe", "1f1b", "interleaved1f1b")
            for r in range(4))]


def independent_gemm_flops(path: Path) -> int:
    """2·M·N·K (times the batch) summed over the raw mm/addmm/bmm/baddbmm events that launched a kernel (a CPU
    trace: every one), read with json alone; a launch belongs to a call when its start lies inside it on the
    same thread (a product whose only launch is a memset, as one of the recsys traces holds, launched none)."""
    events = json.load(gzip.open(path))["traceEvents"]
    kernels = {e["args"]["correlation"] for e in events
               if e.get("cat") == "kernel" and "correlation" in e.get("args", {})}
    launches = [(e["pid"], e["tid"], e["ts"]) for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                and e.get("args", {}).get("correlation") in kernels]
    total = 0
    for e in events:
        if e.get("cat") != "cpu_op" or e.get("name") not in GEMMS or "Input Dims" not in e.get("args", {}):
            continue
        if kernels and not any(p == e["pid"] and t == e["tid"] and e["ts"] <= ts < e["ts"] + e["dur"]
                               for p, t, ts in launches):
            continue
        i, j = GEMMS[e["name"]]
        a, b = e["args"]["Input Dims"][i], e["args"]["Input Dims"][j]
        batch = a[0] if len(a) == 3 else 1
        total += 2 * batch * a[-2] * a[-1] * b[-1]
    return total


@pytest.mark.parametrize("name", TRACES)
def test_the_gemms_of_every_shared_trace_with_shapes_to_the_unit(name):
    path = shared(name)
    f = analyse([path]).flops
    expected = independent_gemm_flops(path)
    got = sum(o.flops for o in f.ops if o.name in GEMMS) if f is not None else 0
    assert f is None or len(f.ops) < OPS_KEPT  # every operator row kept
    assert got == expected


@pytest.mark.parametrize("sample", ["pipeline_gpipe", "pipeline_1f1b", "pipeline_1f1b_imbalanced"])
def test_the_bundled_pipelines_give_every_stage_its_flops(sample):
    """Captured with shapes: each of the 4 stages' FLOPs, and the imbalanced sample's last stage 1.6× the others'
    (its --imbalance)."""
    report = analyse([Path(__file__).resolve().parents[3] / "sample_traces" / sample])
    stages = {s.stage: s for s in report.flops.by_stage}
    assert sorted(stages) == [0, 1, 2, 3] and all(s.flops > 0 and s.flops_per_s for s in stages.values())
    ratio = stages[3].flops / stages[2].flops
    assert ratio == pytest.approx(1.6 if sample.endswith("imbalanced") else 1.0, rel=0.01)


def test_float32_faster_than_its_peak_is_held_to_the_tf32_peak(tmp_path):
    """A float32 product at 44 TFLOP/s on an A100 (float32 peak 19.5 TFLOP/s without tensor cores) cannot
    have run on CUDA cores: its MFU is against the TF32 peak (156 TFLOP/s), and a note says why."""
    folder = tmp_path / "tf32"
    folder.mkdir()
    dims = {"Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "float"]}
    events = [_x("cpu_op", "aten::mm", 0, 100, **dims), _launch(1, 1), _kernel("ampere_tf32_gemm", 10, 3_100, 1)]
    doc = {"deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}
    (folder / "rank0.json").write_text(json.dumps(doc))
    f = analyse([folder]).flops
    (gpu,) = f.by_gpu
    assert gpu.flops_per_s > 19.5e12 and gpu.peak_flops_per_s == 156e12
    assert gpu.mfu == pytest.approx(2 * 4096**3 / 156e12 / 3.1e-3) and "TF32" in f.notes[0]
