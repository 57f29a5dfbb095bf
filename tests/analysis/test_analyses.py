"""Every registered analysis on the degenerate inputs (an empty span table, one kernel, one CPU operator, one
annotation): each returns its documented empty or valid part and never raises (as pyinstrument runs every
processor on an empty frame tree, test/test_processors.py)."""

from __future__ import annotations

import polars as pl
import pytest

from pipebubble import spans
from pipebubble.analysis import memcpy
from pipebubble.analysis.breakdown import GpuPart
from pipebubble.analysis.breakdown.strips import empty_bins
from pipebubble.analysis.comm.collectives import CALL_COLUMNS
from pipebubble.analysis.critical import CriticalPart
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.lanes import LANE_COLUMNS
from pipebubble.analysis.launch import LaunchPart
from pipebubble.analysis.pipeline.report import PipelineSection, StagePart, reduce_stages
from pipebubble.analysis.pipeline.work import WORK_COLUMNS
from pipebubble.analysis.registry import ANALYSES
from pipebubble.options import Options


def one_span(kind: str, device: int | None) -> pl.DataFrame:
    return spans.conform(pl.DataFrame({"source": ["t"], "rank": [0], "pid": [None if device is not None else 7],
                                       "tid": [1], "device": [device], "stream": [7 if device is not None else None],
                                       "lane": ["rank0/gpu0" if device is not None else "rank0/pid7/tid1"],
                                       "kind": [kind], "name": ["x"], "start": [100], "end": [250]}))


TABLES = {"empty": spans.empty, "one-kernel": lambda: one_span("kernel", 0),
          "one-cpu-op": lambda: one_span("cpu_op", None), "one-annotation": lambda: one_span("annotation", None)}
LANES = {"empty": 0, "one-kernel": 2, "one-cpu-op": 1, "one-annotation": 0}  # a kernel: its device and stream


def check(name: str, part, table: str, options: Options) -> None:
    """The documented part of each analysis for a table with nothing to analyse beyond lanes."""
    if name == "lanes":
        assert isinstance(part, pl.DataFrame) and part.columns == LANE_COLUMNS and part.height == LANES[table]
    elif name == "stages":
        if options.files == 1 or table == "empty":
            assert part is None  # the whole job, one rank and at most one GPU: no pipeline
        else:  # one file of a job of unknown size: its one stage's work, which reduces to no pipeline
            assert isinstance(part, StagePart) and part.work.columns == WORK_COLUMNS and part.work.height <= 1
            assert reduce_stages([part]) == PipelineSection()
    elif name == "serving":
        assert part == (None, [])
    elif name == "comm":  # no collective calls: at most the participant's traced window (kind null)
        assert isinstance(part, CommPart) and part.calls.columns == CALL_COLUMNS
        assert part.calls["kind"].null_count() == part.calls.height <= 1
        assert (part.facts["p2p_send"], part.facts["p2p_recv"]) == (0, 0)
    elif name == "gpu":  # a kernel: its one GPU's whole window, all compute; else no rows
        assert isinstance(part, GpuPart)
        if table == "one-kernel":
            (row,) = part.rows
            assert (row.window_ns, row.compute_ns, row.idle_ns, row.step) == (150, 150, 0, None)
            assert part.stats.select("kind", "name", "count", "total").rows() == [("compute", "x", 1, 150)]
            assert part.ops.is_empty() == (options.files == 1)  # value counts only when files are combined
        else:
            assert part.rows == [] and part.stats.is_empty()
    elif name == "strips":  # a kernel: its GPU's window binned, all compute; else no bins
        assert isinstance(part, pl.DataFrame) and part.columns == empty_bins().columns
        assert part.is_empty() == (table != "one-kernel")
    elif name == "critical":  # a kernel: its one run; else nothing
        assert isinstance(part, CriticalPart)
        assert part.nodes.height == (table == "one-kernel") and part.steps.is_empty()
    elif name in ("requests", "memory"):  # no request table nor request events, no allocator events
        assert part is None
    elif name == "memcpy":  # no copy: no rows
        assert isinstance(part, pl.DataFrame) and part.schema == memcpy.empty().schema and part.is_empty()
    elif name == "launch":  # no launch call nor GPU annotation: every frame empty
        assert isinstance(part, LaunchPart) and all(getattr(part, k).is_empty() for k in LaunchPart.FRAMES)
    elif name == "flops":  # no operator with shapes or a flops arg
        assert part is None
    else:
        pytest.fail(f"no expectation written for the registered analysis {name!r}")


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("name", ANALYSES)
@pytest.mark.parametrize("options", [Options(), Options(files=1, world=1)], ids=["defaults", "one-file"])
def test_every_analysis_on_degenerate_tables(name, table, options):
    run = ANALYSES[name].run
    check(name, run(TABLES[table](), options), table, options)
    check(name, run(TABLES[table](), options, {}), table, options)


def test_every_analysis_takes_the_documented_signature():
    """``f(spans, options, meta=None, **reads)``: what it reads by keyword, as its entry declares, None when not
    given; and each registry name is a field of the map's part."""
    import inspect
    from dataclasses import fields

    from pipebubble.run.mapper import FilePart

    for name, analysis in ANALYSES.items():
        parameters = inspect.signature(analysis.run).parameters
        assert list(parameters)[:3] == ["spans", "options", "meta"], name
        assert list(parameters)[3:] == list(analysis.reads), name
        assert all(p.default is None for p in list(parameters.values())[2:]), name
    assert set(ANALYSES) <= {f.name for f in fields(FilePart)}
