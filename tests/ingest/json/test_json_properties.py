"""Properties of JSON ingest: the order of events, the block size and the gunzip path never change what is
read; deep or whitespace-heavy input costs bounded time and memory."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipebubble import spans as span_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest.json import chrome
from pipebubble.ingest.json import trace as jsontrace

EPOCH_US = 1712195495519695  # absolute epoch µs, beyond 2**43: the timestamp text is read
_TS = st.one_of(
    st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False).map(lambda v: round(v, 3)),
    st.integers(0, 10**9).map(lambda v: EPOCH_US + v / 1000),  # fractions of µs at epoch scale
    st.sampled_from([4.7e15, -4.7e15, 1e400, "12", None]),  # out of range, not numbers
)
_EVENT = st.fixed_dictionaries(
    {
        "ph": st.sampled_from(["X", "X", "X", "B", "E", "b", "e", "M", "i", "C", "s"]),
        "cat": st.sampled_from(["kernel", "cpu_op", "gpu_memcpy", "user_annotation", "req"]),
        "name": st.one_of(st.sampled_from(["a", "b", "thread_name", "ncclKernel", "f({a}, {b})"]), st.integers()),
        "pid": st.one_of(st.integers(-3, 3), st.sampled_from(["Main", 2**31, 2**63, "7"])),
        "tid": st.integers(0, 3),
        "ts": _TS,
        "dur": st.one_of(st.integers(0, 1000), st.floats(0, 1000, allow_nan=False), st.just(-1)),
        "id": st.sampled_from([1, "0x1", 2]),
        "args": st.fixed_dictionaries({"External id": st.integers(0, 5), "name": st.sampled_from(["main", "w"])}),
    }
)
_TRACES = st.lists(_EVENT, max_size=40)
_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def text_of(events: list[dict], form: str) -> bytes:
    text = json.dumps(events if form == "array" else {"schemaVersion": 1, "traceEvents": events}, indent=1)
    return text.replace("Infinity", "1e400").encode()


def outcome(path, monkeypatch=None, block: int | None = None, to_disk: bool = False, scratch=None):
    """What reading ``path`` gives, comparable across ways of reading it: sorted spans, counts, warnings."""
    if monkeypatch is not None:
        monkeypatch.setattr(jsontrace, "BLOCK_BYTES", block or 16 << 20)
        monkeypatch.setattr(jsontrace, "GUNZIP_TO_DISK", 0 if to_disk else 16 << 20)
    try:
        result = chrome.read(path, 0, None, scratch)
    except TraceFormatError as exc:
        return ("error", str(exc))
    assert span_table.validate(result.spans) == []
    frame = result.spans.sort(pl.all(), nulls_last=True)
    return (frame, dict(result.skipped), result.warnings, result.meta["process_names"], result.meta["thread_names"])


def is_error(result) -> bool:
    return isinstance(result[0], str)


def same(a, b) -> bool:
    if is_error(a) or is_error(b):
        return a == b
    return a[0].equals(b[0]) and a[1:] == b[1:]


@_SETTINGS
@given(events=_TRACES, order=st.randoms(use_true_random=False), form=st.sampled_from(["array", "object"]))
def test_event_order_does_not_change_the_spans(tmp_path, events, order, form):
    shuffled = list(events)
    order.shuffle(shuffled)
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_bytes(text_of(events, form))
    second.write_bytes(text_of(shuffled, form))
    a, b = outcome(first), outcome(second)
    if is_error(a):
        assert is_error(b)
        return
    # B/E pairing follows time then file order, so only B/E-free traces must match exactly
    pairs = any(e["ph"] in "BEbe" for e in events)
    if not pairs:
        assert a[0].drop("source").equals(b[0].drop("source")) and a[1] == b[1]
    else:
        assert a[0].height == b[0].height and sum(a[1].values()) == sum(b[1].values())


@_SETTINGS
@given(
    events=_TRACES,
    block=st.integers(64, 4096),
    form=st.sampled_from(["array", "object"]),
    cut=st.one_of(st.none(), st.floats(0.3, 0.999)),
    gz=st.booleans(),
)
def test_block_size_and_gunzip_path_do_not_change_the_result(tmp_path, monkeypatch, events, block, form, cut, gz):
    text = text_of(events, form)
    data = gzip.compress(text) if gz else text
    if cut is not None:
        data = data[: max(1, int(len(data) * cut))]
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(data)
    reference = outcome(path, monkeypatch)
    assert same(outcome(path, monkeypatch, block=block), reference)
    if gz:
        assert same(outcome(path, monkeypatch, block=block, to_disk=True, scratch=tmp_path / "scratch"), reference)


def test_deep_values_take_bounded_time_and_memory(tmp_path):
    """Values nested thousands deep once took minutes and gigabytes: memory now stays a small multiple of the
    file (the time bound is only a guard against a hang; speed is measured in bench/, not in tests)."""
    for depth in (900, 5000, 200_000):
        deep = "[" * depth + "]" * depth
        text = f'[{{"ph": "X", "name": {deep}, "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {{"a": {deep}}}}}]'
        path = tmp_path / "deep.json"
        path.write_text(text)
        tracemalloc.start()
        started = time.perf_counter()
        result = chrome.read(path)
        elapsed = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert result.spans.height == 1 and elapsed < 60 and peak < 50 * len(text) + (20 << 20)


def test_whitespace_heavy_file_is_not_copied_whole(tmp_path):
    """Whitespace around the events is never copied into a block: peak memory stays far below the file."""
    size = 64 << 20
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1}).encode()
    for layout in ([b"[", b" " * size, event, b"]"], [b'{"traceEvents": [', event, b" " * size, b"]}", b" " * size]):
        path = tmp_path / "space.json"
        path.write_bytes(b"".join(layout))
        tracemalloc.start()
        result = chrome.read(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert result.spans.height == 1 and peak < size // 4
