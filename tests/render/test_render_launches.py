"""The GPU annotation, launch queue and launch delay sections on a hand-built Report: each format shows the
data's numbers as they are, the JSON reads back to the same Report, and CSV writes one row per item."""

from __future__ import annotations

import csv
import io

from pipebubble.api import frames
from pipebubble.render import csv_table, html, markdown, terminal
from pipebubble.render.cells import UNKNOWN
from pipebubble.render.sections import walk
from pipebubble.report import Report
from pipebubble.report.launches import AnnotatedKernel, GpuAnnotation, LaunchDelay, LaunchQueue

MS = 1_000_000
REPORT = Report(
    gpu_annotations=[GpuAnnotation("forward", 5, 150 * MS, 160 * MS, 2_300, 140 * MS,
                                   [AnnotatedKernel("gemm", "void gemm<128>(float*)", 60, 21 * MS)]),
                     GpuAnnotation("## backward ##", 5, 138_341, 138_341, 30, 115_264)],
    launch_queue=[LaunchQueue("rank0/gpu0", 0, 7, 6_095, 480 * MS, 1_023, 873.5, 1_022, 1_023, 231 * MS, 12 * MS, 0)],
    launch_delays=[LaunchDelay("aten::copy_", 1_600, 116_914 * MS, 73.07 * MS, 81.64 * MS, 90 * MS, 2_322.1, 0.99875),
                   LaunchDelay(None, 3, 30, 10.0, 10.0, 12, 5.0, 1.0)],
)


def test_the_tables_hold_the_data_as_it_is():
    tables = {kind: t for kind, t in walk(REPORT, 0) if t is not None}
    assert tables["gpu_annotations"].rows[0] == ["forward", "5", "150.00", "160.00", "2,300", "140.00", "gemm"]
    assert tables["launch_queue"].rows[0] == ["rank0/gpu0", "7", "6,095", "1,023", "873.50", "1,022", "1,023",
                                              "231.00", "2.5%", "0.00"]
    assert tables["launch_delays"].rows[0][:3] == ["aten::copy_", "1,600", "116,914.00"]
    assert tables["launch_delays"].rows[1][0] == UNKNOWN  # launched under no operator


def test_every_document_format_shows_them():
    text = terminal.render(REPORT, width=160)
    md, page = markdown.render(REPORT), html.render(REPORT)
    for title in ("GPU annotations", "Launch queue per stream", "Launch delays per operator"):
        assert title in text and title in md and title in page
    assert "aten::copy_" in text and "## backward ##" in md


def test_json_reads_back_and_frames_and_csv_hold_every_row():
    data = REPORT.to_dict()
    assert data["gpu_annotations"][0]["kernels"][0] == {"name": "gemm", "name_full": "void gemm<128>(float*)",
                                                        "count": 60, "gpu_ns": 21 * MS}
    assert Report.from_dict(data) == REPORT
    assert frames.frame(data, "launch_queue")["at_max_ns"].to_list() == [231 * MS]
    assert frames.frame(data, "gpu_annotations")["name"].to_list() == ["forward", "## backward ##"]
    rows = list(csv.DictReader(io.StringIO(csv_table.render(REPORT, "launch_delays", "ns"))))
    assert [r["operator"] for r in rows] == ["aten::copy_", ""] and rows[0]["total_ns"] == str(116_914 * MS)
    annotations = list(csv.DictReader(io.StringIO(csv_table.render(REPORT, "gpu_annotations"))))
    assert "kernels" not in annotations[0] and annotations[1]["gpu_ms"] == "0.138341"
