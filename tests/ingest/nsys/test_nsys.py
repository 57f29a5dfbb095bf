"""Nsight Systems ingest: the real 2-GPU export, small exports in old layouts, parquetdir, reports, clocks."""

from __future__ import annotations

import os
import sqlite3
import stat
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import nsys
from pipebubble.ingest.base import FileResult
from pipebubble.spans import GPU_WORK, validate

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    import nsys_fixtures as fx

SHARED = Path(__file__).resolve().parents[4] / "shared" / "traces" / "nsys"
REAL = SHARED / "torchrun_2xh100_nccl.sqlite"
needs_real = pytest.mark.skipif(not REAL.exists(), reason="shared traces folder ../shared/traces is absent")



def idle_percent(spans: pl.DataFrame, lane: str) -> float:
    rows = spans.filter((pl.col("lane") == lane) & pl.col("kind").is_in(GPU_WORK)).select("start", "end")
    busy, first, last = fx.union(list(rows.iter_rows()))
    return 100 * (last - first - busy) / (last - first)


def accounted(result: FileResult) -> bool:
    return result.events_read == result.spans.height + sum(result.skipped.values())


# --- the real export ---


@pytest.fixture(scope="module")
def real() -> FileResult:
    return nsys.read(REAL)


@needs_real
def test_real_two_gpu_lanes_with_published_idle(real: FileResult) -> None:
    gpu_lanes = sorted(real.spans.filter(pl.col("kind").is_in(GPU_WORK))["lane"].unique())
    assert gpu_lanes == ["pid144/gpu0", "pid145/gpu1"]
    assert round(idle_percent(real.spans, "pid144/gpu0"), 2) == 8.68
    assert round(idle_percent(real.spans, "pid145/gpu1"), 2) == 10.51


@needs_real
def test_real_gpu_union_matches_raw_rows(real: FileResult) -> None:
    conn = sqlite3.connect(REAL)
    for device, lane in ((0, "pid144/gpu0"), (1, "pid145/gpu1")):
        raw = []
        for table in ("KERNEL", "MEMCPY", "MEMSET"):
            sql = f"SELECT start, end FROM CUPTI_ACTIVITY_KIND_{table} WHERE deviceId = ?"
            raw += conn.execute(sql, (device,)).fetchall()
        rows = real.spans.filter((pl.col("lane") == lane) & pl.col("kind").is_in(GPU_WORK)).select(
            "start", "end"
        )
        assert fx.union(raw) == fx.union(list(rows.iter_rows()))


@needs_real
def test_real_through_lane_table(real: FileResult) -> None:
    lanes = pytest.importorskip("pipebubble.analysis.lanes")
    table = lanes.lane_table(real.spans).filter((pl.col("kind") == "gpu") & pl.col("stream").is_null())
    idle = {
        r["lane"]: 100 * r["idle_ns"] / (r["window_end_ns"] - r["window_start_ns"]) for r in table.to_dicts()
    }
    assert {k: round(v, 2) for k, v in idle.items()} == {"pid144/gpu0": 8.68, "pid145/gpu1": 10.51}


@needs_real
def test_real_kernels_join_their_own_process_launches(real: FileResult) -> None:
    spans = real.spans
    kernels = spans.filter(pl.col("kind").is_in(["kernel", "comm"])).select("pid", "correlation", "start")
    calls = spans.filter(pl.col("kind") == "runtime").select(
        "pid", "correlation", "name", launch=pl.col("start")
    )
    # correlationId repeats across the two processes: joining on it alone would mix them up.
    assert kernels.join(calls, on="correlation").filter(pl.col("pid") != pl.col("pid_right")).height > 0
    joined = kernels.join(calls, on=["pid", "correlation"])
    assert joined.height >= 0.99 * kernels.height
    assert (joined["launch"] <= joined["start"]).all()
    assert set(joined["name"]) <= {
        "cudaLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchKernel",
        "cudaGraphLaunch",
    }


@needs_real
def test_real_table_is_sound_and_accounted(real: FileResult) -> None:
    assert validate(real.spans) == []
    assert accounted(real)
    assert real.meta["session_start_ns"] == 1779782330176752435
    assert real.meta["nsys_version"].startswith("2026.2")
    assert real.meta["process_names"][144] == "python3"
    comm = real.spans.filter(pl.col("kind") == "comm")["name"]
    assert comm.len() > 0 and comm.str.contains("nccl").all()
    cpu = real.spans.filter(pl.col("kind").is_in(["runtime", "annotation", "sync"]))
    assert cpu["lane"].str.contains(r"^pid\d+/cpu/\d+$").all() and cpu["tid"].null_count() == 0


