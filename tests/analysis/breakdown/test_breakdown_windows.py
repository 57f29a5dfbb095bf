"""The GPU breakdown of a spilled table, read in time windows, is the breakdown of the whole table to the
nanosecond: on random tables with windows of one or a few operations, on real traces, and through the
command line with a budget so small that every trace spills into windows of a thousand spans."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from conftest import shared
from hypothesis import given, settings
from hypothesis import strategies as st
from spilled import comparable  # noqa: E402

from pipebubble import budget, spans
from pipebubble.analysis import breakdown as bd
from pipebubble.analysis.breakdown.part import GpuPart
from pipebubble.analysis.breakdown.windows import gpu_part_windowed, narrow
from pipebubble.ingest import read_file
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[3]
FRAMES = ("stats", "api", "ranges", "ops", "delays", "streams", "gaps", "calls")




def windowed(table: pl.DataFrame, rows: int, alone: bool, step_regex: str | None = None,
             scratch: Path | None = None) -> GpuPart:
    """``table``'s breakdown in windows of ``rows`` operations (``scratch``: where their launch delays go)."""
    scan = table.lazy()
    ops, launches = (q.collect().lazy() for q in narrow(scan))
    return gpu_part_windowed(scan, ops, launches, step_regex, alone, rows, scratch=scratch)


def assert_same(a: GpuPart, b: GpuPart) -> None:
    assert a.rows == b.rows
    assert a.delay == b.delay and a.short == b.short
    for name in FRAMES:
        x, y = getattr(a, name), getattr(b, name)
        if x.width or y.width:
            assert x.sort(x.columns).equals(y.sort(y.columns)), name


def table(rows: list[dict]) -> pl.DataFrame:
    return spans.conform(pl.DataFrame(rows, infer_schema_length=None)) if rows else spans.empty()


KINDS = ("kernel", "kernel", "comm", "memcpy", "memset")


@st.composite
def jobs(draw) -> pl.DataFrame:
    """One rank: GPU operations on two GPUs (every class, touching and overlapping, some at the same start),
    their launches on two threads (some ids launched twice, some never), syncs, a collective range and
    profiler steps; in ns, or in units of 10 µs (then a blocking call's refill reaches less far than the
    trace is long, and ops launched long before their gap lie outside the host spans a window reads)."""
    frame = _job(draw)
    unit = draw(st.sampled_from([1, 10_000]))
    return frame.with_columns(pl.col("start", "end") * unit) if unit > 1 else frame


def _job(draw) -> pl.DataFrame:
    rows = []
    n = draw(st.integers(1, 24))
    for _ in range(n):
        device = draw(st.integers(0, 1))
        start = draw(st.integers(0, 400))
        corr = draw(st.one_of(st.none(), st.integers(1, n + 3)))
        rows.append(dict(rank=0, pid=None, device=device, lane=f"rank0/gpu{device}", kind=draw(st.sampled_from(KINDS)),
                         name=draw(st.sampled_from(["gemm", "add", "nccl", None])), start=start,
                         end=start + draw(st.integers(0, 60)), correlation=corr))
        if corr is not None and draw(st.booleans()):
            at = max(0, start - draw(st.integers(-5, 80)))
            thread = draw(st.integers(0, 1))
            rows.append(dict(rank=0, pid=7, lane=f"rank0/t{thread}", kind="runtime", name="cudaLaunchKernel",
                             start=at, end=at + draw(st.integers(1, 9)), correlation=corr))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, 450))
        rows.append(dict(rank=0, pid=7, lane=f"rank0/t{draw(st.integers(0, 1))}", kind="sync",
                         name="cudaDeviceSynchronize", start=at, end=at + draw(st.integers(1, 50))))
    if draw(st.booleans()):
        at = draw(st.integers(0, 300))
        rows.append(dict(rank=0, pid=7, lane="rank0/t0", kind="cpu_op", name="nccl:all_reduce", start=at,
                         end=at + draw(st.integers(1, 100))))
    edge = 0
    for k in range(draw(st.integers(0, 3))):
        length = draw(st.integers(20, 200))
        rows.append(dict(rank=0, pid=7, lane="rank0/t0", kind="step", name=f"ProfilerStep#{k}", start=edge,
                         end=edge + length))
        edge += length + draw(st.integers(0, 30))
    return table(rows)


