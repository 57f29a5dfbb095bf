"""The map's faster paths give what their plain forms give: the root-cause windows' union lengths by binary
search and by the as-of query, and the point-to-point match's unpaired counts."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.comm import p2p
from pipebubble.analysis.rootcause.part import _covered, _joined

ATS = ("origin", "arrival", "end")


def _unions() -> pl.DataFrame:
    rows = [(0, "busy", 0, 10), (0, "busy", 20, 30), (0, "host", 5, 25), (1, "busy", 100, 150),
            (-7, "cpu_comm", 40, 60)]
    frame = pl.DataFrame(rows, schema={"who": pl.Int64, "cls": pl.String, "start": pl.Int64, "end": pl.Int64},
                         orient="row")
    length = pl.col("end") - pl.col("start")
    return frame.with_columns(before=(length.cum_sum() - length).over("who", "cls"))


def _points() -> pl.DataFrame:
    rows = [(0, 0, 0, 5, 25), (1, 0, None, 22, 35), (2, 1, 90, 120, 200), (3, -7, 0, 50, 61), (4, 2, 1, 2, 3)]
    schema = {"row": pl.UInt32, "who": pl.Int64, "origin": pl.Int64, "arrival": pl.Int64, "end": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_covered_by_search_is_the_as_of_query():
    points, unions = _points(), _unions()
    searched = _covered(points, unions, ATS)
    joined = _joined(points, unions, ATS).sort("row")
    assert searched.select(joined.columns).equals(joined)
    assert searched.filter(pl.col("row") == 1)["arrival_busy"].item() == 12  # 10 before, 2 of the second
    assert searched.filter(pl.col("row") == 1)["origin_busy"].item() == 0  # no origin: nothing before it


def test_covered_far_apart_times_take_the_query():
    points = _points().with_columns(end=pl.when(pl.col("row") == 4).then(2**62).otherwise("end"))
    unions = _unions()
    joined = _joined(points, unions, ATS).sort("row")
    assert _covered(points, unions, ATS).sort("row").select(joined.columns).equals(joined)


def test_match_counts_what_is_left_unpaired():
    rows = pl.DataFrame({
        "who": [0, 1, 0, 1, 0], "rank": [0, 1, 0, 1, 0], "lane": ["a", "b", "a", "b", "a"],
        "direction": ["send", "recv", "send", "recv", "send"], "peer": [1, 0, 1, 0, None],
        "seq": [0, 0, 1, 1, 2], "start": [0, 5, 20, 25, 40], "end": [10, 15, 30, 35, 50],
        "bytes": [8, 8, 8, 16, None], "tag": [None] * 5, "microbatch": [0, 0, 1, 1, 2],
        "phase": ["forward"] * 5, "stage_id": [None] * 5,
    }, schema=p2p.SCHEMA)
    pairs, unpaired = p2p.match(rows)
    assert pairs.height == 1 and pairs["wait"].item() == 0
    assert unpaired == {"peer unknown": 1, "size or tag differ": 2}
    _, lone = p2p.match(rows.filter(pl.col("seq") != 1).with_columns(pl.col("peer").fill_null(1)))
    assert lone == {"no matching recv": 1}


def test_a_spilled_scans_distinct_names_are_read_in_a_stream_to_the_same_answers(tmp_path):
    """What a spilled table's map asks of its whole scan before reading it (label patterns per rank, engine
    signs, send/receive ranks, each participant's window) runs on the streaming engine, in bounded memory,
    and answers as the table in memory does."""
    from conftest import shared

    from pipebubble.analysis.comm.collectives import participant_windows
    from pipebubble.analysis.intervals import engine_for
    from pipebubble.analysis.pipeline.labels import label_choices
    from pipebubble.analysis.pipeline.part import _ranks_sending
    from pipebubble.analysis.registry import may_hold_steps, serving_ranks
    from pipebubble.ingest import read_file
    from pipebubble.options import Options

    spans = read_file(shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz"), use_cache=False).spans
    spans.write_parquet(tmp_path / "part.parquet")
    scan = pl.scan_parquet(tmp_path / "part.parquet")
    assert engine_for(scan) == "streaming" and engine_for(spans) != "streaming"
    assert label_choices(scan) == label_choices(spans)
    assert serving_ranks(scan, Options()) == serving_ranks(spans, Options())
    assert may_hold_steps(scan, Options()) == may_hold_steps(spans.lazy(), Options())
    assert _ranks_sending(scan) == _ranks_sending(spans)
    assert participant_windows(scan).sort("who").equals(participant_windows(spans).sort("who"))
