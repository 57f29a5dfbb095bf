"""The same events read the same whatever the JSON layout: torch's multi-line one, the compact one-line one
other Chrome-trace writers use (no whitespace), one line with spaces; whatever the block size, with nested
``},{`` in args objects and in strings, and metadata full of brackets after the events array."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from pipebubble import spans as span_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import read_file
from pipebubble.ingest.json import blocks as jsonblocks
from pipebubble.ingest.json import chrome
from pipebubble.ingest.json import events as jsonevents
from pipebubble.ingest.json import split as jsonsplit
from pipebubble.ingest.json import trace as jsontrace

STEPS = 40
EPOCH_US = "1712195495519695.812"  # beyond 2**43 µs, more digits than a float holds: read from its text
LAYOUTS = {
    "multiline": {"indent": 2},
    "compact": {"separators": (",", ":")},
    "spaced": {},
}
TRAILER = {
    "traceName": "t",
    "metadata": {"shapes": [[i] for i in range(12)], "log": "[0] ]}, ], [1]", "cfg": [{"a": [1]}, {"b": []}]},
}


def events() -> list[dict]:
    """Per step a CPU op (nested objects in its args), a launch, a kernel (a name and a note with ``},{``
    and non-ASCII text in them) and its two flow ends; then a few events of every other kind."""
    out: list[dict] = []
    for i in range(STEPS):
        ts = 1000.0 + 20 * i
        frames = [{"file": "a.py", "line": i}, {"file": "b.py", "line": 2, "sub": [{"k": 1}, {"k": 2}]}]
        out.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": f"aten::mm_{i % 3}",
                "pid": 10,
                "tid": 11,
                "ts": ts,
                "dur": 12.5,
                "args": {"External id": i, "Input Dims": [[2, 3], []], "frames": frames},
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 10,
                "tid": 11,
                "ts": ts + 1,
                "dur": 3.25,
                "args": {"External id": i, "correlation": 100 + i},
            }
        )
        out.append({"ph": "s", "id": i, "pid": 10, "tid": 11, "ts": ts + 1, "cat": "ac2g", "name": "ac2g"})
        name = 'gemm<"},{"ph":"X"},{">' if i % 4 == 0 else f"kernel_é名_{i % 2}"
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "pid": 0,
                "tid": 7,
                "ts": ts + 5,
                "dur": 8.0,
                "args": {"External id": i, "correlation": 100 + i, "note": "x},{y", "grid": [{"x": 1}, {"y": 2}]},
            }
        )
        out.append({"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": ts + 5, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    out += [
        {"ph": "M", "name": "process_name", "pid": 10, "args": {"name": "trainer"}},
        {"ph": "M", "name": "thread_name", "pid": 10, "tid": 11, "args": {"name": "main"}},
        {"ph": "B", "cat": "user_annotation", "name": "step", "pid": 10, "tid": 11, "ts": 900.0},
        {"ph": "E", "cat": "user_annotation", "name": "step", "pid": 10, "tid": 11, "ts": 2000.0},
        {"ph": "X", "cat": "cpu_op", "name": "exact", "pid": 10, "tid": 12, "ts": "EPOCH", "dur": 1.0},
        {"ph": "X", "cat": "cpu_op", "name": "bad", "pid": 10, "tid": 12, "ts": 5.0, "dur": -1},
        {"ph": "X", "cat": "cpu_op", "name": "lone \ud800 surrogate", "pid": 10, "tid": 12, "ts": 6.0, "dur": 1.0},
        {"ph": "C", "name": "mem", "pid": 10, "ts": 7.0, "args": {"bytes": 1}},
        {"ph": "i", "name": "mark", "pid": 10, "tid": 11, "ts": 8.0, "s": "t"},
    ]
    return out


def write(folder: Path, layout: str, cut_at: str | None = None) -> Path:
    """The trace in ``layout``; with ``cut_at``, cut off mid-write just after the first occurrence of that
    text (an event's start)."""
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0}, {"id": 1}], "traceEvents": events(), **TRAILER}
    # Non-ASCII text as UTF-8, the lone surrogate as the escape writers give it.
    text = json.dumps(doc, ensure_ascii=False, **LAYOUTS[layout]).replace("\ud800", "\\ud800")
    text = text.replace('"EPOCH"', EPOCH_US)
    if layout != "multiline":
        assert "\n" not in text
    if cut_at is not None:
        text = text[: text.index(cut_at) + len(cut_at)]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "trace.json"
    path.write_text(text, encoding="utf-8")
    return path


