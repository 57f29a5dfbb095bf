"""Generic Chrome-trace JSON: both top-level forms, every phase, pairing, names, counting."""

from __future__ import annotations

import gzip
import json

import pytest

from pipebubble.ingest import load
from pipebubble.ingest.json import trace as jsontrace
from pipebubble.ingest.json.columns import parse_us_text


def write(tmp_path, doc, name="trace.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "trainer"}},
    {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 10, "dur": 5},
    {"ph": "B", "name": "outer", "pid": 1, "tid": 3, "ts": 0},
    {"ph": "B", "name": "inner", "pid": 1, "tid": 3, "ts": 2},
    {"ph": "E", "pid": 1, "tid": 3, "ts": 4},
    {"ph": "E", "pid": 1, "tid": 3, "ts": 9},
    {"ph": "E", "pid": 1, "tid": 3, "ts": 12},
    {"ph": "B", "name": "never closed", "pid": 1, "tid": 4, "ts": 1},
    {"ph": "b", "cat": "req", "id": "0x1", "name": "request", "pid": 1, "tid": 5, "ts": 3},
    {"ph": "e", "cat": "req", "id": "0x1", "name": "request", "pid": 1, "tid": 5, "ts": 8.5},
    {"ph": "e", "cat": "req", "id": "0x2", "name": "request", "pid": 1, "tid": 5, "ts": 9},
    {"ph": "i", "name": "mark", "pid": 1, "tid": 2, "ts": 5, "s": "t"},
    {"ph": "C", "name": "mem", "pid": 1, "ts": 5, "args": {"bytes": 10}},
    {"ph": "s", "id": 1, "pid": 1, "tid": 2, "ts": 5, "cat": "flow", "name": "f"},
    {"ph": "f", "id": 1, "pid": 1, "tid": 3, "ts": 6, "cat": "flow", "name": "f", "bp": "e"},
]


@pytest.mark.parametrize("form", ["object", "array"])
def test_every_phase_counted_and_pairs_matched(tmp_path, form):
    doc = {"traceEvents": EVENTS, "displayTimeUnit": "ns"} if form == "object" else EVENTS
    result = load([write(tmp_path, doc)], use_cache=False)
    spans = {r["name"]: (r["start"], r["end"]) for r in result.spans.iter_rows(named=True)}
    assert spans == {"aten::mm": (10_000, 15_000), "outer": (0, 9_000), "inner": (2_000, 4_000),
                     "request": (3_000, 8_500)}
    file = result.files[0]
    assert file.events_read == len(EVENTS)
    assert dict(file.skipped) == {"metadata": 2, "instant": 1, "counter": 1, "flow": 2, "unmatched_end": 1,
                                  "unmatched_begin": 1, "unmatched_async_end": 1}
    assert file.meta["process_names"] == {"1": "trainer"} and file.meta["thread_names"] == {"1/2": "main"}
    events_in_spans = 1 + 2 * 2 + 2 * 1  # one X, two B/E pairs, one b/e pair
    assert events_in_spans + sum(file.skipped.values()) == len(EVENTS)


def test_string_pids_get_stable_ids(tmp_path):
    doc = [{"ph": "X", "name": "a", "pid": "Renderer", "tid": "main", "ts": 1, "dur": 1},
           {"ph": "X", "name": "b", "pid": "Renderer", "tid": "main", "ts": 3, "dur": 1}]
    spans = load([write(tmp_path, doc)], use_cache=False).spans
    assert spans["pid"].n_unique() == 1 and spans["pid"][0] is not None and spans["lane"].n_unique() == 1


def test_gzip_and_relative_base_time(tmp_path):
    doc = {"baseTimeNanoseconds": 1_700_000_000_000_000_000, "distributedInfo": {"rank": 3},
           "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.5, "dur": 2.25}]}
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    row = load([path], use_cache=False).spans.row(0, named=True)
    assert (row["start"], row["end"]) == (1_700_000_000_000_001_500, 1_700_000_000_000_003_750)
    assert (row["rank"], row["device"], row["stream"], row["lane"]) == (3, 0, 7, "rank3/gpu0")


def test_rank_falls_back_to_file_name_then_position(tmp_path):
    doc = [{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 0, "dur": 1}]
    folder = tmp_path / "run"
    folder.mkdir()
    write(folder, doc, "worker_rank-5.json")
    write(folder, doc, "zzz.json")
    ranks = sorted(load([folder], use_cache=False).spans["rank"].to_list())
    assert ranks == [1, 5]  # zzz.json is the second file in the folder


def test_blocks_split_inside_strings_still_decode(tmp_path, monkeypatch):
    """A block boundary that falls inside a name containing '}, {' is detected and the block extended."""
    events = [{"ph": "X", "cat": "kernel", "name": "f({a}, {b})" * 20, "pid": 0, "tid": 1, "ts": i * 10, "dur": 5}
              for i in range(300)]
    path = write(tmp_path, {"traceEvents": events})
    whole = load([path], use_cache=False).spans
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 700)
    split = load([path], use_cache=False).spans
    assert split.equals(whole) and split.height == 300


def test_parse_us_text_exact():
    import polars as pl

    text = pl.Series(["1712195495519689.047", "5", "-1.5", "2.1234", "1e3", "7."])
    assert parse_us_text(text).to_list() == [1712195495519689047, 5000, -1500, 2123, 1_000_000, 7000]
