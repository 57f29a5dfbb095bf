"""The per-GPU timeline of one step (``breakdown.strips``) and its text and SVG drawings
(``render.sections.gpu_timeline``): hand-built traces whose every bin is known, its sums against the breakdown
rows, and real traces."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import polars as pl
import pytest
import shapes
import synth
from conftest import ROOT, shared

from pipebubble import spans
from pipebubble.analysis import breakdown as bd
from pipebubble.analysis.breakdown import strips as st
from pipebubble.ingest import read_file
from pipebubble.render.sections import gpu_timeline as gt

SVG = "{http://www.w3.org/2000/svg}"


def table(rows: list[tuple]) -> pl.DataFrame:
    """Spans from (rank, kind, name, start, end, correlation) rows: GPU kinds on ``rank{r}/gpu{r}``, the rest
    on the rank's thread."""
    frame = pl.DataFrame(rows, schema=["rank", "kind", "name", "start", "end", "correlation"], orient="row")
    gpu = pl.col("kind").is_in(spans.GPU_WORK)
    rank = pl.col("rank").cast(pl.String)
    return spans.conform(frame.with_columns(
        source=pl.lit("t") + rank, pid=pl.lit(7), tid=pl.when(~gpu).then(pl.lit(1)),
        device=pl.when(gpu).then(pl.col("rank")), stream=pl.when(gpu).then(pl.lit(7)),
        lane=pl.when(gpu).then(pl.lit("rank") + rank + "/gpu" + rank).otherwise(pl.lit("rank") + rank + "/cpu/1"),
    ))


#: Two GPUs, steps 7 [0,40) and 8 [40,60), 4 bins a step (10 ns, then 5 ns). GPU 0: compute, comm, memcpy,
#: then idle until a kernel launched late (at 40, idle since 30 while its thread ran nothing traced: python);
#: step 8: that kernel, then idle after its last op (unknown). GPU 1: compute, idle while its thread
#: synchronizes (sync_stall), compute, idle while it is in an all-reduce (peer); step 8: the kernel that ended
#: the wait, and idle after it. Every kernel is launched in the step it runs in, so the steps keep their ranges.
TWO_GPUS = [
    (0, "kernel", "gemm", 0, 10, 1), (0, "comm", "ncclDevKernel_AllReduce", 10, 20, 2),
    (0, "memcpy", "Memcpy DtoH", 20, 30, 3), (0, "kernel", "gemm", 40, 50, 4),
    (0, "runtime", "cudaLaunchKernel", -3, -2, 1), (0, "runtime", "cudaLaunchKernel", 40, 41, 4),
    (1, "kernel", "gemm", 0, 10, 1), (1, "kernel", "gemm", 20, 30, 2), (1, "kernel", "gemm", 40, 45, 3),
    (1, "runtime", "cudaLaunchKernel", -3, -2, 1), (1, "sync", "cudaStreamSynchronize", 5, 19, None),
    (1, "runtime", "cudaLaunchKernel", 19, 20, 2), (1, "cpu_op", "c10d::allreduce_", 25, 40, None),
    (1, "runtime", "cudaLaunchKernel", 40, 41, 3),
    *[(r, "step", f"ProfilerStep#{n}", a, b, None) for r in (0, 1) for n, a, b in ((7, 0, 40), (8, 40, 60))],
]
H = st.CLASSES.index("python")


def classes(frame: pl.DataFrame) -> dict[tuple[str, int], list[str]]:
    """(lane, step): the one class that fills each bin."""
    found: dict[tuple[str, int], list[str]] = {}
    for r in frame.sort("lane", "step", "bin").iter_rows(named=True):
        filled = [c for c in st.CLASSES if r[c]]
        assert len(filled) == 1, r
        found.setdefault((r["lane"], r["step"]), []).append(filled[0])
    return found


def test_every_bin_of_two_gpus_has_the_class_that_fills_it():
    bins = st.strip_bins(table(TWO_GPUS), bins=4)
    assert classes(bins) == {
        ("rank0/gpu0", 7): ["compute", "comm", "memory", "python"],
        ("rank0/gpu0", 8): ["compute", "compute", "unknown", "unknown"],
        ("rank1/gpu1", 7): ["compute", "sync_stall", "compute", "peer"],
        ("rank1/gpu1", 8): ["compute", "unknown", "unknown", "unknown"],
    }
    width = pl.sum_horizontal(st.CLASSES)
    assert bins.filter(pl.col("step") == 7).select(width.unique()).to_series().to_list() == [10]
    assert bins.filter(pl.col("median"))["step"].unique().to_list() == [8]  # 20 ns, the lower median of 20, 40


def test_the_job_draws_the_median_step_on_every_gpu():
    job = st.job_strips(st.strip_bins(table(TWO_GPUS), bins=4))
    assert job.step == 8 and job.missing == [] and job.classes == list(st.CLASSES)
    assert [(s.lane, s.rank, s.start_ns, s.end_ns) for s in job.rows] == [("rank0/gpu0", 0, 40, 60),
                                                                          ("rank1/gpu1", 1, 40, 60)]
    only = [[5 if c == name else 0 for c in st.CLASSES] for name in ("compute", "unknown")]
    assert job.rows[1].bins == [only[0]] + [only[1]] * 3