def outcome(path: Path) -> tuple:
    """What reading ``path`` gives, with its own path taken out: sorted spans, counts, warnings, names."""
    result = chrome.read(path)
    return normalised(result, path)


def normalised(result, path: Path) -> tuple:
    assert span_table.validate(result.spans) == []
    frame = result.spans.drop("source").sort(pl.all(), nulls_last=True)
    warnings = [w.replace(str(path), "FILE") for w in result.warnings]
    meta = result.meta
    return frame, dict(result.skipped), warnings, meta["process_names"], meta["thread_names"], meta["unread_bytes"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple:
    return outcome(write(tmp_path_factory.mktemp("ref"), "compact"))


def test_reference_holds_the_events_written(reference):
    """Counted by hand from ``events``: 3 spans a step, the B/E pair, the exact and the repaired one."""
    frame, skipped, warnings, processes, threads, unread = reference
    assert frame.height == 3 * STEPS + 3
    assert Counter(frame["kind"].to_list()) == {"cpu_op": STEPS + 2, "runtime": STEPS, "kernel": STEPS, "annotation": 1}
    assert skipped == {"flow": 2 * STEPS, "metadata": 2, "counter": 1, "instant": 1, "bad_time": 1}
    assert warnings == ["FILE: 1 invalid UTF-8 sequences or lone surrogates replaced by U+FFFD"]
    assert processes == {"10": "trainer"} and threads == {"10/11": "main"} and unread == 0
    exact = frame.filter(pl.col("name") == "exact")
    assert exact["start"].to_list() == [1712195495519695812] and exact["end"].to_list() == [1712195495519696812]
    gemm = frame.filter(pl.col("name") == 'gemm<"},{"ph":"X"},{">')
    assert gemm.height == STEPS // 4 and gemm["start"].to_list()[:2] == [1_005_000, 1_085_000]
    assert frame.filter(pl.col("name") == "kernel_é名_1").height == STEPS // 2  # odd steps: none a multiple of 4


@pytest.mark.parametrize("probe", [True, False], ids=["probed-cuts", "first-cuts"])
@pytest.mark.parametrize("block", [None, 150, 700, 2_500])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_and_block_size_reads_the_same(tmp_path, monkeypatch, reference, layout, block, probe):
    """Small blocks cut everywhere: between events, between nested objects, inside strings. Without the
    probe (``first-cuts``) every cut is the first ``},{`` past its target, so blocks cut inside events fail
    and are read again joined to the next: the same result either way."""
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", block or 16 << 20)
    if not probe:
        monkeypatch.setattr(jsonblocks, "_PROBE_TRIES", 0)
    assert_same(outcome(write(tmp_path, layout)), reference)


@pytest.mark.parametrize("layout", ["multiline", "compact"])
def test_a_pool_reads_every_layout_the_same(tmp_path, monkeypatch, reference, layout):
    """Blocks decoded in a worker, read from the file by offset, give the same result."""
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", 600)
    monkeypatch.setattr("pipebubble.ingest.readers._json_splits", lambda p: True)
    path = write(tmp_path, layout)
    assert_same(normalised(read_file(path, use_cache=False, workers=2), path), reference)


@pytest.mark.parametrize("block", [None, 150, 700])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_trace_cut_off_mid_event_reads_the_same_whole_events(tmp_path, monkeypatch, layout, block):
    """Cut off inside the surrogate event's name: every event before it is read (by hand: the spans of
    every step, the B/E pair and the exact one; the bad one counted), from the partial event's first byte
    on is unread, whatever the layout and the block size."""
    monkeypatch.setattr(jsontrace, "BLOCK_BYTES", block or 16 << 20)
    path = write(tmp_path, layout, cut_at="lone")
    frame, skipped, warnings, processes, threads, unread = outcome(path)
    text = path.read_bytes()
    assert unread == len(text) - text.rindex(b"{")  # the partial event has no nested object before the cut
    assert frame.height == 3 * STEPS + 2 and frame.filter(pl.col("name").str.starts_with("lone")).height == 0
    assert skipped == {"flow": 2 * STEPS, "metadata": 2, "bad_time": 1}
    assert warnings == [f"FILE: trace cut off; read up to its last whole event, {unread} bytes unreadable"]
    assert processes == {"10": "trainer"} and threads == {"10/11": "main"}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_trace_cut_off_in_its_trailer_reads_every_event(tmp_path, reference, layout):
    """Cut off after the events array closed (Kineto writes traceName, displayTimeUnit and more after it),
    at every byte of a trailer full of brackets: every event is read, as from the whole file, and a warning
    says how many bytes after the events were lost. (Such a file was once refused as malformed.)"""
    whole = write(tmp_path, layout).read_bytes()
    close = whole.index(b'"traceName"')
    close = whole.rindex(b"]", 0, close)
    frame, skipped, warnings, processes, threads, unread = reference
    for cut in range(close + 2, len(whole) - 1, 1 if layout == "compact" else 5):  # close + 1: ends with ]
        path = tmp_path / "cut.json"
        path.write_bytes(whole[:cut])
        got = outcome(path)
        lost = (f"FILE: trace cut off after its last event; {cut - close - 1} bytes after the events unreadable"
                " (if they held its baseTimeNanoseconds, times stay on the profiler's own clock)")
        assert_same(got, (frame, skipped, [lost, *warnings], processes, threads, unread))


def test_a_trailer_nested_past_the_decoders_depth_is_read_or_refused_never_a_crash(tmp_path):
    """A value after the events array nested deeper than the decoder goes: whole, it is read; cut off inside
    it, every event is read with a warning; damaged, a one-line error (a mutated trace once crashed here)."""
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 5})
    deep = "[" * 1200 + "]" * 1200
    head = '{"traceEvents": [' + event + "], "
    for text, spans, warned in (
        (head + '"x": ' + deep + "}", 1, False),
        (head + '"x": ' + deep[:1500], 1, True),
    ):
        path = tmp_path / "deep.json"
        path.write_text(text)
        result = chrome.read(path)
        assert result.spans.height == spans and bool(result.warnings) == warned
    path.write_text(head + '"x": ' + deep + ', "y": [1 2]}')
    with pytest.raises(TraceFormatError, match="malformed JSON"):
        chrome.read(path)


