"""The memory-copy table in every document format and as CSV: the report's numbers as they are, the job's rows
first, then each lane's where more than one lane copies."""

from __future__ import annotations

from pipebubble.render import render
from pipebubble.render.sections.memcpy import memcpy_table
from pipebubble.report import Report
from pipebubble.report.memcpy import Memcpy, MemcpyRow

ROWS = [MemcpyRow("HtoD", "pinned", 3, 3_000_000, 1_500_000, 2.0), MemcpyRow("DtoD", None, 1, 10, 4, 2.5)]
LANES = [MemcpyRow("HtoD", "pinned", 2, 2_000_000, 1_000_000, 2.0, "rank0/gpu0"),
         MemcpyRow("HtoD", "pinned", 1, 1_000_000, 500_000, 2.0, "rank1/gpu0"),
         MemcpyRow("DtoD", None, 1, 10, 4, 2.5, "rank1/gpu0")]
REPORT = Report(memcpy=Memcpy(ROWS, LANES))


def test_table_rows_are_the_reports_numbers():
    table = memcpy_table(REPORT, unit="us")
    assert table.rows == [["all", "HtoD", "pinned", "3", "3,000,000", "1,500.00", "2.00"],
                          ["all", "DtoD", "-", "1", "10", "0.00", "2.50"],
                          ["rank0/gpu0", "HtoD", "pinned", "2", "2,000,000", "1,000.00", "2.00"],
                          ["rank1/gpu0", "HtoD", "pinned", "1", "1,000,000", "500.00", "2.00"],
                          ["rank1/gpu0", "DtoD", "-", "1", "10", "0.00", "2.50"]]
    assert memcpy_table(REPORT, limit=1).notes == ("2 more lane rows not shown: --format csv --table memcpy, json, "
                                                   "markdown or html list every lane",)


def test_one_lane_shows_the_job_rows_alone_and_no_copy_no_table():
    one = Report(memcpy=Memcpy(ROWS, LANES[:1]))
    assert [r[0] for r in memcpy_table(one).rows] == ["all", "all"]
    assert memcpy_table(Report()).rows == []
    for fmt in ("text", "markdown", "html"):
        assert "Memory copies" not in render(Report(), fmt)


def test_every_document_format_shows_it_and_csv_lists_every_row():
    for fmt in ("text", "markdown", "html"):
        out = render(REPORT, fmt, width=160)
        assert "Memory copies" in out and "3,000,000" in out and "rank1/gpu0" in out, fmt
    csv = render(REPORT, "csv", table="memcpy").splitlines()
    assert csv[0] == "direction,host_memory,count,bytes,busy_ms,gbps,lane"
    assert csv[1:] == ["HtoD,pinned,3,3000000,1.5,2.0,", "DtoD,,1,10,0.000004,2.5,",
                       "HtoD,pinned,2,2000000,1,2.0,rank0/gpu0", "HtoD,pinned,1,1000000,0.5,2.0,rank1/gpu0",
                       "DtoD,,1,10,0.000004,2.5,rank1/gpu0"]
