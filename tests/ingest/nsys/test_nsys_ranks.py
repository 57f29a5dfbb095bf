"""Nsight Systems exports: each process's rank from NCCL's payloads or the launch environment, and exports
taken without CUDA tracing."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import nsys
from pipebubble.ingest.base import FileResult
from pipebubble.spans import validate

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    import nsys_fixtures as fx

REAL = fx.REAL_EXPORT
needs_real = pytest.mark.skipif(not REAL.exists(), reason="shared traces folder ../shared/traces is absent")


def read(trace: fx.Trace, tmp_path: Path, name: str = "ranked", container: str = "sqlite") -> FileResult:
    path = fx.write(trace, tmp_path / f"{name}.sqlite")
    if container == "parquetdir":
        path = fx.to_parquetdir(path, tmp_path / name)
    result = nsys.read(path)
    assert validate(result.spans) == []
    return result


def by_process(result: FileResult) -> dict[int, tuple[set, set]]:
    """pid -> (the ranks its spans carry, the lanes they are on)."""
    rows = result.spans.group_by("pid").agg(pl.col("rank").unique(), pl.col("lane").unique())
    return {pid: (set(ranks), set(lanes)) for pid, ranks, lanes in rows.iter_rows()}


# The pair's GPU work, launch calls and NVTX ranges: pid 100 is rank 1 on GPU 0, pid 200 rank 0 on GPU 1, each
# launching from thread pid + 1.
RANKED_LANES = {
    100: ({1}, {"rank1/gpu0", "rank1/cpu/101"}),
    200: ({0}, {"rank0/gpu1", "rank0/cpu/201"}),
}


# --- where a rank comes from ---


@pytest.mark.parametrize("container", ["sqlite", "parquetdir"])
@pytest.mark.parametrize("by", ["env", "blob", "json"])
def test_each_source_ranks_cpu_and_gpu_spans(tmp_path: Path, by: str, container: str) -> None:
    result = read(fx.ranked_pair(by), tmp_path, container=container)
    assert by_process(result) == RANKED_LANES
    kinds = set(result.spans.filter(pl.col("rank").is_not_null())["kind"])
    assert kinds == {"kernel", "runtime", "annotation"}  # GPU spans carry the rank of the launching process
    assert result.meta["ranks"] == {100: 1, 200: 0} and result.meta["world_size"] == 2
    assert "rank" not in result.meta  # the export holds two ranks, not one
    assert result.warnings == []


def test_a_process_of_several_communicators_has_the_rank_of_the_largest(tmp_path: Path) -> None:
    trace = fx.ranked_pair("blob", {100: 2, 200: 3}, world=4)
    trace.nvtx += [  # each also joins a 2-rank pipeline pair, a 1-rank group and destroys the world one at exit
        fx.comm_init(100, 101, 2_000, 2, 0, 0), fx.comm_init(200, 201, 2_000, 2, 1, 1),
        fx.comm_init(100, 101, 3_000, 1, 0, 0), fx.comm_init(200, 201, 3_000, 1, 0, 1),
        fx.comm_init(100, 101, 30_000, 4, 2, 0),
    ]  # fmt: skip
    result = read(trace, tmp_path)
    assert result.meta["ranks"] == {100: 2, 200: 3} and result.meta["world_size"] == 4
    assert result.warnings == []


def test_the_launch_world_size_picks_the_job_communicator(tmp_path: Path) -> None:
    # Only a 2-rank subgroup and the 8-rank world: the environment's WORLD_SIZE says which is the job's.
    trace = fx.Trace(processes={100: "python3"})
    trace.gpu.append(fx.Gpu(100, 0, 7, 10_000, 20_000, correlation=1, launch_tid=101))
    trace.nvtx += [fx.comm_init(100, 101, 1_000, 8, 5, 0), fx.comm_init(100, 101, 2_000, 16, 9, 0)]
    trace.schema_entries = list(fx.COMM_INIT_ENTRIES)
    trace.capture = fx.env(0, WORLD_SIZE=8)
    result = read(trace, tmp_path)
    assert result.meta["ranks"] == {100: 5} and result.meta["world_size"] == 8 and result.meta["rank"] == 5


def test_one_launch_with_one_process_names_the_export_rank(tmp_path: Path) -> None:
    # torchrun ... nsys profile python train.py: nsys launches one worker, whose environment torchrun set.
    trace = fx.Trace(processes={300: "python3"})
    trace.gpu.append(fx.Gpu(300, 0, 7, 10_000, 20_000, correlation=1, launch_tid=301))
    trace.capture = [("PROCESS_0:COMMAND", "python"), ("PROCESS_0:PID", "0"), *fx.env(0, RANK=3, WORLD_SIZE=8)]
    result = read(trace, tmp_path)
    assert by_process(result) == {300: ({3}, {"rank3/gpu0", "rank3/cpu/301"})}
    assert (result.meta["rank"], result.meta["world_size"], result.meta["ranks"]) == (3, 8, {300: 3})


def test_nccl_outranks_the_environment(tmp_path: Path) -> None:
    trace = fx.ranked_pair("blob")
    trace.capture = [("PROCESS_0:PID", "100"), *fx.env(0, RANK=7, WORLD_SIZE=2)]
    result = read(trace, tmp_path)
    assert result.meta["ranks"] == {100: 1, 200: 0}
    assert result.warnings == ["process 100: NCCL says rank 1, its environment RANK 7: NCCL's kept"]


def test_local_rank_alone_is_no_rank(tmp_path: Path) -> None:
    trace = fx.ranked_pair("none")
    trace.capture = [("PROCESS_0:PID", "100"), *fx.env(0, LOCAL_RANK=0, WORLD_SIZE=2)]
    result = read(trace, tmp_path)
    assert result.spans["rank"].null_count() == result.spans.height
    assert "ranks" not in result.meta and result.warnings == []


# --- claims that are not kept ---


def test_two_processes_claiming_one_rank_keep_neither(tmp_path: Path) -> None:
    result = read(fx.ranked_pair("blob", {100: 1, 200: 1}), tmp_path)
    assert result.spans["rank"].null_count() == result.spans.height
    assert set(result.spans["lane"]) == {"pid100/gpu0", "pid100/cpu/101", "pid200/gpu1", "pid200/cpu/201"}
    assert "ranks" not in result.meta
    assert result.warnings == ["rank 1 claimed by processes 100, 200: their ranks left unknown"]


def test_one_launch_starting_several_processes_is_a_conflict(tmp_path: Path) -> None:
    # nsys profile torchrun ...: the launch's own RANK would be inherited by both workers.
    trace = fx.ranked_pair("none")
    trace.capture = [("PROCESS_0:PID", "0"), *fx.env(0, RANK=0)]
    result = read(trace, tmp_path)
    assert result.spans["rank"].null_count() == result.spans.height
    assert result.warnings == ["rank 0 claimed by processes 100, 200: their ranks left unknown"]


def test_rank_beyond_int32_is_dropped_with_a_warning(tmp_path: Path) -> None:
    trace = fx.ranked_pair("env")
    trace.capture = [(n, v.replace('RANK="1"', f'RANK="{2**31}"')) for n, v in trace.capture]
    result = read(trace, tmp_path)
    assert by_process(result)[100] == ({None}, {"pid100/gpu0", "pid100/cpu/101"})
    assert by_process(result)[200] == RANKED_LANES[200]
    assert result.warnings == ["process 100: rank 2147483648 out of range (0 to 2**31-1): rank left unknown"]


def test_a_process_with_two_ranks_in_the_world_is_left_unknown(tmp_path: Path) -> None:
    trace = fx.ranked_pair("blob")
    trace.nvtx.append(fx.comm_init(100, 101, 2_000, 2, 0, 0))  # a second 2-rank communicator, rank 0 in it
    result = read(trace, tmp_path)
    assert result.meta["ranks"] == {200: 0}
    assert result.warnings == ["process 100: NCCL names ranks [0, 1] in communicators of 2: rank left unknown"]


def test_a_short_payload_names_no_rank(tmp_path: Path) -> None:
    trace = fx.ranked_pair("blob")
    for n in trace.nvtx:
        if n.blob is not None:
            n.blob = n.blob[:40]  # the header and the communicator id only
    result = read(trace, tmp_path)
    assert "ranks" not in result.meta and result.spans["rank"].null_count() == result.spans.height


# --- the real export ---


@needs_real
def test_real_export_names_no_rank() -> None:
    # Its NCCL payload schemas are there, but it was exported without --include-blobs and its window holds
    # no ncclCommInitRank: nothing names a rank, and the pids stay pids.
    result = nsys.read(REAL)
    assert result.spans["rank"].null_count() == result.spans.height
    assert "ranks" not in result.meta and "world_size" not in result.meta
    assert result.spans["lane"].str.starts_with("pid").all()
    assert result.warnings == []


# --- exports taken without CUDA tracing ---


def run_cli(path: Path, fmt: str) -> subprocess.CompletedProcess:
    args = [sys.executable, "-m", "pipebubble", "analyze", str(path), "--no-cache", "--format", fmt]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def without_tables(tmp_path: Path, source: Path, name: str, also: tuple[str, ...] = ()) -> Path:
    path = tmp_path / name
    shutil.copyfile(source, path)
    path.chmod(0o644)
    conn = sqlite3.connect(path)
    tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        if table.startswith("CUPTI_ACTIVITY_KIND_") or table in also:
            conn.execute(f'DROP TABLE "{table}"')
    conn.commit()
    conn.close()
    return path


def no_cuda_trace() -> fx.Trace:
    return fx.Trace(cuda_tables=False, processes={100: "python3"}, nvtx=[
        fx.Nvtx(100, 101, 1_000, 5_000, "step 0"), fx.Nvtx(100, 101, 1_500, 2_500, "forward"),
    ])  # fmt: skip


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_synthetic_export_without_cuda_reads_its_cpu_lanes(tmp_path: Path, fmt: str) -> None:
    path = fx.write(no_cuda_trace(), tmp_path / "nocuda.sqlite")
    result = nsys.read(path)
    assert result.spans["lane"].to_list() == ["pid100/cpu/101"] * 2 and result.warnings == [nsys.NO_CUDA]
    proc = run_cli(path, fmt)
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stderr.splitlines() if "CUDA tracing was off" in line]
    assert len(warned) == 1 and "nsys profile --trace=cuda" in warned[0]
    if fmt == "json":  # the NVTX ranges are read (labels, not work: no lane is busy)
        ingest = json.loads(proc.stdout)["ingest"]
        assert (ingest["spans"], ingest["warnings"]) == (2, [nsys.NO_CUDA])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_synthetic_export_without_cuda_or_nvtx_is_exit_2(tmp_path: Path, fmt: str) -> None:
    path = fx.write(fx.Trace(cuda_tables=False, processes={100: "python3"}), tmp_path / "bare.sqlite")
    proc = run_cli(path, fmt)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert str(path) in line and "CUDA tracing was off" in line and "nsys profile --trace=cuda" in line


@needs_real
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_real_export_less_its_cuda_tables_reads_nvtx_lanes(tmp_path: Path, fmt: str) -> None:
    path = without_tables(tmp_path, REAL, "nocuda.sqlite")
    result = nsys.read(path)
    nvtx_rows = sqlite3.connect(REAL).execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType = 59").fetchone()
    assert set(result.spans["kind"]) == {"annotation"} and result.spans.height == nvtx_rows[0]
    assert result.warnings == [nsys.NO_CUDA]
    proc = run_cli(path, fmt)
    assert proc.returncode == 0, proc.stderr
    assert len([line for line in proc.stderr.splitlines() if "CUDA tracing was off" in line]) == 1
    if fmt == "json":
        ingest = json.loads(proc.stdout)["ingest"]
        assert (ingest["spans"], ingest["warnings"]) == (nvtx_rows[0], [nsys.NO_CUDA])


@needs_real
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_real_export_less_its_cuda_and_nvtx_tables_is_exit_2(tmp_path: Path, fmt: str) -> None:
    path = without_tables(tmp_path, REAL, "bare.sqlite", also=("NVTX_EVENTS",))
    with pytest.raises(TraceFormatError, match="CUDA tracing was off"):
        nsys.read(path)
    proc = run_cli(path, fmt)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert str(path) in line and "CUDA tracing was off" in line and "--trace=cuda,nvtx" in line


def test_an_export_of_two_ranks_reports_rank_lanes_and_is_not_one_rank_of_a_job(tmp_path: Path) -> None:
    path = fx.write(fx.ranked_pair("blob"), tmp_path / "pair.sqlite")
    proc = run_cli(path, "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {lane["lane"] for lane in report["lanes"]} >= {"rank1/gpu0", "rank0/gpu1"}
    assert not any(note.startswith("one rank") for note in report["notes"])  # it holds both of the job's ranks