@needs_real
def test_real_reads_as_parquetdir(real: FileResult, tmp_path: Path) -> None:
    folder = fx.to_parquetdir(REAL, tmp_path / "export")
    assert nsys.sniff(folder)
    other = nsys.read(folder)
    assert other.spans.drop("source").equals(real.spans.drop("source"))


# --- small exports in the layouts of several releases ---


def two_process_trace() -> fx.Trace:
    """Two processes whose correlation ids collide, each driving one GPU from its own threads."""
    t = fx.Trace(processes={100: "python3", 200: "python3"})
    for pid, device, tid in ((100, 0, 11), (200, 1, 21)):
        t.gpu += [
            fx.Gpu(pid, device, 7, 1_000, 2_000, name="void gemm<float>(int)", correlation=1, launch_tid=tid),
            fx.Gpu(pid, device, 8, 1_500, 2_500, name="gemm_bias", correlation=2, launch_tid=tid),
            fx.Gpu(pid, device, 7, 3_000, 3_200, kind="memcpy", correlation=3),
            fx.Gpu(pid, device, 7, 4_000, 4_100, kind="memset", correlation=4),
            fx.Gpu(
                pid,
                device,
                9,
                5_000,
                6_000,
                name="ncclDevKernel_SendRecv(x)",
                correlation=5,
                launch_tid=tid + 1,
            ),
            fx.Gpu(pid, device, 7, 7_000, 7_500, kind="graph", correlation=6),
        ]
        t.nvtx += [
            fx.Nvtx(pid, tid, 900, 2_600, "F0.0.1"),
            fx.Nvtx(pid, tid, 950, 2_000, "aten::mm"),
            fx.Nvtx(pid, tid, 960, None, "never popped"),
            fx.Nvtx(pid, tid, 970, 970, "a mark", event_type=34),
            fx.Nvtx(pid, tid + 1, 4_900, 6_100, "send", event_type=60, range_id=pid),
        ]
        t.syncs.append((pid, 1_000 - 50, 1_000 - 40, 1, 3))
    return t


def expected_idle(trace: fx.Trace, pid: int) -> float:
    busy, first, last = fx.union([(g.start, g.end) for g in trace.gpu if g.pid == pid])
    return 100 * (last - first - busy) / (last - first)


def write_export(tmp_path: Path, layout: str, container: str, trace: fx.Trace | None = None) -> Path:
    path = fx.write(trace or two_process_trace(), tmp_path / f"report-{layout}.sqlite", layout)
    return fx.to_parquetdir(path, tmp_path / f"report-{layout}") if container == "parquetdir" else path


@pytest.mark.parametrize("container", ["sqlite", "parquetdir"])
@pytest.mark.parametrize("layout", fx.LAYOUTS)
def test_layouts_give_the_same_lanes(tmp_path: Path, layout: str, container: str) -> None:
    trace = two_process_trace()
    path = write_export(tmp_path, layout, container, trace)
    result = nsys.read(path)
    spans = result.spans
    assert nsys.sniff(path) and validate(spans) == [] and accounted(result)
    assert result.skipped == {"nvtx_unmatched": 2, "nvtx_mark": 2}
    assert result.warnings == []
    for pid, lane in ((100, "pid100/gpu0"), (200, "pid200/gpu1")):
        assert idle_percent(spans, lane) == pytest.approx(expected_idle(trace, pid))
    gpu = spans.filter(pl.col("lane") == "pid100/gpu0").sort("start")
    assert gpu["kind"].to_list() == ["kernel", "kernel", "memcpy", "memset", "comm", "kernel"]
    assert gpu["name"].to_list() == [
        "void gemm<float>(int)", "gemm_bias", "Memcpy HtoD", "Memset", "ncclDevKernel_SendRecv(x)",
        "cudaGraphLaunch graph 7",
    ]  # fmt: skip
    assert set(gpu["stream"]) == {7, 8, 9} and gpu["rank"].null_count() == gpu.height


