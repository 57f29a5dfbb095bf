"""`diff` never lies: a report against itself, and against the same job recorded again under other PIDs, has
no regression and no unmatched lane; waits with the same key pair in order; a wait's change is relative to the
wait; tolerance is relative to the baseline's value; improvements are reported too."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from conftest import shared
from pids import rerecord_folder
from synth import simulate, write_pipeline

from pipebubble.gates import diff, judge, lane_names
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ["pipeline_1f1b", "pipeline_1f1b_imbalanced", "pipeline_gpipe", "serve", "serve_chunked_prefill",
           "toy_train"]
CPU_RUNS = ["gpipe", "1f1b", "interleaved1f1b"]
SHARED = [("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), ("nsys", "torchrun_2xh100_nccl.sqlite"),
          ("kineto", "mi250_rocm_toy_train.json.gz"), ("inference", "sglang_qwen3_8b_prefill_decode.json.gz")]


def report(path: Path) -> dict:
    return run([path], Options(), Scale(use_cache=False)).to_dict()


def assert_identical(result) -> None:
    assert not result.regressions and not result.improvements and not result.unmatched, (
        result.regressions, result.improvements, result.unmatched)
    assert result.deltas and all(d.base == d.new and d.status == "ok" for d in result.deltas)


def gpu_pipeline(folder: Path, forward=(10_000, 12_000, 10_000, 10_000)) -> Path:
    return write_pipeline(folder, simulate("1f1b", 4, 8, list(forward), [2 * f for f in forward]),
                          spin_before_forward=2_000)


@pytest.mark.parametrize("name", SAMPLES)
def test_a_sample_against_itself_is_identical(name):
    assert_identical(diff(report(ROOT / "sample_traces" / name), report(ROOT / "sample_traces" / name), 0.0))


@pytest.mark.parametrize("name", CPU_RUNS)
def test_a_cpu_pipeline_run_against_itself_is_identical(name):
    data = report(shared("pipeline_cpu", name))
    assert_identical(diff(data, copy.deepcopy(data), 0.0))


@pytest.mark.parametrize("parts", SHARED, ids=lambda p: p[1])
def test_a_real_trace_against_itself_is_identical(parts):
    data = report(shared(*parts))
    assert_identical(diff(data, copy.deepcopy(data), 0.0))


@pytest.mark.parametrize("where", [*(("sample_traces", n) for n in SAMPLES[:3]), *(("cpu", n) for n in CPU_RUNS)])
def test_the_same_job_recorded_again_under_other_pids_is_identical(tmp_path, where):
    kind, name = where
    source = ROOT / "sample_traces" / name if kind == "sample_traces" else shared("pipeline_cpu", name)
    again = rerecord_folder(source, tmp_path / "again")
    base, new = report(source), report(again)
    assert {lane["pid"] for lane in base["lanes"]}.isdisjoint(lane["pid"] for lane in new["lanes"])  # new PIDs
    assert_identical(diff(base, new, 0.0))


def test_a_synthetic_gpu_pipeline_recorded_again_compares_kernels_gpus_and_waits(tmp_path):
    source = gpu_pipeline(tmp_path / "base")
    base, new = report(source), report(rerecord_folder(source, tmp_path / "again", offset=12345))
    result = diff(base, new, 0.0)
    assert_identical(result)
    keys = {d.key.split("[")[0].split(".")[0] for d in result.deltas}
    assert {"pipeline", "stages", "lanes", "breakdown", "kernels", "waits"} <= keys


def test_lane_names_hold_no_pid_or_tid_and_are_unique():
    for path in (ROOT / "sample_traces" / "pipeline_1f1b", shared("nsys", "torchrun_2xh100_nccl.sqlite"),
                 shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")):
        lanes = report(path)["lanes"]
        names = lane_names(lanes)
        pids = {str(x) for lane in lanes for x in (lane["pid"], lane["tid"]) if x is not None and abs(x) > 99}
        assert len(set(names.values())) == len(lanes)
        assert not any(pid in name for name in names.values() for pid in pids), names
        assert all(re.fullmatch(r"(rank\d+/)?(process\d+/)?(gpu\d+(/stream\d+)?|thread\d+)", n) for n in names.values())


def wait(dur_ms: float, start: int, **where) -> dict:
    return {"stage": 1, "start_ns": start, "dur_ns": int(dur_ms * 1e6), "cause": "downstream", "before": "B4",
            "after": "B5", "step": 1, "lane": "rank1/pid777/tid777", "rank": None, "waited_for": None, **where}


def minimal(waits: list[dict], pid: int = 777) -> dict:
    lanes = [{"lane": f"rank1/pid{pid}/tid{pid}", "kind": "cpu", "rank": 1, "pid": pid, "tid": pid, "device": None,
              "stream": None, "busy_ns": 10**8, "idle_ns": 10**7, "window_start_ns": 0, "window_end_ns": 11 * 10**7}]
    pipeline = {"bubble_fraction": 0.3, "step_time_ns": 100_000_000}
    return {"lanes": lanes, "pipeline": pipeline, "waits": [{**w, "lane": lanes[0]["lane"]} for w in waits]}


def test_waits_with_the_same_key_pair_in_order_not_overwriting_each_other():
    """The issue's case: two waits of one key, 7.26 ms and 0.245 ms; a diff with itself regressed."""
    waits = [wait(7.26, 1_000), wait(0.245, 50_000_000)]
    result = diff(minimal(waits), minimal(list(reversed(waits)), pid=999), 0.05)
    assert_identical(result)
    assert sorted(d.base for d in result.deltas if d.key.startswith("waits")) == [245_000, 7_260_000]


