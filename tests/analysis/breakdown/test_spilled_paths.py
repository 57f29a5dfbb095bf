"""The ways a spilled trace's GPU breakdown is read: a trace whose GPU operations fit one window holds them,
writes no narrow copies and changes no number (one that needs several windows, on a full volume too:
test_breakdown_windows). And the merges both lean on give the plain sort's answer for
keys of every kind (categories, enums, nulls); the breakdown's five unions merged from one sort equal each
merged alone; and whether a scan holds stages is told from its distinct names as from the whole table."""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
from conftest import shared
from hypothesis import given, settings
from hypothesis import strategies as st
from spilled import comparable

from pipebubble import budget
from pipebubble.analysis import intervals
from pipebubble.ingest import cache
from pipebubble.options import Options, Scale
from pipebubble.run import run

TRACE = ("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")


def scratch_folders(monkeypatch) -> list:
    """The scratch folders the breakdown asks for (a read's own spill folder has a key; scratch has none)."""
    asked, real = [], cache.new_spill

    def counted(work, entry_key):
        if entry_key is None:
            asked.append(work)
        return real(work, entry_key)

    monkeypatch.setattr(cache, "new_spill", counted)
    return asked


def spilled(monkeypatch, tmp_path, memory_budget: str) -> dict:
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(budget.SPILL_ENV, "1")
    monkeypatch.setenv(budget.ENV, memory_budget)
    return run([shared(*TRACE)], Options(), Scale(use_cache=False)).to_dict()


def test_gpu_operations_that_fit_one_window_are_held_and_write_no_copies(monkeypatch, tmp_path):
    in_memory = run([shared(*TRACE)], Options(), Scale(use_cache=False)).to_dict()
    asked = scratch_folders(monkeypatch)
    report = spilled(monkeypatch, tmp_path, "1G")
    assert budget.rows_per_window() // 2 > 3774, "the trace's GPU operations fit one window"
    assert not asked, "no narrow copies written"
    assert comparable(report) == comparable(in_memory)


keys = st.lists(
    st.tuples(st.sampled_from(["b", "a", None]), st.sampled_from([3, None, -1]), st.integers(0, 60),
              st.integers(0, 9)),
    min_size=1, max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(keys)
def test_big_frame_merges_number_keys_of_every_kind_as_a_sort_orders_them(rows):
    table = pl.DataFrame([(g, k, s, s + d) for g, k, s, d in rows], schema=["g", "k", "start", "end"], orient="row")
    table = table.with_columns(c=pl.col("g").cast(pl.Categorical), e=pl.col("g").cast(pl.Enum(["b", "a"])))
    cases = (["c"], ["e"], ["e", "k"], ["c", "k"], ["k"], ["g", "k"])
    plain = [intervals.merge(table, by) for by in cases]
    at = intervals._FLAT_ROWS
    intervals._FLAT_ROWS = 0
    try:
        flat = [intervals.merge(table, by) for by in cases]
    finally:
        intervals._FLAT_ROWS = at
    for by, a, b in zip(cases, plain, flat, strict=True):
        assert a.schema == b.schema, by
        assert a.rows() == b.rows(), by


@pytest.mark.parametrize("rows", [1_000, 10**9])
def test_windowed_lanes_of_a_real_trace_equal_the_whole_tables(rows):
    from pipebubble.analysis.lanes import lane_table, lane_table_windowed
    from pipebubble.ingest import read_file

    spans = read_file(shared("kineto", "mi250_rocm_toy_train.json.gz"), use_cache=False).spans
    assert lane_table_windowed(spans.lazy(), rows).equals(lane_table(spans))


classed = st.lists(
    st.tuples(st.sampled_from(["gpu0", "gpu1", None]), st.sampled_from(["compute", "comm", "memcpy", "memset"]),
              st.integers(0, 80), st.integers(0, 12)),
    min_size=1, max_size=80,
)
UNIONS = {"compute": ["compute"], "comm": ["comm"], "memory": ["memcpy", "memset"], "busy": ["compute", "comm"],
          "all": ["compute", "comm", "memcpy", "memset"], "none": []}


@settings(max_examples=150, deadline=None)
@given(classed, st.booleans())
def test_unions_merged_from_one_sort_equal_each_union_merged_alone(rows, flat):
    table = pl.DataFrame([(g, c, s, s + d) for g, c, s, d in rows], schema=["lane", "cls", "start", "end"],
                         orient="row")
    at = intervals._FLAT_ROWS
    intervals._FLAT_ROWS = 0 if flat else 10**9
    try:
        each = intervals.merge_each(table, ["lane"], "cls", UNIONS)
    finally:
        intervals._FLAT_ROWS = at
    assert each["cls"].dtype == pl.Enum(list(UNIONS))
    for name, values in UNIONS.items():
        alone = intervals.merge(table.filter(pl.col("cls").is_in(values)), ["lane"])
        assert each.filter(pl.col("cls") == name).drop("cls").rows() == alone.rows(), name


@pytest.mark.parametrize("trace", [TRACE, ("kineto", "recsys_128rank_sampled_rank-0.json.gz"),
                                   ("kineto", "mi250_rocm_toy_train.json.gz")])
def test_whether_a_scan_holds_stages_is_told_from_its_distinct_names_as_from_the_whole_table(trace):
    from pipebubble.analysis.pipeline import part as stage_part
    from pipebubble.ingest import read_file
    from pipebubble.options import PipelineOptions

    spans = read_file(shared(*trace), use_cache=False).spans
    for options in (PipelineOptions(), PipelineOptions(stages=replace(PipelineOptions().stages,
                                                                      microbatch_regex=r"(?P<mb>\d+)$"))):
        whole = (not stage_part.one_stage(spans)) or stage_part._one_stage_of_many(spans, options, None)
        assert stage_part.holds_stages(spans.lazy(), options, None) == whole
        sending = bool(stage_part._ranks_sending(spans))
        bare = not stage_part._one_stage_of_many(spans, options, None) and not sending
        assert stage_part.no_evidence(spans.lazy(), options, None) == bare