@pytest.mark.parametrize("layout", fx.LAYOUTS)
def test_layouts_join_launches_within_a_process(tmp_path: Path, layout: str) -> None:
    spans = nsys.read(write_export(tmp_path, layout, "sqlite")).spans
    calls = spans.filter(pl.col("kind") == "runtime")
    assert set(calls["name"]) == {"cudaLaunchKernel"}
    kernels = spans.filter(pl.col("kind").is_in(["kernel", "comm"]) & pl.col("correlation").is_in([1, 2, 5]))
    joined = kernels.join(calls, on=["pid", "correlation"], suffix="_call")
    assert joined.height == 6
    assert sorted(set(joined.select("pid", "tid_call").iter_rows())) == [
        (100, 11),
        (100, 12),
        (200, 21),
        (200, 22),
    ]


@pytest.mark.parametrize("layout", fx.LAYOUTS)
def test_layouts_nvtx_and_sync_on_thread_lanes(tmp_path: Path, layout: str) -> None:
    spans = nsys.read(write_export(tmp_path, layout, "sqlite")).spans
    notes = spans.filter(pl.col("kind") == "annotation").sort("pid", "start")
    assert notes["name"].to_list() == ["F0.0.1", "aten::mm", "send"] * 2
    assert notes["lane"].to_list()[:3] == ["pid100/cpu/11", "pid100/cpu/11", "pid100/cpu/12"]
    sync = spans.filter(pl.col("kind") == "sync").sort("pid")
    assert sync["lane"].to_list() == ["pid100/cpu/11", "pid200/cpu/21"]
    assert sync["name"].to_list() == ["Stream sync"] * 2


@pytest.mark.parametrize("layout", fx.LAYOUTS)
def test_layouts_session_start(tmp_path: Path, layout: str) -> None:
    result = nsys.read(write_export(tmp_path, layout, "sqlite"))
    clock = 0 if layout == "2022" else fx.CLOCK_AT_SESSION_START
    assert result.meta["session_start_ns"] == fx.SESSION_UTC_NS
    assert result.meta["session_start_clock_ns"] == clock
    assert result.meta["nsys_version"] == f"{layout}.1.0"
    assert result.meta["process_names"] == {100: "python3", 200: "python3"}


@pytest.mark.parametrize("layout", ["2022", "2026"])
def test_non_utf8_text_is_replaced_not_fatal(tmp_path: Path, layout: str) -> None:
    trace = two_process_trace()
    trace.nvtx.append(fx.Nvtx(100, 11, 10, 20, b"step \xff\xfe 3"))
    spans = nsys.read(fx.write(trace, tmp_path / "bad.sqlite", layout)).spans
    assert "step \ufffd\ufffd 3" in spans.filter(pl.col("kind") == "annotation")["name"].to_list()


# --- exports with little or nothing to analyse ---


def test_no_cuda_or_nvtx_tables_says_cuda_tracing_was_off(tmp_path: Path) -> None:
    path = fx.write(fx.Trace(cuda_tables=False), tmp_path / "osrt.sqlite")
    assert nsys.sniff(path)  # an Nsight export by its session tables, with nothing traced that becomes a span
    expected = r"osrt.sqlite: nothing to analyse: .*CUDA tracing was off.*--trace=cuda"
    with pytest.raises(TraceFormatError, match=expected):
        nsys.read(path)


def test_string_table_alone_is_not_an_export(tmp_path: Path) -> None:
    path = tmp_path / "strings.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE StringIds (id INTEGER, value TEXT)").connection.commit()
    assert not nsys.sniff(path)
    with pytest.raises(TraceFormatError, match="strings.sqlite: not an Nsight Systems export"):
        nsys.read(path)


def test_empty_cuda_tables_is_a_format_error(tmp_path: Path) -> None:
    path = fx.write(fx.Trace(), tmp_path / "idle.sqlite")
    with pytest.raises(TraceFormatError, match="idle.sqlite: nothing to analyse"):
        nsys.read(path)


def test_nvtx_only_export_warns_about_kernels(tmp_path: Path) -> None:
    trace = fx.Trace(cuda_tables=False, nvtx=[fx.Nvtx(1, 1, 0, 10, "step 0")])
    result = nsys.read(fx.write(trace, tmp_path / "nvtx.sqlite", "2023"))
    assert result.spans["kind"].to_list() == ["annotation"]
    assert result.warnings == [nsys.NO_CUDA]


