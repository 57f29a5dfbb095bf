"""The fast paths of a block's decode give what the plain ones give: the block's columns as a plan run inside
``block_spans``' own queries (``decode_block(lazy=True)``) against the frame built on its own; ``block_spans``
told the block's phase counts (leaving out the allocator-event and pairing parts a block has none of) against
computing every part; kinds and lanes row by row (a small block) against once per distinct key, joined back;
a category's kind by its place in an Enum against a dict's ``replace_strict``; a worker's block read straight
in between brackets against the block as ``_wrapped`` gives it (errors and their offsets included)."""

from __future__ import annotations

import gzip
import json
from functools import partial
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, shared_files

from pipebubble.ingest.json import blocks as jsonblocks
from pipebubble.ingest.json import columns as jsoncolumns
from pipebubble.ingest.json import events as jsonevents
from pipebubble.ingest.json import spans as jsonspans

REPROS = ROOT.parent / "shared" / "repros"
REAL = [*shared_files("kineto", "*.json.gz"), *shared_files("inference", "*.json.gz"),
        *sorted(REPROS.glob("*.json") if REPROS.exists() else [])]


def _text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _region(data: bytes) -> memoryview:
    """The inside of the ``traceEvents`` array (up to the last ``]``; a cut-off file up to its end)."""
    key = data.find(b'"traceEvents"')
    start = data.index(b"[", key if key >= 0 else 0) + 1
    end = data.rfind(b"]")
    return memoryview(data)[start : end if end > start else len(data)]


def _blocks(data: bytes, size: int = 16 << 10) -> list[bytes]:
    region = _region(data)
    return [jsonblocks._wrapped(region, a, b) for a, b in jsonblocks._cuts(region, size)]


def _plain(block: bytes, base: int):
    """The block as every part is computed: the frame built on its own, no phase counts, one join."""
    try:
        decoded = jsonevents.decode_block(block)
    except jsonevents.BlockError as exc:
        return exc
    rest, table, skipped, _, memory = jsonspans.block_spans(decoded.frame, "s", 3, base)
    return rest, table, skipped, memory, decoded.phases


def _fast(block: bytes, base: int):
    result = jsonblocks._try_block(block, partial(jsonspans.block_spans, source="s", rank=3, base=base))
    if isinstance(result, jsonevents.BlockError):
        return result
    return result.events, result.spans, result.skipped, result.memory, result.phases


def _same(fast, plain) -> None:
    if isinstance(plain, jsonevents.BlockError):
        assert isinstance(fast, jsonevents.BlockError)
        assert (fast.message, fast.offset, fast.truncated) == (plain.message, plain.offset, plain.truncated)
        return
    (rest, table, skipped, memory, phases), (rest0, table0, skipped0, memory0, phases0) = fast, plain
    assert rest.equals(rest0) and rest.schema == rest0.schema
    assert table.equals(table0) and table.schema == table0.schema
    assert skipped == skipped0 and phases == phases0
    if memory is None or memory0 is None:  # no allocator events: left out, or an empty table
        assert all(m is None or m.height == 0 for m in (memory, memory0))
    else:
        assert memory.equals(memory0)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
@pytest.mark.parametrize("per_row", [0, 1 << 30], ids=["joined", "row-by-row"])
def test_real_blocks_decode_the_same_either_way(path, per_row, monkeypatch):
    monkeypatch.setattr(jsonspans, "_PER_ROW", per_row)
    for block in _blocks(_text(path))[:40]:
        for base in (0, 1_700_000_000_000_000_000):
            _same(_fast(block, base), _plain(block, base))


def _event(**fields) -> dict:
    return {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.25, **fields}


#: Blocks that take every branch: flows only, pairs and names, allocator events, big epoch timestamps (their
#: text read), times out of range, NaN and infinities, ids as strings and beyond int64, a category of each
#: case and none, Kineto's own span, the tolerant path (a name that is a number).
CASES = {
    "complete only": [_event(), _event(cat="cpu_op", pid=4242, tid=1, name="aten::mm")],
    "flows only": [{"ph": "s", "id": 1, "pid": 0, "tid": 1, "ts": 1}, {"ph": "f", "id": 1, "ts": 2}],
    "nothing": [],
    "pairs and names": [
        _event(), {"ph": "B", "name": "step", "pid": 1, "tid": 2, "ts": 5}, {"ph": "E", "pid": 1, "tid": 2, "ts": 9},
        {"ph": "b", "cat": "c", "id": 7, "name": "a", "ts": 1}, {"ph": "e", "cat": "c", "id": 7, "ts": 3},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ],
    "allocator events": [
        _event(), {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 4,
                   "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 2048, "Device Type": 1,
                            "Device Id": 0}},
        {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 5, "args": {"Device Id": -1}},
        {"ph": "i", "name": "other instant", "ts": 6},
    ],
    "epoch timestamps": [_event(ts=1712195495519695.5), _event(ts=1712195495519696.25, dur=0.001)],
    "odd times": [_event(ts=4.7e15), _event(dur=-1), _event(ts=None), _event(dur=1e300), _event(ts=-9.9e12)],
    "odd ids": [_event(pid="python", tid="main"), _event(pid=2**63), _event(pid=2**31), _event(tid=-(2**63) - 1),
                _event(pid="12345678901234567890123")],
    "categories": [_event(cat=c) for c in ("Kernel", "KERNEL", "gpu_memcpy", "Memset", "cuda_runtime", "Runtime",
                                           "cuda_driver", "cuda_sync", "python_function", "unknown", "", None,
                                           "Trace", "user_annotation", "gpu_user_annotation")],
    "names": [_event(name=n) for n in ("ncclDevKernel_AllReduce", "void nccl_x", "ProfilerStep#3", None, "")]
    + [_event(cat="user_annotation", name="nccl:all_reduce"), _event(cat="cuda_runtime", name="cudaDeviceSynchronize")],
    "tolerant": [_event(name=17), _event(cat=["k"]), _event(args={"External id": "x", "correlation": 2.5})],
}


