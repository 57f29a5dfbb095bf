"""Nsight Systems allocator events (``CUDA_GPU_MEMORY_USAGE_EVENTS``) into the allocator-event table: rows,
signs, lanes named as the spans name them, running totals, each GPU's capacity, and what is not kept."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl
import pytest

from pipebubble import allocations
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import nsys, read_file
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.nsys.memory import BYTES_LIMIT, TABLE
from pipebubble.spans import GPU_WORK

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    import nsys_fixtures as fx

GIB = 1 << 30
COLS = ("lane", "rank", "pid", "device", "ts", "bytes", "allocated")
#: pid 100 (rank 1) works on device 0, pid 200 (rank 0) on device 1 (``fx.ranked_pair``); each allocates and
#: frees device memory, and pid 100 also pinned host, managed and unnamed-kind memory, which are not kept.
EVENTS = [
    fx.Mem(100, 0, 5_000, 1_000),
    fx.Mem(100, 0, 6_000, 3_000),
    fx.Mem(100, 0, 15_000, 1_000, op=1),
    fx.Mem(200, 1, 4_000, 4_096, kind=3),  # a CUDA array: device memory
    fx.Mem(200, 1, 25_000, 4_096, op=1, kind=3),
    fx.Mem(200, 1, 26_000, 512, kind=5),  # device static
    fx.Mem(100, 0, 7_000, 64, kind=1),  # pinned host memory
    fx.Mem(100, 0, 8_000, 64, kind=4),  # managed
    fx.Mem(100, 0, 9_000, 64, kind=7),  # unknown
]
NOT_DEVICE = {"memory_host": 1, "memory_managed": 1, "memory_unknown_kind": 1}


def expected(ranks: dict[int, int], offset: int) -> list[tuple]:
    """The device rows of ``EVENTS`` in lane and time order, with signed bytes and running totals; a lane is
    named by its process's rank where it has one, else by its pid."""
    rows = []
    for pid, device, events in ((200, 1, [(4_000, 4_096), (25_000, -4_096), (26_000, 512)]),
                                (100, 0, [(5_000, 1_000), (6_000, 3_000), (15_000, -1_000)])):  # fmt: skip
        owner, total = f"rank{ranks[pid]}" if pid in ranks else f"pid{pid}", 0
        for ts, signed in events:
            total += signed
            rows.append((f"{owner}/gpu{device}", ranks.get(pid), pid, device, ts + offset, signed, total))
    return sorted(rows)


def memory_trace(by: str = "env", events: list[fx.Mem] = EVENTS) -> fx.Trace:
    trace = fx.ranked_pair(by)
    trace.memory = list(events)
    trace.gpus = [(0, 80 * GIB), (1, 80 * GIB)]
    return trace


def accounted(result: FileResult) -> bool:
    """Every row read is a span, an allocator event or counted as skipped."""
    memory = 0 if result.memory is None else result.memory.height
    return result.events_read == result.spans.height + memory + sum(result.skipped.values())


def read(path: Path) -> FileResult:
    result = nsys.read(path)
    assert accounted(result)
    assert all(len(w.splitlines()) == 1 for w in result.warnings)
    return result


@pytest.mark.parametrize("layout", fx.LAYOUTS)
@pytest.mark.parametrize(("by", "ranks"), [("env", fx.RANKED), ("none", {})])
def test_rows_signs_lanes_and_running_totals(tmp_path: Path, layout: str, by: str, ranks: dict[int, int]) -> None:
    result = read(fx.write(memory_trace(by), tmp_path / "mem.sqlite", layout))
    memory = result.memory
    assert memory is not None and dict(memory.schema) == allocations.SCHEMA
    offset = 0 if layout == "2022" else fx.CLOCK_AT_SESSION_START
    assert sorted(memory.select(COLS).rows()) == expected(ranks, offset)
    assert memory["device_type"].unique().to_list() == ["cuda"] and memory["baseline"].unique().to_list() == ["trace"]
    assert memory["source"].unique().to_list() == [result.source] and memory["reserved"].null_count() == memory.height
    gpu_lanes = set(result.spans.filter(pl.col("kind").is_in(GPU_WORK))["lane"])
    assert set(memory["lane"]) == gpu_lanes  # a GPU's work and memory share its lane's name
    assert result.skipped == NOT_DEVICE
    assert result.meta["gpu_memory_bytes"] == {0: 80 * GIB, 1: 80 * GIB}


def test_parquetdir_gives_the_same_table(tmp_path: Path) -> None:
    path = fx.write(memory_trace(), tmp_path / "mem.sqlite")
    folder = fx.to_parquetdir(path, tmp_path / "mem_pqtdir")
    assert read(folder).memory.equals(read(path).memory.with_columns(source=pl.lit(str(folder))))


def test_events_move_onto_utc_with_the_spans(tmp_path: Path) -> None:
    path = fx.write(memory_trace(), tmp_path / "mem.sqlite")
    result = read(path)
    moved = nsys.to_utc(result)
    shift = fx.SESSION_UTC_NS - fx.CLOCK_AT_SESSION_START
    assert (moved.spans["start"] - result.spans["start"]).unique().to_list() == [shift]
    assert (moved.memory["ts"] - result.memory["ts"]).unique().to_list() == [shift]
    uncached = read_file(path, use_cache=False)  # the way every command reads a file
    assert uncached.memory["ts"].to_list() == moved.memory["ts"].to_list()