@settings(max_examples=40, deadline=None)
@given(jobs(), st.integers(1, 8), st.booleans(), st.booleans())
def test_windows_of_any_size_give_the_whole_tables_breakdown(frame, rows, alone, on_disk):
    """Tiny-kernel gaps counted window by window, and the launch delays held or written a window at a time
    (their summary and median read back in streaming passes), give what the whole table gives."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        got = windowed(frame, rows, alone, scratch=Path(scratch) if on_disk else None)
        assert_same(got, bd.gpu_part(frame, None, alone))


GPU_TRACES = [
    ("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"),
    ("kineto", "resnet_v100_ns_resolution.json.gz"),
    ("kineto", "mi250_rocm_toy_train.json.gz"),
    ("kineto", "recsys_128rank_sampled_rank-0.json.gz"),
    ("inference", "sglang_qwen3_8b_prefill_decode.json.gz"),
]


@pytest.mark.parametrize("where", GPU_TRACES, ids=[w[1].split(".")[0] for w in GPU_TRACES])
def test_real_traces_in_windows_of_a_few_hundred_operations(where):
    frame = read_file(shared(*where), use_cache=False).spans
    whole = bd.gpu_part(frame, None, True)
    assert whole.rows, "a trace with GPU work"
    for rows in (97, 1000):
        assert_same(windowed(frame, rows, True), whole)
    assert whole.gaps.height, "tiny kernels with gaps between them, counted across windows"


def test_a_table_without_gpu_work_has_no_rows():
    frame = table([dict(rank=0, pid=7, lane="rank0/t0", kind="runtime", name="cudaMalloc", start=0, end=5,
                        correlation=1)])
    assert_same(windowed(frame, 3, True), bd.gpu_part(frame, None, True))


@pytest.mark.parametrize(
    "where",
    [("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), ("kineto", "recsys_128rank_sampled_rank-0.json.gz"),
     ("pipeline_cpu", "1f1b"), "serve_chunked_prefill"],
    ids=["one-gpu-rank", "rank-of-a-big-job", "pipeline-folder", "serving"],
)
def test_a_tiny_budget_spills_every_trace_into_windows_and_changes_no_number(where, monkeypatch, tmp_path):
    """The least budget, every trace spilled (``SPILL_ENV`` 0) and read in windows of the fewest spans."""
    path = ROOT / "sample_traces" / where if isinstance(where, str) else shared(*where)
    in_memory = run([path], Options(), Scale(use_cache=False)).to_dict()
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(budget.SPILL_ENV, "0")
    monkeypatch.setenv(budget.WINDOW_ENV, str(budget.MIN_WINDOW_ROWS))
    monkeypatch.delenv(budget.ENV, raising=False)
    report = run([path], Options(), Scale(use_cache=True, memory_budget=budget.LEAST_BYTES)).to_dict()
    with budget.used(budget.LEAST_BYTES):
        assert budget.spill_bytes() == 0 and budget.rows_per_window() == budget.MIN_WINDOW_ROWS
    assert budget.ENV not in os.environ, "the budget is put back"
    assert list((tmp_path / "spill").iterdir()), "the trace was spilled"
    assert comparable(report) == comparable(in_memory)


@pytest.mark.parametrize("text, size", [("800M", 800 * 10**6), ("1.5G", 1_500_000_000), ("2GiB", 2 << 30),
                                        ("512mb", 512 * 10**6), ("4096000000", 4096 * 10**6),
                                        ("300000 Ki", 300000 * 1024)])
def test_budget_sizes(text, size):
    assert budget.parse(text) == size


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0", "1.5X"])
def test_a_budget_that_is_no_size_is_refused_by_name(text):
    with pytest.raises(budget.BudgetError, match="memory budget"):
        budget.parse(text)


def test_the_default_budget_is_a_share_of_available_memory(monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    monkeypatch.delenv(budget.SPILL_ENV, raising=False)
    monkeypatch.setattr(budget, "_available", lambda: 24 << 30)
    assert budget.budget_bytes() == 3 << 30
    assert budget.spill_bytes() == budget.SPILL_AT_MOST
    monkeypatch.setattr(budget, "_available", lambda: 1 << 30)
    assert budget.budget_bytes() == 512 << 20  # never below the floor
    work = (512 << 20) - budget.POOL_BYTES - budget.PROCESS_BYTES  # what the processes leave of it
    assert budget.spill_bytes() == int(work / budget.IN_MEMORY_FACTOR)
    monkeypatch.setenv(budget.ENV, "2G")
    assert budget.budget_bytes() == 2 * 10**9


def test_the_budget_flag(capsys, monkeypatch, tmp_path):
    from pipebubble import cli

    sample = ROOT / "sample_traces" / "pipeline_1f1b"
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(budget.ENV, raising=False)
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(sample), "--memory-budget", "lots"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and "memory budget 'lots' is not a size" in err
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(sample), "--memory-budget", "1.5G", "--format", "json", "-q"])
    assert done.value.code == 0 and json.loads(capsys.readouterr().out)["pipeline"]


def test_a_full_cache_volume_keeps_the_narrow_copies_in_memory(monkeypatch, tmp_path):
    import errno

    path = shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")
    in_memory = run([path], Options(), Scale(use_cache=False)).to_dict()
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(budget.SPILL_ENV, "1")
    monkeypatch.setenv(budget.WINDOW_ENV, str(budget.MIN_WINDOW_ROWS))  # windows of the fewest rows: it needs several

    from pipebubble.analysis.breakdown import windows

    class Full:  # a query whose output the full volume refuses
        def __init__(self, query):
            self.query = query

        def sink_parquet(self, target, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))

        def collect(self):
            return self.query.collect()

    real = windows.narrow
    monkeypatch.setattr(windows, "narrow", lambda scan, gpu=None: tuple(Full(q) for q in real(scan, gpu)))
    report = run([path], Options(), Scale(use_cache=False)).to_dict()
    warnings = report["ingest"].pop("warnings")
    assert any("No space left on device" in w and "held in memory instead" in w for w in warnings), warnings
    in_memory["ingest"].pop("warnings")
    assert comparable(report) == comparable(in_memory)
    assert not [p for p in (tmp_path / "spill").iterdir() if ".tmp-" in p.name], "no scratch folder left behind"


def test_spilled_ranks_of_a_job_that_is_not_a_pipeline_read_only_their_communication(monkeypatch, tmp_path):
    """Two ranks of a 128-rank recommender job (no labels, no sends: data parallel): each spilled rank gives
    its collectives and stage names from its communication rows and lanes, not from its whole table."""
    from pipebubble.analysis import registry

    ranks = sorted((ROOT.parent / "shared" / "traces" / "kineto").glob("recsys_128rank_sampled_rank-*.json.gz"))
    if len(ranks) < 2:
        pytest.skip("shared traces not present")
    in_memory = run(ranks, Options(), Scale(use_cache=False)).to_dict()
    read = []
    whole = registry.comm_rows

    def counted(scan):
        rows = whole(scan)
        read.append(rows.height)
        return rows

    monkeypatch.setattr(registry, "comm_rows", counted)
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(budget.SPILL_ENV, "1")
    spilled = run(ranks, Options(), Scale(use_cache=False, workers=1)).to_dict()
    assert comparable(spilled) == comparable(in_memory)
    total = sum(read_file(r, use_cache=False).meta["spans"] for r in ranks)  # spilled: counted, not held
    assert len(read) == 2 and sum(read) < total / 2, (read, total)