def test_a_waits_change_is_relative_to_the_wait_and_small_growth_fails_nothing():
    base = minimal([wait(10.0, 1_000), wait(0.2, 50_000_000)])
    new = minimal([wait(20.0, 1_000), wait(0.4, 50_000_000)], pid=4242)
    deltas = {d.base: d for d in diff(base, new, 0.05).deltas if d.key.startswith("waits")}
    assert deltas[10_000_000].change == pytest.approx(1.0) and deltas[10_000_000].status == "regressed"
    # doubled, but by 0.2 ms in a 100 ms step: shown, relative to the wait, and within tolerance of the step
    assert deltas[200_000].change == pytest.approx(1.0) and deltas[200_000].status == "ok"
    gone = diff(new, minimal([], pid=1), 0.05)
    assert {d.status for d in gone.deltas if d.key.startswith("waits")} == {"improved", "ok"}


def test_tolerance_is_relative_to_the_baseline_value_and_lower_can_be_worse():
    up = judge("step time", 100.0, 105.5, "ns", 0.05)
    assert up.status == "regressed" and up.limit == pytest.approx(105.0) and up.change == pytest.approx(0.055)
    assert judge("step time", 100.0, 104.9, "ns", 0.05).status == "ok"
    assert judge("step time", 100.0, 90.0, "ns", 0.05).status == "improved"
    efficiency = judge("pipeline efficiency", 0.8, 0.7, "fraction", 0.05, worse="lower")
    assert efficiency.status == "regressed" and efficiency.limit == pytest.approx(0.76)
    zero = judge("excess bubble", 0.0, 0.04, "fraction", 0.05, scale=1.0)  # from 0: against the scale
    assert zero.status == "ok" and zero.change is None and zero.limit == pytest.approx(0.05)


def test_a_slower_kernel_and_more_idle_gpu_regress(tmp_path):
    base = report(gpu_pipeline(tmp_path / "base"))
    slow = report(gpu_pipeline(tmp_path / "slow", (10_000, 15_000, 10_000, 10_000)))
    names = {d.metric for d in diff(base, slow, 0.05).regressions}
    assert "kernel gemm_F total" in names and "kernel gemm_B total" in names
    assert {"lane rank0/gpu0 idle", "step time", "idle GPU time per step"} <= names


def test_a_report_saved_before_short_names_matches_its_kernels_by_full_name():
    """A kernel is the same kernel by its full name: an older report (full names in ``name``, no
    ``name_full``) against a new one of the same trace has every kernel matched, labelled by its short name."""
    new = report(shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"))
    old = copy.deepcopy(new)
    for k in old["kernels"]:
        k["name"] = k.pop("name_full")
    result = diff(old, new, 0.0)
    assert_identical(result)
    kernels = [d for d in result.deltas if d.metric.startswith("kernel ")]
    assert kernels and all("(" not in d.metric and "<" not in d.metric for d in kernels)
    assert "kernels[comm:ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)].total_ns" in {
        d.key for d in kernels}


def test_a_cpu_pipeline_bills_cpu_time():
    """The idle per step of a pipeline of CPU ranks (gloo, no GPU lane) is CPU time, as the report says."""
    base = report(ROOT / "sample_traces" / "pipeline_1f1b")
    slow = report(ROOT / "sample_traces" / "pipeline_1f1b_imbalanced")
    names = {d.metric: d for d in diff(base, slow, 0.05).deltas}
    assert "idle CPU time per step" in names and "idle GPU time per step" not in names
    assert names["idle CPU time per step"].key == "pipeline.idle_gpu_ns_per_step"


def test_structure_only_in_one_report_is_unmatched_and_fails_with_strict(tmp_path):
    pipe = report(ROOT / "sample_traces" / "pipeline_1f1b")
    single = report(ROOT / "sample_traces" / "toy_train")
    loose, strict = diff(pipe, single, 0.05), diff(pipe, single, 0.05, strict=True)
    assert any("pipeline only in the base report" in n for n in loose.unmatched)
    assert any("lane(s) only in the base report" in n for n in loose.unmatched)
    assert not loose.failed and strict.failed