def test_an_export_without_the_table_has_no_memory(tmp_path: Path) -> None:
    trace = memory_trace(events=[])
    trace.gpus = []
    result = read(fx.write(trace, tmp_path / "plain.sqlite"))
    assert result.memory is None and "gpu_memory_bytes" not in result.meta
    assert result.events_read == result.spans.height + sum(result.skipped.values())


def test_an_empty_table_has_no_memory(tmp_path: Path) -> None:
    path = edit(fx.write(memory_trace(), tmp_path / "empty.sqlite"), f"DELETE FROM {TABLE}")
    assert read(path).memory is None


def test_only_host_memory_gives_an_empty_table(tmp_path: Path) -> None:
    result = read(fx.write(memory_trace(events=[fx.Mem(100, 0, 1_000, 64, kind=1)]), tmp_path / "host.sqlite"))
    assert result.memory is not None and result.memory.is_empty() and result.skipped == {"memory_host": 1}


def edit(path: Path, *statements: str, params: tuple = ()) -> Path:
    conn = sqlite3.connect(path, isolation_level=None)
    for sql in statements:
        conn.execute(sql, params) if "?" in sql else conn.execute(sql)
    conn.close()
    return path


@pytest.mark.parametrize(
    ("sql", "params", "reason"),
    [
        ("UPDATE {t} SET bytes = ? WHERE rowid = 1", (b"\x01\x02",), "memory_bad_row"),  # a BLOB in an integer column
        ("UPDATE {t} SET bytes = ? WHERE rowid = 1", (-5,), "memory_bad_row"),
        ("UPDATE {t} SET memoryOperationType = ? WHERE rowid = 1", (9,), "memory_bad_row"),
        ("UPDATE {t} SET globalPid = ? WHERE rowid = 1", (None,), "memory_bad_row"),
        ("UPDATE {t} SET memKind = ? WHERE rowid = 1", ("device",), "memory_bad_row"),
        ("UPDATE {t} SET start = ? WHERE rowid = 1", (2**62,), "out_of_range"),
        ("UPDATE {t} SET start = ? WHERE rowid = 1", (-(2**63),), "out_of_range"),
        ("UPDATE {t} SET deviceId = ? WHERE rowid = 1", (2**31,), "out_of_range"),
        ("UPDATE {t} SET deviceId = ? WHERE rowid = 1", (-1,), "out_of_range"),
        ("UPDATE {t} SET bytes = ? WHERE rowid = 1", (BYTES_LIMIT + 1,), "out_of_range"),
    ],
)
def test_a_bad_cell_skips_its_row_and_counts_it(tmp_path: Path, sql: str, params: tuple, reason: str) -> None:
    path = edit(fx.write(memory_trace(), tmp_path / "bad.sqlite"), sql.format(t=TABLE), params=params)
    result = read(path)
    assert result.skipped == {**NOT_DEVICE, reason: 1}
    assert result.memory.height == 5 and (result.memory["ts"] != fx.CLOCK_AT_SESSION_START + 5_000).all()


def test_events_that_add_up_beyond_int64_are_dropped_with_a_warning(tmp_path: Path) -> None:
    flood = [fx.Mem(100, 0, n, BYTES_LIMIT) for n in range(1 << 14)]
    result = read(fx.write(memory_trace(events=flood), tmp_path / "flood.sqlite"))
    assert result.memory.is_empty() and result.skipped == {"out_of_range": 1 << 14}
    assert result.warnings == [f"{TABLE} ignored: its bytes add up beyond 2**62"]


def test_an_older_table_without_memory_kinds_is_all_device_memory(tmp_path: Path) -> None:
    path = edit(fx.write(memory_trace(), tmp_path / "old.sqlite"), f"ALTER TABLE {TABLE} DROP COLUMN memKind")
    result = read(path)
    assert result.skipped == {} and result.memory.height == len(EVENTS)


def test_a_broken_view_is_a_one_line_format_error(tmp_path: Path) -> None:
    path = edit(
        fx.write(memory_trace(), tmp_path / "view.sqlite"),
        f"DROP TABLE {TABLE}",
        "CREATE TABLE gone (start INTEGER)",
        f"CREATE VIEW {TABLE} AS SELECT * FROM gone",
        "DROP TABLE gone",
    )
    with pytest.raises(TraceFormatError) as info:
        nsys.read(path)
    message = str(info.value)
    assert message.startswith(f"{path}: cannot read table {TABLE} (") and len(message.splitlines()) == 1


@pytest.mark.parametrize(
    ("devices", "capacity", "warned"),
    [
        ([(1, 0, 100), (0, 1, 200)], {0: 40 * GIB, 1: 80 * GIB}, False),  # CUDA numbers, not the GPUs' ids
        ([(1, 0, 100), (1, 0, 200)], {0: 40 * GIB}, False),
        ([(1, 0, 100), (0, 0, 200)], {}, True),  # device 0 is a 40 GiB GPU to one process, 80 GiB to the other
        ([], {0: 80 * GIB, 1: 40 * GIB}, False),
    ],
)
def test_capacity_by_cuda_device(tmp_path: Path, devices: list, capacity: dict, warned: bool) -> None:
    trace = memory_trace()
    trace.gpus, trace.cuda_devices = [(0, 80 * GIB), (1, 40 * GIB), (2, 0)], devices  # 0: unknown
    result = read(fx.write(trace, tmp_path / "gpus.sqlite"))
    assert result.meta.get("gpu_memory_bytes", {}) == capacity
    assert any("different memory sizes" in w for w in result.warnings) == warned
