"""The span table's argument columns from Chrome/Kineto JSON: a copy's ``bytes``, an operator's ``flops``,
``Input Dims`` and ``Input type`` as the JSON text torch writes; the same from
the fast and the tolerant decode paths, whatever the file's layout; null wherever an event has none."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from conftest import shared

from pipebubble.ingest import read_file
from pipebubble.ingest.json import chrome
from pipebubble.ingest.json.events import decode_block, decode_tolerant

ARGS = ["bytes", "flops", "dims", "dtypes"]
EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": 1.0, "dur": 9.0,
     "args": {"External id": 3, "Input Dims": [[4096, 4096], [4096, 4096]], "Input type": ["float", "long int"],
              "flops": 137438953472}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7, "ts": 2.0,
     "dur": 1.0, "args": {"bytes": 4096, "correlation": 5}},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "pid": 0, "tid": 7, "ts": 3.0, "dur": 1.0,
     "args": {"bytes": 64}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 2, "ts": 4.0, "dur": 1.0,
     "args": {"Input Dims": [[2], []], "Input type": None}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 5.0, "dur": 1.0, "args": {}},
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 2, "ts": 6.0,
     "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 1024, "Device Id": 0, "Device Type": 1}},
]
#: What each event's columns hold, as torch writes the text.
WANT = [(None, 137438953472, "[[4096, 4096], [4096, 4096]]", '["float", "long int"]'),
        (4096, None, None, None), (64, None, None, None), (None, None, "[[2], []]", None),
        (None, None, None, None), (None, None, None, None)]
LAYOUTS = {"torch": {}, "indented": {"indent": 2}, "compact": {"separators": (",", ":")}}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_both_decode_paths_give_the_same_columns_in_every_layout(layout):
    """The typed decoder and the tolerant one (which a block with any odd value goes through) agree on every
    column; an indented or compact rewrite of the trace gives torch's own text."""
    block = json.dumps(EVENTS, **LAYOUTS[layout]).encode()
    fast = decode_block(block).frame
    tolerant, _ = decode_tolerant(block)
    assert fast.equals(tolerant, null_equal=True)
    assert fast.select(ARGS).rows() == WANT


def test_an_odd_value_sends_the_block_to_the_tolerant_path_and_keeps_the_others():
    """A ``bytes`` given as a string cannot be a size: null there, the block read event by event, the rest as
    the fast path reads them."""
    odd = [*EVENTS, {**EVENTS[1], "args": {"bytes": "4096"}}]
    block = json.dumps(odd).encode()
    assert decode_block(block).frame.select(ARGS).rows() == [*WANT, (None, None, None, None)]


def test_span_rows_keep_the_columns_and_pairs_have_none(tmp_path):
    """Through the reader: each span keeps its event's arguments; a B/E pair's are null."""
    pair = [{"ph": "B", "cat": "user_annotation", "name": "r", "pid": 1, "tid": 2, "ts": 0.5, "args": {"bytes": 1}},
            {"ph": "E", "cat": "user_annotation", "name": "r", "pid": 1, "tid": 2, "ts": 20.0}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [*EVENTS, *pair]}))
    spans = chrome.read(path).spans.sort("start")
    assert spans.select("name", *ARGS).rows() == [
        ("r", None, None, None, None), ("aten::mm", *WANT[0]), ("Memcpy HtoD (Pageable -> Device)", *WANT[1]),
        ("Memset (Device)", *WANT[2]), ("aten::add", *WANT[3]), ("gemm", *WANT[4])]


def test_recsys_copies_and_operator_inputs_equal_the_raw_events():
    """Every ``gpu_memcpy``/``gpu_memset`` span's bytes and every operator's ``Input Dims`` text equal the raw
    events' (read with the standard library, written back with torch's spacing)."""
    path = shared("kineto", "recsys_128rank_sampled_rank-0.json.gz")
    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "Trace"]
    spans = read_file(path, use_cache=False).spans
    copies = [e for e in events if e["cat"] in ("gpu_memcpy", "gpu_memset")]
    got = spans.filter(pl.col("kind").is_in(["memcpy", "memset"]))
    assert got.height == len(copies) == 50
    assert got["bytes"].sum() == sum(e["args"]["bytes"] for e in copies)
    dims = sorted(json.dumps(e["args"]["Input Dims"]) for e in events if "Input Dims" in e.get("args", {}))
    assert sorted(spans["dims"].drop_nulls().to_list()) == dims
    types = sorted(json.dumps(e["args"]["Input type"]) for e in events if "Input type" in e.get("args", {}))
    assert sorted(spans["dtypes"].drop_nulls().to_list()) == types
    assert spans["flops"].null_count() == spans.height  # recorded without with_flops


def test_a_string_or_float_argument_keeps_the_fast_path_and_reads_as_null(tmp_path):
    """ROCm's runtime calls write ``"bytes": "60"``: the block stays on the typed decoder (the tolerant one is
    several times slower) and both give the same columns, the string and the float as null."""
    from pipebubble.ingest.json import events as decoder

    events = [{"ph": "X", "cat": "cuda_runtime", "name": "hipMemcpyWithStream", "pid": 1, "tid": 1, "ts": 1.0,
               "dur": 2.0, "args": {"bytes": "60", "correlation": 7}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 4.0, "dur": 1.0,
               "args": {"flops": 2.5}},
              {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 5.0, "dur": 1.0,
               "args": {"bytes": 60}}]
    block = json.dumps(events).encode()
    decoder._FAST.decode(block)  # no ValidationError: the fast path takes it
    fast = decoder.decode_block(block).frame
    slow = decoder.decode_tolerant(block)[0]
    for frame in (fast, slow):
        assert frame["bytes"].to_list() == [None, None, 60] and frame["flops"].to_list() == [None, None, None]