@pytest.mark.parametrize("content", [b"{}", b"SQLite format 3\x00" + b"\x00" * 200])
def test_unreadable_file_is_a_format_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.sqlite"
    path.write_bytes(content)
    assert not nsys.sniff(path)
    with pytest.raises(TraceFormatError, match="broken.sqlite"):
        nsys.read(path)


def test_sniff(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x INTEGER)").connection.commit()
    assert not nsys.sniff(other)
    assert not nsys.sniff(tmp_path / "missing.sqlite")
    assert nsys.sniff(tmp_path / "run.nsys-rep")
    assert nsys.sniff(write_export(tmp_path, "2026", "parquetdir"))


# --- .nsys-rep ---


def test_report_without_nsys_names_the_export_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "run.nsys-rep"
    report.write_bytes(b"report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(
        TraceFormatError, match=r"run.nsys-rep: .*nsys export --type sqlite -o .*run.sqlite .*run.nsys-rep"
    ):
        nsys.read(report)


def test_report_is_exported_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ready = fx.write(two_process_trace(), tmp_path / "ready.sqlite")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"  # stands in for Nsight's CLI: copies a ready export to the -o path
    script = f"import shutil, sys\nshutil.copy({str(ready)!r}, sys.argv[sys.argv.index('-o') + 1])\n"
    fake.write_text(f"#!{sys.executable}\n{script}")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    report = inputs / "run.nsys-rep"
    report.write_bytes(b"report")
    result = nsys.read(report, cache_dir=tmp_path / "cache")
    assert result.source == str(report)
    assert sorted(p.name for p in inputs.iterdir()) == ["run.nsys-rep"]
    assert len(list((tmp_path / "cache").glob("run-*.sqlite"))) == 1


# --- several reports ---


def test_reports_move_onto_utc_by_themselves(tmp_path: Path) -> None:
    """The one clock rule: each report moves by its own session start, so reports read apart line up."""
    early = nsys.read(write_export(tmp_path, "2026", "sqlite"))
    later_path = fx.write(two_process_trace(), tmp_path / "node1.sqlite")
    with sqlite3.connect(later_path) as conn:  # same host clock reading, session started 1 µs later in UTC
        conn.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + 1000")
    later = nsys.read(later_path)
    a, b = nsys.to_utc(early), nsys.to_utc(later)
    assert b.meta["clock_offset_ns"] - a.meta["clock_offset_ns"] == 1000
    moved_a, moved_b = a.spans["start"] - early.spans["start"], b.spans["start"] - later.spans["start"]
    assert (moved_b - moved_a).unique().to_list() == [1000]
    other = FileResult(source="x.json", spans=early.spans.head(1), format="kineto")
    assert nsys.to_utc(other) is other


def test_reports_without_a_session_start_are_named_as_unaligned() -> None:
    spans = pl.DataFrame({"start": [1], "end": [2]})
    done = [FileResult("a", spans, format="nsys"), FileResult("b", spans, format="nsys")]
    assert all(nsys.to_utc(r).spans.equals(spans) for r in done)
    warnings = nsys.unaligned(done)
    assert len(warnings) == 2 and all("clock not aligned" in w for w in warnings)
    assert nsys.unaligned(done[:1]) == []


# --- properties ---

kernels_strategy = st.lists(
    st.tuples(st.sampled_from([100, 200]), st.integers(0, 10_000), st.integers(1, 2_000), st.integers(0, 3)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kernels=kernels_strategy, layout=st.sampled_from(fx.LAYOUTS))
def test_busy_time_is_the_union_of_the_input(kernels: list[tuple[int, int, int, int]], layout: str) -> None:
    trace = fx.Trace()
    for i, (pid, start, dur, stream) in enumerate(kernels):
        trace.gpu.append(
            fx.Gpu(pid, pid // 100, stream, start, start + dur, correlation=i, launch_tid=pid + 1)
        )
    with tempfile.TemporaryDirectory() as folder:
        result = nsys.read(fx.write(trace, Path(folder) / "t.sqlite", layout))
    assert accounted(result)
    clock = result.meta["session_start_clock_ns"]  # the fixture's times count from the session start
    for pid in {k[0] for k in kernels}:
        lane = result.spans.filter(pl.col("lane") == f"pid{pid}/gpu{pid // 100}")
        rows = lane.select(pl.col("start") - clock, pl.col("end") - clock)
        assert fx.union(list(rows.iter_rows())) == fx.union([(g.start, g.end) for g in trace.gpu if g.pid == pid])
