"""Damaged and unusual Nsight Systems exports: the shared repros, the real export's figures, and regressions
found by mutating exports (tests/fuzz/test_fuzz_nsys.py).

Every input gives either exact spans (with what was not kept counted in ``skipped``) or a
``TraceFormatError`` naming the file with a one-line reason.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
import sys
from pathlib import Path

import msgspec
import polars as pl
import pytest

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import nsys, read_one
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.nsys.tables import one_line, sqlite_uri
from pipebubble.spans import GPU_WORK, validate

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    import nsys_fixtures as fx

ROOT = Path(__file__).resolve().parents[3]
REPROS = ROOT.parent / "shared" / "repros"
REAL = ROOT.parent / "shared" / "traces" / "nsys" / "torchrun_2xh100_nccl.sqlite"
COLS = ("kind", "lane", "pid", "tid", "device", "stream", "name", "start", "end", "correlation")

# The spans of the minimal valid export (N0): two kernels on pid144/gpu0 and their two launch calls.
N0_SPANS = [
    ("kernel", "pid144/gpu0", 144, None, 0, 7, "kernelA", 1000, 2000, 1),
    ("kernel", "pid144/gpu0", 144, None, 0, 7, "kernelA", 3000, 4000, 2),
    ("runtime", "pid144/cpu/144", 144, 144, None, None, "cudaLaunchKernel", 500, 900, 1),
    ("runtime", "pid144/cpu/144", 144, 144, None, None, "cudaLaunchKernel", 2500, 2900, 2),
]
RUNTIME_ONLY = N0_SPANS[2:]


def repro(name: str) -> Path:
    """A file from the shared repros folder, or a skip when that folder is not beside the project."""
    path = REPROS / name
    if not path.exists():
        pytest.skip(f"shared repros not available ({name} is absent)")
    return path


def rows(result: FileResult) -> list[tuple]:
    return result.spans.sort("kind", "start").select(COLS).rows()


def sound(result: FileResult) -> FileResult:
    """``result`` after checking the contract every successful read keeps."""
    assert validate(result.spans) == []
    assert result.events_read == result.spans.height + sum(result.skipped.values())
    assert all(len(w.splitlines()) == 1 for w in result.warnings)
    msgspec.msgpack.encode(result.meta, enc_hook=str)  # every number in meta fits 64 bits
    return result


def format_error(path: Path, match: str) -> str:
    """The one-line message of the TraceFormatError that reading ``path`` raises (it names the file)."""
    with pytest.raises(TraceFormatError) as info:
        read_one(path)
    message = str(info.value)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{path}: ")
    assert match in info.value.reason, message
    return message


# --- the shared repros ---


def test_n0_minimal_export_gives_exact_spans() -> None:
    result = sound(read_one(repro("N0_nsys_minimal_ok.sqlite")))
    assert rows(result) == N0_SPANS
    assert result.skipped == {} and result.warnings == []
    assert result.spans["rank"].null_count() == 4


def test_n1_broken_view_is_a_format_error() -> None:
    format_error(repro("N1_nsys_broken_view.sqlite"), "cannot read table CUPTI_ACTIVITY_KIND_RUNTIME (no such table")


def test_n2_blob_in_integer_column_skips_the_row() -> None:
    result = sound(read_one(repro("N2_nsys_blob_in_int_column.sqlite")))
    assert rows(result) == [N0_SPANS[0], *RUNTIME_ONLY]
    assert result.skipped == {"gpu_bad_row": 1}
    assert result.warnings == ["CUPTI_ACTIVITY_KIND_KERNEL.start: 1 value of the wrong type read as null"]


def test_n2b_blob_string_is_read_as_text() -> None:
    result = sound(read_one(repro("N2b_nsys_blob_string_value.sqlite")))
    assert rows(result) == [(*row[:6], "A", *row[7:]) for row in N0_SPANS[:2]] + RUNTIME_ONLY
    assert result.skipped == {}


def test_n3_device_beyond_int32_is_skipped_and_counted() -> None:
    result = sound(read_one(repro("N3_nsys_deviceId_2pow31.sqlite")))
    assert rows(result) == RUNTIME_ONLY
    assert result.skipped == {"out_of_range": 2}


@pytest.mark.parametrize("name", ["N4_nsys_session_offset_overflow.sqlite", "N4b_nsys_session_offset_huge.sqlite"])
def test_n4_impossible_session_start_is_dropped_with_a_warning(name: str) -> None:
    result = sound(read_one(repro(name)))
    assert rows(result) == N0_SPANS
    assert "session_start_ns" not in result.meta and "session_start_clock_ns" not in result.meta
    assert len(result.warnings) == 1 and result.warnings[0].startswith("TARGET_INFO_SESSION_START_TIME ignored")
    assert nsys.to_utc(result) is result  # no shift: the spans keep their exact times


def test_n5_undecodable_sqlite_error_is_one_line() -> None:
    message = format_error(repro("N5_nsys_bad_schema_utf8.sqlite"), "malformed database schema")
    assert "\ufffd" in message


def test_n6_wal_export_writes_nothing_beside_it(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = Path(shutil.copy(repro("N6_nsys_wal_mode.sqlite"), folder))
    folder.chmod(0o555)
    try:
        result = sound(read_one(path))
        assert sorted(p.name for p in folder.iterdir()) == [path.name]
    finally:
        folder.chmod(0o755)
    assert rows(result) == N0_SPANS and result.warnings == []


def test_n6_reading_the_shared_repro_leaves_its_folder_alone() -> None:
    path = repro("N6_nsys_wal_mode.sqlite")
    before = sorted(p.name for p in REPROS.iterdir())
    assert rows(sound(read_one(path))) == N0_SPANS
    assert sorted(p.name for p in REPROS.iterdir()) == before


def test_n7_multiline_sqlite_error_is_one_line() -> None:
    message = format_error(repro("N7_nsys_multiline_error.sqlite"), "malformed database schema (NVTX_PAYLOAD_SCHEMAS)")
    assert "  " not in message


# --- the real export keeps its spans ---

# Computed with the reader as it was before range checks, value coercion and the immutable open were added:
# nsys.read(REAL) -> 32249 spans, no skips, no warnings; per kind (count, sum of end - start); per GPU lane the
# (rows, union busy ns, first start, last end); and sha256 of spans.drop("source") sorted on every column, as CSV.
REAL_KINDS = {
    "kernel": (3944, 509798898),
    "memcpy": (1020, 5692087),
    "memset": (269, 213408),
    "comm": (66, 25401752),
    "sync": (366, 325145417),
    "runtime": (7466, 370168989),
    "annotation": (19118, 1403779266),
}
REAL_GPU_LANES = {
    "pid144/gpu0": (2636, 273817787, 60111541307, 60411390119),
    "pid145/gpu1": (2663, 267275916, 60111513113, 60410174664),
}
REAL_SHA256 = "6d65fb92d8f54da8bcefa6b79a0f3c593db02a44c76ef7f34389d205fe370d20"



def test_real_export_spans_unchanged() -> None:
    if not REAL.exists():
        pytest.skip("shared traces folder is absent")
    result = sound(read_one(REAL))
    spans = result.spans
    assert spans.height == 32249 and result.skipped == {} and result.warnings == []
    kinds = spans.group_by("kind").agg(pl.len(), (pl.col("end") - pl.col("start")).sum())
    assert {str(k): (n, d) for k, n, d in kinds.iter_rows()} == REAL_KINDS
    for lane, expected in REAL_GPU_LANES.items():
        gpu = spans.filter((pl.col("lane") == lane) & pl.col("kind").is_in(GPU_WORK)).select("start", "end")
        assert (gpu.height, *fx.union(list(gpu.iter_rows()))) == expected
    # the argument columns and the copies' memory, which their names say since: test_copy_bytes.py
    table = spans.drop("source", "bytes", "flops", "dims", "dtypes").with_columns(
        pl.col("name").str.replace(r"^(Memcpy \w+) \(.*\)$", "${1}"))
    assert hashlib.sha256(table.sort(table.columns).write_csv().encode()).hexdigest() == REAL_SHA256
    assert result.meta["session_start_ns"] == 1779782330176752435
    assert result.meta["session_start_clock_ns"] == 28254349605


# --- regressions found by mutating exports ---


def minimal_export(path: Path, layout: str = "2026") -> Path:
    """A small fixture export: one process, two kernels with their launches, one NVTX range."""
    trace = fx.Trace(processes={100: "python3"})
    trace.gpu += [
        fx.Gpu(100, 0, 7, 1_000, 2_000, correlation=1, launch_tid=11),
        fx.Gpu(100, 0, 7, 3_000, 4_000, correlation=2, launch_tid=11),
    ]
    trace.nvtx.append(fx.Nvtx(100, 11, 900, 4_100, "step"))
    return fx.write(trace, path, layout)


def edit(path: Path, *sql: str, params: tuple = ()) -> Path:
    """Run ``sql`` statements on the export at ``path`` (the last one with ``params``)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in sql[:-1]:
            conn.execute(statement)
        conn.execute(sql[-1], params)
    finally:
        conn.close()
    return path