@pytest.mark.parametrize("events", CASES.values(), ids=CASES)
@pytest.mark.parametrize("per_row", [0, 1 << 30], ids=["joined", "row-by-row"])
def test_blocks_of_every_kind_decode_the_same_either_way(events, per_row, monkeypatch):
    monkeypatch.setattr(jsonspans, "_PER_ROW", per_row)
    block = json.dumps(events).encode()
    for base in (0, 1_700_000_000_000_000_000, -(2**62) + 1):
        _same(_fast(block, base), _plain(block, base))


def test_a_plan_is_given_only_where_no_timestamp_needs_its_text():
    plain = jsonevents.decode_block(json.dumps(CASES["complete only"]).encode(), lazy=True)
    epoch = jsonevents.decode_block(b'[{"ph": "X", "name": "k", "ts": 1712195495519695.812, "dur": 1}, '
                                    b'{"ph": "X", "name": "k", "ts": 1712195495519696.5, "dur": 1}]', lazy=True)
    assert isinstance(plain.frame, pl.LazyFrame) and isinstance(epoch.frame, pl.DataFrame)
    assert epoch.frame["ts_ns"].to_list() == [1712195495519695812, 1712195495519696500]


@pytest.mark.parametrize("values, big", [
    ([1.0, -2.0, None], False), ([], False), ([None], False), ([float("nan")], True), ([float("nan"), 1.0], False),
    ([2.0**43], True), ([-(2.0**43)], True), ([float("inf")], True), ([1.0, 1e300], True),
])
def test_a_timestamp_may_be_big_only_beyond_2_43_us(values, big):
    assert jsoncolumns._maybe_big(pl.Series(values, dtype=pl.Float64)) is big


def test_categories_map_to_kinds_as_the_dict_did():
    kinds = jsonspans.CATEGORY_KINDS
    cats = [*kinds, *(c.upper() for c in kinds), "Cuda_Runtime", "weird", "", None]
    frame = pl.DataFrame({"cat": cats, "name": ["x"] * len(cats)})
    before = pl.col("cat").str.to_lowercase().replace_strict(jsonspans.CATEGORY_KINDS, default="cpu_op")
    assert frame.select(jsonspans._KIND).to_series().to_list() == frame.select(before).to_series().to_list()


def _file_block(tmp_path: Path, text: bytes):
    path = tmp_path / "t.json"
    path.write_bytes(b"xx" + text + b"yy")
    finish = partial(jsonspans.block_spans, source="s", rank=3, base=0)
    return jsonblocks._try_file_block(str(path), 2, len(text), finish)


def _wrapped_block(text: bytes):
    block = jsonblocks._wrapped(memoryview(text), 0, len(text))
    return jsonblocks._try_block(block, partial(jsonspans.block_spans, source="s", rank=3, base=0))


def _as_tuple(result):
    if isinstance(result, jsonevents.BlockError):
        return result
    return result.events, result.spans, result.skipped, result.memory, result.phases


@pytest.mark.parametrize("text", [
    b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}',
    b'\n  {"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2},\n  {"ph": "s", "ts": 1}\n  ',
    b'\x0b{"ph": "X", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}\x0c',  # not JSON whitespace
    b"   \n ",
    b'{"ph": "X", "name": "k", "ts": 1, "dur": 2}, {"ph": "X", "name": ',  # cut off
    b'  {"ph": "X", "name": "k", "ts": 1, "dur": 2}, {"ph": "X" "name": "j"}',  # damaged
    b'{"ph": "X", "name": "\xff", "ts": 1, "dur": 2}',
], ids=["compact", "multi-line", "vertical-tab", "blank", "cut-off", "damaged", "bad-utf8"])
def test_a_worker_reads_its_block_as_the_wrapped_text_decodes(tmp_path, text):
    _same(_as_tuple(_file_block(tmp_path, text)), _as_tuple(_wrapped_block(text)))


def test_a_workers_block_of_a_real_trace_reads_the_same(tmp_path):
    paths = shared_files("kineto", "resnet_*.json.gz")
    if not paths:
        pytest.skip("real traces not available")
    data = _text(paths[0])
    path = tmp_path / "trace.json"
    path.write_bytes(data)
    region = _region(data)
    offset = data.index(b"[", data.find(b'"traceEvents"')) + 1
    fn = partial(jsonspans.block_spans, source="s", rank=3, base=0)
    for a, b in jsonblocks._cuts(region, 256 << 10)[:8]:
        worker = jsonblocks._try_file_block(str(path), offset + a, b - a, fn)
        here = jsonblocks._try_block(jsonblocks._wrapped(region, a, b), fn)
        _same(_as_tuple(worker), _as_tuple(here))
