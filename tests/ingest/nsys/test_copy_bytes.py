"""Nsight's copies and memsets keep CUPTI's ``bytes`` in the span table (the operator columns stay null); a
copy's name says its source and destination memory as the export's ENUM_CUDA_MEM_KIND names them (srcKind 0:
Pageable in this 2026 export), as Kineto's do."""

from __future__ import annotations

import sqlite3

import polars as pl
from conftest import shared

from pipebubble.ingest import read_file
from pipebubble.options import Options, Scale
from pipebubble.run import run


def test_copy_and_memset_bytes_equal_the_exports_rows():
    path = shared("nsys", "torchrun_2xh100_nccl.sqlite")
    with sqlite3.connect(path) as conn:
        copies = dict(conn.execute("SELECT copyKind, SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"))
        memsets = conn.execute("SELECT COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()
        busy = dict(conn.execute('SELECT copyKind, SUM("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1'))
    spans = read_file(path, use_cache=False).spans
    by_name = dict(spans.filter(pl.col("kind") == "memcpy").group_by("name").agg(pl.col("bytes").sum()).rows())
    assert by_name == {"Memcpy HtoD (Pageable -> Device)": copies[1], "Memcpy DtoD (Device -> Device)": copies[8]}
    sets = spans.filter(pl.col("kind") == "memset")
    assert (sets.height, sets["bytes"].sum()) == memsets
    assert spans.select(pl.col("flops", "dims", "dtypes").null_count()).row(0) == (spans.height,) * 3
    rows = {r.direction: r for r in run([path], Options(), Scale(use_cache=False)).memcpy.rows}
    assert {d: (r.bytes, r.busy_ns, r.host_memory) for d, r in rows.items()} == {
        "HtoD": (copies[1], busy[1], "pageable"), "DtoD": (copies[8], busy[8], None)}