def test_circular_view_is_a_format_error(tmp_path: Path) -> None:
    path = edit(
        minimal_export(tmp_path / "circular.sqlite"),
        "DROP TABLE CUPTI_ACTIVITY_KIND_MEMSET",
        "CREATE VIEW CUPTI_ACTIVITY_KIND_MEMSET AS SELECT * FROM loop_b",
        "CREATE VIEW loop_b AS SELECT * FROM CUPTI_ACTIVITY_KIND_MEMSET",
    )
    format_error(path, "circularly defined")


def test_table_name_with_a_quote_is_read(tmp_path: Path) -> None:
    path = edit(
        minimal_export(tmp_path / "quote.sqlite"),
        'ALTER TABLE TARGET_INFO_SESSION_START_TIME RENAME TO "TARGET_INFO_SESSION_START_TIME""q"',
    )
    result = sound(read_one(path))
    assert result.meta["session_start_ns"] == fx.SESSION_UTC_NS


def test_table_name_with_a_newline_gives_one_line_warnings(tmp_path: Path) -> None:
    path = edit(
        minimal_export(tmp_path / "newline.sqlite"),
        "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = -5",
        'ALTER TABLE TARGET_INFO_SESSION_START_TIME RENAME TO "TARGET_INFO_SESSION_START_TIME\nx"',
    )
    result = sound(read_one(path))
    assert "session_start_ns" not in result.meta and "ignored" in result.warnings[0]


