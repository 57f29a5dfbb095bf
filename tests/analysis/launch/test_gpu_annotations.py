"""GPU annotations and the GPU operations within them, on a hand-made timeline."""

from __future__ import annotations

import polars as pl

from pipebubble import spans
from pipebubble.analysis.launch import annotated, launch_part, summary

GPU0, GPU1 = "rank0/gpu0", "rank0/gpu1"


def table(rows: list[tuple]) -> pl.DataFrame:
    """GPU spans of rank 0 from (kind, name, start, end, lane, stream) rows."""
    frame = pl.DataFrame(rows, schema=["kind", "name", "start", "end", "lane", "stream"], orient="row")
    device = pl.col("lane").str.extract(r"gpu(\d+)$").cast(pl.Int32)
    return spans.conform(frame.with_columns(source=pl.lit("t"), rank=pl.lit(0), device=device))


#: ``fwd`` twice on gpu0 stream 7: [0,100) and [50,150) overlap (union 150, sum 200), and once on gpu1
#: [0,40); ``opt`` on gpu0 stream 7 [200,260). Kernels on gpu0 stream 7: a [10,30) and b [120,150) inside
#: fwd, c [140,210) straddles fwd's end and opt's start (in neither), d [210,250) and e [250,260) inside opt.
#: Kernel f [20,30) runs on gpu0 stream 9 (another stream: not under fwd), g [5,35) on gpu1 under fwd.
TIMELINE = [
    ("gpu_annotation", "fwd", 0, 100, GPU0, 7), ("gpu_annotation", "fwd", 50, 150, GPU0, 7),
    ("gpu_annotation", "fwd", 0, 40, GPU1, 7), ("gpu_annotation", "opt", 200, 260, GPU0, 7),
    ("kernel", "a", 10, 30, GPU0, 7), ("kernel", "b", 120, 150, GPU0, 7), ("kernel", "c", 140, 210, GPU0, 7),
    ("kernel", "d", 210, 250, GPU0, 7), ("memcpy", "e", 250, 260, GPU0, 7), ("kernel", "f", 20, 30, GPU0, 9),
    ("kernel", "g", 5, 35, GPU1, 7),
]


def test_annotations_by_name_with_the_operations_within():
    names, kernels = annotated.annotations(table(TIMELINE))
    by_name = {r["name"]: r for r in names.iter_rows(named=True)}
    assert by_name["fwd"] == {"name": "fwd", "count": 3, "gpu_ns": 150 + 40, "sum_ns": 100 + 100 + 40,
                              "kernel_count": 3, "kernel_ns": 20 + 30 + 30}
    assert by_name["opt"] == {"name": "opt", "count": 1, "gpu_ns": 60, "sum_ns": 60, "kernel_count": 2,
                              "kernel_ns": 40 + 10}
    assert sorted(kernels.rows()) == [("fwd", "a", 1, 20), ("fwd", "b", 1, 30), ("fwd", "g", 1, 30),
                                      ("opt", "d", 1, 40), ("opt", "e", 1, 10)]


def test_report_rows_list_the_top_kernels_by_time():
    first, second = summary.gpu_annotations([launch_part(table(TIMELINE), alone=True)])
    assert (first.name, first.gpu_ns, second.name, second.gpu_ns) == ("fwd", 190, "opt", 60)
    assert [(k.name, k.count, k.gpu_ns) for k in first.kernels] == [("b", 1, 30), ("g", 1, 30), ("a", 1, 20)]
    assert [k.name_full for k in second.kernels] == ["d", "e"]


def test_two_files_add_up_and_none_is_empty():
    both = summary.gpu_annotations([launch_part(table(TIMELINE)), launch_part(table(TIMELINE))])
    assert [(a.name, a.count, a.gpu_ns, a.kernel_count) for a in both] == [("fwd", 6, 380, 6), ("opt", 2, 120, 4)]
    assert summary.gpu_annotations([launch_part(table(TIMELINE[4:]))]) == []