def test_cuts_land_between_events_on_one_line(tmp_path):
    """On one line ``},{`` sits between nested objects and inside strings as often as between events: the
    cut is probed, so every block decodes alone (none is read again)."""
    path = write(tmp_path, "compact")
    data = path.read_bytes()
    _, start, end = jsonsplit.split_quick(path, data, 0, len(data))
    region = memoryview(data)[start:end]
    cuts = jsonblocks._cuts(region, 200)
    assert len(cuts) > 50
    for a, b in cuts:
        jsonevents.decode_block(jsonblocks._wrapped(region, a, b))  # raises BlockError when cut inside an event
    assert sum(b - a for a, b in cuts) + len(cuts) - 1 == len(region)  # the cuts cover it, one comma apart


def test_events_array_found_before_metadata_full_of_brackets(tmp_path):
    """A trailer with more brackets than events has (arrays, a string of brackets) does not hide the events
    array's end: it is found without decoding the whole document."""
    for layout in LAYOUTS:
        path = write(tmp_path / layout, layout)
        data = path.read_bytes()
        quick = jsonsplit.split_quick(path, data, 0, len(data))
        assert quick is not None
        _, start, close = quick
        assert data[close : close + 1] == b"]"
        inside = json.loads(b"[" + data[start:close] + b"]")
        assert len(inside) == len(events())


def assert_same(got: tuple, want: tuple) -> None:
    frame, *rest = got
    want_frame, *want_rest = want
    assert frame.equals(want_frame, null_equal=True)
    assert rest == want_rest
