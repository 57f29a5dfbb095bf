"""A batch's union lengths, whichever way they are computed: a big frame sorted by its groups' numbers and a
small one sorted by its keys give every group's union as the merge does; the root-cause unions of every
class, sorted once for all of them, are each class's merge."""

from __future__ import annotations

import polars as pl
from conftest import shared
from hypothesis import given, settings
from hypothesis import strategies as st

from pipebubble.analysis import intervals
from pipebubble.analysis.intervals import merge, unions
from pipebubble.analysis.rootcause import part
from pipebubble.ingest import read_file
from pipebubble.spans import GPU_WORK

rows = st.lists(
    st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from([1, 2]), st.integers(0, 10_000),
              st.integers(0, 500)),
    min_size=1, max_size=60,
)


def frame(items) -> pl.DataFrame:
    return pl.DataFrame([(g, k, s, s + d) for g, k, s, d in items], schema={"g": pl.String, "k": pl.Int64,
                        "start": pl.Int64, "end": pl.Int64}, orient="row")


def merged_lengths(spans: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    return merge(spans, by).group_by(by).agg(
        ns=(pl.col("end") - pl.col("start")).sum(), start=pl.col("start").min(), end=pl.col("end").max()
    ).sort(by)


@settings(max_examples=150, deadline=None)
@given(rows, st.sampled_from([["g"], ["g", "k"], ["k", "g"]]), st.booleans())
def test_unions_of_small_and_big_frames_are_the_merges(items, by, big):
    spans = frame(items)
    keyed_at = intervals._KEYED_ROWS
    intervals._KEYED_ROWS = 0 if big else keyed_at
    try:
        got = unions(spans, by)
    finally:
        intervals._KEYED_ROWS = keyed_at
    assert got.equals(merged_lengths(spans, by))  # the groups in their sort order, nulls first


def test_rootcause_unions_are_each_class_merged():
    spans = read_file(shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), 0, False).spans
    got = part._unions(spans).with_columns(pl.col("cls").cast(pl.String))
    tags = {"compute": pl.col("kind").is_in(GPU_WORK) & (pl.col("kind") != "comm"),
            "busy": pl.col("kind").is_in(GPU_WORK), "cpu_comm": pl.col("kind") == "comm"}
    for cls, tag in tags.items():
        on_gpu = pl.col("device").is_not_null() if cls != "cpu_comm" else pl.col("device").is_null()
        gpu = spans.filter(on_gpu & tag).with_columns(who=pl.col("rank").cast(pl.Int64))
        want = merge(gpu, ["who"]).sort("who", "start")
        assert got.filter(pl.col("cls") == cls).select("who", "start", "end").sort("who", "start").equals(want)