def test_reals_and_text_in_integer_columns(tmp_path: Path) -> None:
    """Untyped columns keep what was stored: integral reals and integer text are read, the rest is null."""
    path = minimal_export(tmp_path / "typed.sqlite")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    conn.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, globalPid, "
        "demangledName, shortName)"
    )
    base = fx.CLOCK_AT_SESSION_START
    starts = [base + 1000.0, 1e300, "12x", float("inf"), b"\x01"]
    ends = [str(base + 2000)] + [base + 9000] * 4
    for start, end in zip(starts, ends, strict=True):
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, 7, 1, ?, 1, 1)", (start, end, fx.gpid(100))
        )
    conn.close()
    result = sound(read_one(path))
    kernels = result.spans.filter(pl.col("kind") == "kernel")
    assert kernels.select("start", "end").rows() == [(base + 1000, base + 2000)]
    assert result.skipped["gpu_bad_row"] == 4
    assert "CUPTI_ACTIVITY_KIND_KERNEL.start: 4 values of the wrong type read as null" in result.warnings


@pytest.mark.parametrize(
    ("table", "start"),
    [("CUPTI_ACTIVITY_KIND_KERNEL", 2**62), ("CUPTI_ACTIVITY_KIND_RUNTIME", -(2**63)), ("NVTX_EVENTS", 2**63 - 1)],
)
def test_times_beyond_2_pow_62_are_out_of_range(tmp_path: Path, table: str, start: int) -> None:
    path = edit(
        minimal_export(tmp_path / "far.sqlite"),
        f"UPDATE {table} SET start = ?, end = ? WHERE rowid = 1",
        params=(start, max(start, 2**63 - 1)),
    )
    result = sound(read_one(path))
    assert result.skipped["out_of_range"] == 1
    assert result.spans.select(pl.col("start").min() > -(2**62), pl.col("end").max() < 2**62).row(0) == (True, True)


def test_times_just_inside_2_pow_62_are_kept(tmp_path: Path) -> None:
    edge = 2**62 - 1
    path = edit(
        minimal_export(tmp_path / "edge.sqlite"),
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = ?, end = ? WHERE rowid = 1",
        params=(edge - 10, edge),
    )
    result = sound(read_one(path))
    assert result.skipped == {} and result.spans["end"].max() == edge
    assert "session_start_ns" not in result.meta  # its UTC shift would carry the kernel out of range
    assert "TARGET_INFO_SESSION_START_TIME ignored" in result.warnings[0]


@pytest.mark.parametrize("device", [2**31, -(2**31) - 1, 2**48 | (144 << 24), -(2**63)])
def test_device_beyond_int32_is_out_of_range(tmp_path: Path, device: int) -> None:
    path = edit(
        minimal_export(tmp_path / "device.sqlite"),
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = ? WHERE rowid = 1",
        params=(device,),
    )
    result = sound(read_one(path))
    assert result.skipped == {"out_of_range": 1}
    assert result.spans.filter(pl.col("kind") == "kernel").height == 1