def test_the_steps_on_most_gpus_are_drawn_and_the_others_said():
    three = TWO_GPUS + [(2, "kernel", "gemm", 0, 10, 1), (2, "step", "ProfilerStep#9", 0, 12, None)]
    job = st.job_strips(st.strip_bins(table(three), bins=4))
    assert job.step == 8 and job.missing == ["rank2/gpu2"]
    assert gt.text(job, 80)[-1] == "1 GPU without this step not shown"


def test_without_steps_each_gpu_draws_its_whole_window():
    bins = st.strip_bins(table([r for r in TWO_GPUS if r[1] != "step"]), bins=5)
    assert bins["step"].null_count() == bins.height == 10
    job = st.job_strips(bins)
    assert job.step is None and [(s.start_ns, s.end_ns) for s in job.rows] == [(0, 50), (0, 45)]
    assert [row[H] for row in job.rows[0].bins] == [0, 0, 0, 10, 0]  # [30,40) before the late launch
    assert gt.text(job, 80)[0].startswith("GPU timeline, the whole trace (no steps): ")


def test_one_gpu_sums_to_its_breakdown_rows():
    frame = table([r for r in TWO_GPUS if r[0] == 0])
    assert_sums_match(frame, st.strip_bins(frame))


def test_nothing_on_a_gpu_gives_no_rows():
    assert st.strip_bins(spans.empty()).is_empty()
    assert st.strip_bins(table([(0, "cpu_op", "aten::mm", 0, 5, None)])).schema == st.SCHEMA
    job = st.job_strips(st.empty_bins())
    assert job.rows == [] and gt.text(job, 80) == [] and gt.svg(job) == ""


def test_steps_are_capped_nearest_the_median_and_overlapping_ones_left_out():
    n = st.MAX_STEPS + 8
    many = [(0, "kernel", "gemm", 0, 100 * n, 1)]
    many += [(0, "step", f"ProfilerStep#{k}", 100 * k, 100 * k + 50 + k, None) for k in range(n)]
    kept = st.strip_bins(table(many), bins=2)["step"].unique().sort().to_list()
    assert kept == list(range(3, 35))  # the median is step 19: the 32 nearest it (ties: the shorter)
    nested = [(0, "kernel", "gemm", 0, 100, 1), (0, "step", "ProfilerStep#1", 0, 50, None),
              (0, "step", "ProfilerStep#2", 40, 60, None), (0, "step", "ProfilerStep#3", 60, 90, None)]
    assert st.strip_bins(table(nested), bins=2)["step"].unique().sort().to_list() == [1, 3]


def assert_sums_match(frame: pl.DataFrame, bins: pl.DataFrame) -> None:
    """Each (lane, step)'s bins add up to its breakdown row: compute, exposed comm, exposed memory, each cause."""
    rows = {(r.lane, r.step): r for r in bd.gpu_part(frame).rows}
    sums = bins.group_by("lane", "step").agg(pl.col(st.CLASSES).sum())
    assert sums.height
    for s in sums.iter_rows(named=True):
        row = rows[(s["lane"], s["step"])]
        want = [row.compute_ns, row.comm_exposed_ns, row.memory_exposed_ns, *row.idle_causes.values()]
        assert [s[c] for c in st.CLASSES] == want, (s["lane"], s["step"])


def lanes(count: int, steps: int = 2) -> pl.DataFrame:
    """``count`` GPUs, each a compute and an all-reduce per 1 ms step, the compute longer on higher ranks."""
    rows = []
    for r in range(count):
        for k in range(steps):
            base = 1_000_000 * k
            rows += [(r, "kernel", "gemm", base + 10_000, base + 400_000 + 1_000 * r, 2 * k),
                     (r, "comm", "ncclDevKernel_AllReduce", base + 600_000, base + 900_000, 2 * k + 1),
                     (r, "step", f"ProfilerStep#{k}", base, base + 1_000_000, None)]
    return table(rows)


def test_two_hundred_gpus_draw_sixty_four_rows_in_text_and_every_one_in_svg():
    job = st.job_strips(st.strip_bins(lanes(200)))
    assert len(job.rows) == 200 and job.step == 0
    lines = gt.text(job, 120, marks=[("rank150/gpu150", "late rank"), (3, "straggler")])
    bars = [line for line in lines if "│" in line]
    assert len(bars) == gt.TEXT_ROWS and lines[-1].startswith("… 136 more GPUs not shown")
    assert bars[3].endswith("│ ◀ straggler") and bars[-1].startswith("r150/gpu150 │")
    assert bars[-1].endswith("◀ late rank")
    tree = ET.fromstring(gt.svg(job, marks=[("rank150/gpu150", "late rank")]))
    labels = [t for t in tree.iter(f"{SVG}text") if t.find(f"{SVG}title") is not None]
    assert len(labels) == 200
    outlined = [r for r in tree.iter(f"{SVG}rect") if r.get("stroke")]
    assert len(outlined) == 1


