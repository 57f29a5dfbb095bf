"""Every analysis on the degenerate inputs: an empty span table and a table of one span."""

from __future__ import annotations

import polars as pl
import pytest

from pipebubble import spans
from pipebubble.analysis.lanes import lane_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest.base import FileResult
from pipebubble.run import of_results


def one_span(kind: str, device: int | None) -> pl.DataFrame:
    return spans.conform(pl.DataFrame({"source": ["t"], "rank": [0], "pid": [None if device is not None else 7],
                                       "tid": [1], "device": [device], "stream": [7 if device is not None else None],
                                       "lane": ["rank0/gpu0" if device is not None else "rank0/pid7/tid1"],
                                       "kind": [kind], "name": ["x"], "start": [100], "end": [250]}))


def test_lanes_of_nothing_is_empty():
    assert lane_table(spans.empty()).is_empty()


@pytest.mark.parametrize("kind, device, lanes", [("kernel", 0, 2), ("cpu_op", None, 1), ("annotation", None, 0)])
def test_lanes_of_one_span(kind, device, lanes):
    table = lane_table(one_span(kind, device))
    assert table.height == lanes
    for row in table.iter_rows(named=True):
        assert (row["busy_ns"], row["idle_ns"], row["window_start_ns"], row["window_end_ns"]) == (150, 0, 100, 250)


def test_report_of_one_span_and_of_nothing():
    table = one_span("kernel", 0)
    report = of_results([FileResult("t", table, 1)])
    assert report.to_dict()["lanes"][0]["busy_ns"] == 150
    with pytest.raises(TraceFormatError, match="nothing to analyse"):
        of_results([FileResult("t", spans.empty(), 3)])


@pytest.mark.parametrize("table", [spans.empty(), one_span("kernel", 0), one_span("annotation", None)],
                         ids=["empty", "one-kernel", "one-annotation"])
def test_interference_of_one_span_and_of_nothing(table):
    from pipebubble.analysis.serving.interference import interference

    assert interference(table) == (None, [])