def test_wal_mode_fixture_writes_nothing_in_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = edit(minimal_export(folder / "wal.sqlite"), "PRAGMA journal_mode = WAL")
    assert sorted(p.name for p in folder.iterdir()) == ["wal.sqlite"]
    folder.chmod(0o555)
    try:
        result = sound(read_one(path))
        assert sorted(p.name for p in folder.iterdir()) == ["wal.sqlite"]
    finally:
        folder.chmod(0o755)
    assert result.spans.filter(pl.col("kind") == "kernel").height == 2 and result.warnings == []


def test_rows_left_in_a_wal_file_are_warned_about(tmp_path: Path) -> None:
    live = minimal_export(tmp_path / "live.sqlite")
    conn = sqlite3.connect(live, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = 1")  # only in the -wal file for now
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("live.sqlite", "live.sqlite-wal"):
        shutil.copy(tmp_path / name, copy / name)
    conn.close()
    result = sound(read_one(copy / "live.sqlite"))
    assert result.spans.filter(pl.col("kind") == "kernel").height == 2  # the file as it is on disk
    assert any(w.startswith("live.sqlite-wal (") and "is ignored" in w for w in result.warnings)
    assert sorted(p.name for p in copy.iterdir()) == ["live.sqlite", "live.sqlite-wal"]


@pytest.mark.parametrize("name", ["a b.sqlite", "x#1?.sqlite", "100%25.sqlite", "caf\u00e9.sqlite"])
def test_odd_file_names_are_opened(tmp_path: Path, name: str) -> None:
    path = minimal_export(tmp_path / name)
    assert sqlite_uri(path).endswith("?mode=ro&immutable=1")
    assert sound(read_one(path)).spans.filter(pl.col("kind") == "kernel").height == 2


def test_truncated_export_is_a_format_error(tmp_path: Path) -> None:
    path = minimal_export(tmp_path / "cut.sqlite")
    path.write_bytes(path.read_bytes()[: 3 * 4096 + 100])
    format_error(path, "")


def test_a_utc_shift_beyond_range_is_left_unapplied() -> None:
    spans = pl.DataFrame({"start": [2**62 - 10], "end": [2**62 - 5]})
    a = FileResult("a", spans, meta={"session_start_ns": 2**62 - 1, "session_start_clock_ns": 0}, format="nsys")
    moved = nsys.to_utc(a)
    assert moved.spans.equals(spans) and "clock_offset_ns" not in moved.meta
    assert "would move spans out of range" in moved.warnings[0]


def test_parquetdir_with_a_binary_integer_column_is_a_format_error(tmp_path: Path) -> None:
    folder = fx.to_parquetdir(minimal_export(tmp_path / "p.sqlite"), tmp_path / "export")
    kernels = pl.read_parquet(folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    kernels.with_columns(pl.col("deviceId").cast(pl.String).cast(pl.Binary)).write_parquet(
        folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    )
    format_error(folder, "cannot read table CUPTI_ACTIVITY_KIND_KERNEL (casting from")


def test_one_line_collapses_and_cuts() -> None:
    assert one_line("a\n  b\r\n\tc\x00d\u2028e") == "a b c d e"
    assert one_line("x" * 500, 20) == "x" * 17 + "..."


# --- .qdrep, the older report name ---


def fake_nsys(tmp_path: Path, body: str) -> Path:
    """A stand-in ``nsys`` on PATH running the Python ``body`` (with ``sys`` and ``shutil`` imported)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(f"#!{sys.executable}\nimport shutil, sys\n{body}\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_qdrep_without_nsys_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "old.qdrep"
    report.write_bytes(b"report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nsys.sniff(report)
    with pytest.raises(TraceFormatError) as info:
        nsys.read(report)
    assert len(str(info.value).splitlines()) == 1
    assert "needs nsys on PATH" in info.value.reason and "old.sqlite" in info.value.reason


def test_qdrep_is_exported_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ready = minimal_export(tmp_path / "ready.sqlite")
    bin_dir = fake_nsys(tmp_path, f"shutil.copy({str(ready)!r}, sys.argv[sys.argv.index('-o') + 1])")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    report = inputs / "old.qdrep"
    report.write_bytes(b"report")
    result = sound(nsys.read(report, cache_dir=tmp_path / "cache"))
    assert result.source == str(report) and result.spans.filter(pl.col("kind") == "kernel").height == 2
    assert sorted(p.name for p in inputs.iterdir()) == ["old.qdrep"]


def test_failed_export_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = fake_nsys(tmp_path, "sys.stderr.write('first\\n\\xff bad import\\n  detail\\tmore\\n'); sys.exit(3)")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    report = tmp_path / "run.qdrep"
    report.write_bytes(b"report")
    with pytest.raises(TraceFormatError) as info:
        nsys.read(report, cache_dir=tmp_path / "cache")
    assert info.value.reason == "nsys export failed (exit 3): detail more"