@pytest.mark.parametrize("width", [80, 120, 200])
def test_text_fits_the_width(width):
    job = st.job_strips(st.strip_bins(table(TWO_GPUS)))
    lines = gt.text(job, width, marks=[(0, "launch-bound: the host launched late")])
    assert all(len(line) <= width for line in lines), lines
    bar = lines[1]
    assert bar.startswith("r0/gpu0 │█") and "◀ launch" in bar
    assert bar.index("│", 10) - bar.index("│") - 1 >= gt.MIN_BAR
    legend = {item.strip() for line in lines for item in line.split("   ")}
    assert {"█ compute", "· idle: unknown"} <= legend  # the classes the drawn step holds, no others
    assert "y idle: CPU-bound (Python / untraced)" not in legend


def in_ms(rows: list[tuple]) -> list[tuple]:
    """The rows with their times read as ms."""
    return [(*r[:3], r[3] * 1_000_000, r[4] * 1_000_000, r[5]) for r in rows]


def test_svg_draws_runs_of_like_bins_as_one_and_says_their_times():
    job = st.job_strips(st.strip_bins(table(in_ms(TWO_GPUS)), bins=4))
    tree = ET.fromstring(gt.svg(job))
    titles = [r.find(f"{SVG}title").text for r in tree.iter(f"{SVG}rect")]
    assert titles == ["rank0/gpu0: compute 10.00 ms (100.0%) of 0.00–10.00 ms",
                      "rank0/gpu0: idle: unknown 10.00 ms (100.0%) of 10.00–20.00 ms",
                      "rank1/gpu1: compute 5.00 ms (100.0%) of 0.00–5.00 ms",
                      "rank1/gpu1: idle: unknown 15.00 ms (100.0%) of 5.00–20.00 ms"]
    assert next(tree.iter(f"{SVG}text")).text == "GPU timeline, step 8: 20.00 ms, one column = 0.02 ms"
    assert "idle: unknown" in gt.legend_html(job) and "idle: sync stall" not in gt.legend_html(job)


def test_svg_stacks_the_classes_of_a_bin():
    job = st.job_strips(st.strip_bins(table(in_ms(TWO_GPUS)), bins=2))
    stack = [r for r in ET.fromstring(gt.svg(job)).iter(f"{SVG}rect") if "rank1" in r.find(f"{SVG}title").text]
    assert [(r.get("fill"), float(r.get("height"))) for r in stack[:2]] == [
        (gt.LOOK["compute"][2], gt.BAR_H / 2), (gt.LOOK["unknown"][2], gt.BAR_H / 2)]
    assert float(stack[1].get("y")) == float(stack[0].get("y")) + gt.BAR_H / 2


REAL = {  # trace: GPU rows
    ("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"): 1,
    ("kineto", "resnet_v100_ns_resolution.json.gz"): 1,
    ("nsys", "torchrun_2xh100_nccl.sqlite"): 2,
    ("inference", "sglang_qwen3_8b_prefill_decode.json.gz"): 1,
}


@pytest.mark.parametrize("where", REAL, ids=[name for _, name in REAL])
def test_real_traces_sum_to_their_breakdown(where):
    frame = read_file(shared(*where), use_cache=False).spans
    bins = st.strip_bins(frame)
    assert_sums_match(frame, bins)
    job = st.job_strips(bins)
    assert len(job.rows) == REAL[where]
    assert sum("│" in line for line in gt.text(job, 80)) == REAL[where]
    ET.fromstring(gt.svg(job, marks=[(job.rows[0].lane, "top finding")]))


def test_a_two_rank_data_parallel_job_draws_both_ranks():
    frames = [read_file(shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz"), use_cache=False).spans
              for r in (0, 1)]
    job = st.job_strips(pl.concat([st.strip_bins(f) for f in frames]))
    assert [s.rank for s in job.rows] == [0, 1] and job.step is not None and not job.missing


def test_synthetic_jobs_draw_every_gpu(tmp_path):
    pipeline = synth.write_pipeline(tmp_path / "pp", synth.simulate("1f1b", 4, 4, [1_000_000] * 4, [2_000_000] * 4))
    dp = shapes.data_parallel(tmp_path / "dp", [1.0, 1.5, 2.0])
    for folder, gpus in ((pipeline, 4), (dp, 3)):
        frame = pl.concat([read_file(p, use_cache=False).spans for p in sorted(folder.glob("rank*.json"))])
        job = st.job_strips(st.strip_bins(frame))
        assert len(job.rows) == gpus


def test_cpu_only_samples_have_no_gpu_rows():
    for name in ("pipeline_1f1b", "serve"):
        frame = read_file(ROOT / "sample_traces" / name / "rank0.pt.trace.json.gz", use_cache=False).spans
        assert st.strip_bins(frame).is_empty()
