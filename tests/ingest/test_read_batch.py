"""Reading a batch of small files at once (``ingest.read_files``, what ``run.mapper.map_files`` reads with):
each file's result is exactly what ``read_file`` gives it alone (spans, dtypes and row order, allocator
events, meta, warnings, skipped counts), whatever else is in the batch; cached files come from the cache and
the others are cached as they are read; a file that cannot be read fails the batch with its own one-line
error, after the files before it were read; and the batch's spans are made by a fixed number of queries,
however many files it holds."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import synth
from conftest import ROOT, shared_files
from queries import counting
from test_ingest_fixed_cost import kineto

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import cache, read_file, read_files

REPROS = ROOT.parent / "shared" / "repros"


def assert_same(got, want) -> None:
    """Two results of one file alike in everything a reader gives."""
    assert got.source == want.source
    assert got.spans.schema == want.spans.schema
    assert got.spans.equals(want.spans), got.source
    assert (got.memory is None) == (want.memory is None), got.source
    if want.memory is not None:
        assert got.memory.schema == want.memory.schema and got.memory.equals(want.memory), got.source
    assert (got.events_read, dict(got.skipped), got.warnings, got.format) == (
        want.events_read, dict(want.skipped), want.warnings, want.format)
    assert got.meta == want.meta


def alone(paths: list[Path]) -> list:
    return [read_file(p, k, use_cache=False) for k, p in enumerate(paths)]


def together(paths: list[Path], use_cache: bool = False) -> list:
    return read_files([(str(p), k) for k, p in enumerate(paths)], use_cache)


def check_batch(paths: list[Path]) -> None:
    for got, want in zip(together(paths), alone(paths), strict=True):
        assert_same(got, want)


def readable(paths: list[Path]) -> list[Path]:
    """The files ``read_file`` reads without an error."""
    ok = []
    for path in paths:
        try:
            read_file(path, use_cache=False)
        except TraceFormatError:
            continue
        ok.append(path)
    return ok


def json_repros() -> list[Path]:
    if not REPROS.exists():
        pytest.skip(f"repros not available ({REPROS} is absent)")
    return sorted(p for p in REPROS.iterdir() if p.name.endswith((".json", ".json.gz")))


def test_every_readable_repro_in_one_batch_is_read_as_alone():
    paths = readable(json_repros())
    assert len(paths) > 20
    check_batch(paths)


@pytest.mark.parametrize("name", [p.name for p in (sorted(REPROS.glob("*.json*")) if REPROS.exists() else [])])
def test_a_repro_between_two_good_files_is_read_or_fails_as_alone(tmp_path, name):
    good = [kineto(tmp_path / "rank3.json"), synth_file(tmp_path)]
    paths = [good[0], REPROS / name, good[1]]
    try:
        want = alone(paths)
    except TraceFormatError as exc:
        with pytest.raises(TraceFormatError) as got:
            together(paths)
        assert str(got.value) == str(exc)
        return
    for got, expected in zip(together(paths), want, strict=True):
        assert_same(got, expected)


def synth_file(tmp_path: Path) -> Path:
    folder = synth.write_pipeline(tmp_path / "job", synth.simulate("1f1b", 2, 4, [100_000] * 2, [200_000] * 2))
    return sorted(folder.glob("*.json"))[0]


def test_the_shared_chrome_traces_in_one_batch_are_read_as_alone():
    paths = [*shared_files("kineto", "*.json.gz"), *shared_files("pipeline_cpu", "*/*.json.gz"),
             *shared_files("inference", "*.json.gz")]
    if not paths:
        pytest.skip("real traces not available")
    check_batch(paths)


def test_a_synthetic_pipeline_folder_is_read_as_alone(tmp_path):
    sim = synth.simulate("1f1b", 8, 8, [100_000 + 1_000 * s for s in range(8)], [200_000] * 8)
    folder = synth.write_pipeline(tmp_path / "job", sim, context=True, kernels=2)
    check_batch(sorted(folder.glob("*.json")))


def memory_trace(path: Path, rank: int) -> Path:
    """A Kineto file with allocator events (on a GPU and the host; one without bytes) and complete events."""
    events = [{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 10 * i, "dur": 5}
              for i in range(50)]
    events += [{"ph": "i", "name": "[memory]", "pid": 7, "tid": 8, "ts": 10 * i + 1, "s": "t",
                "args": {"Bytes": 512 if i % 3 else -256, "Total Allocated": 4096 + i, "Total Reserved": 8192,
                         "Device Type": 1 if i % 2 else 0, "Device Id": 0 if i % 2 else -1}}
               for i in range(20)]
    events.append({"ph": "i", "name": "[memory]", "pid": 7, "tid": 8, "ts": 5, "args": {"Device Id": 0}})
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1_000 * rank,
           "distributedInfo": {"rank": rank, "world_size": 4}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def test_files_of_every_shape_mixed_in_one_batch_are_read_as_alone(tmp_path):
    cut = tmp_path / "rank5.json"
    text = kineto(tmp_path / "whole.json").read_text()
    cut.write_text(text[: len(text) * 2 // 3])
    zipped = tmp_path / "rank6.json.gz"
    zipped.write_bytes(gzip.compress(kineto(tmp_path / "z.json", pairs=True).read_bytes()))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([{"ph": "X", "name": "a", "pid": "main", "tid": 1, "ts": 1, "dur": 2}]))
    paths = [kineto(tmp_path / "rank3.json"), memory_trace(tmp_path / "rank1.json", 1), cut,
             kineto(tmp_path / "rank4.json", pairs=True), zipped, bare, memory_trace(tmp_path / "rank2.json", 2),
             synth_file(tmp_path)]
    check_batch(paths)
    check_batch(paths[::-1])
    assert "cut off" in together([cut])[0].warnings[-1]


def test_a_batch_of_one_and_of_none():
    assert read_files([]) == []


def test_cached_files_come_from_the_cache_and_the_others_are_cached(tmp_path):
    folder = synth.write_pipeline(tmp_path / "job", synth.simulate("1f1b", 6, 4, [100_000] * 6, [200_000] * 6))
    paths = sorted(folder.glob("*.json"))
    for k in (1, 4):  # a hit among misses
        read_file(paths[k], k)
    assert [cache.get(p) is not None for p in paths] == [k in (1, 4) for k in range(len(paths))]
    first = together(paths, use_cache=True)
    assert all(cache.get(p) is not None for p in paths)
    again = together(paths, use_cache=True)
    for got, hit, want in zip(first, again, alone(paths), strict=True):
        assert_same(got, want)
        assert_same(hit, want)


def test_a_bad_file_fails_the_batch_as_alone_after_the_files_before_it(tmp_path):
    good = sorted(synth.write_pipeline(
        tmp_path / "job", synth.simulate("1f1b", 3, 2, [100_000] * 3, [200_000] * 3)).glob("*.json"))
    bad = tmp_path / "rank9.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "name": }]}')
    with pytest.raises(TraceFormatError) as want:
        read_file(bad, use_cache=False)
    with pytest.raises(TraceFormatError) as got:
        read_files([(str(good[0]), 0), (str(bad), 1), (str(good[1]), 2)], use_cache=True)
    assert str(got.value) == str(want.value)
    assert str(bad) in str(got.value) and "\n" not in str(got.value)
    assert cache.get(good[0]) is not None and cache.get(good[1]) is None


def test_a_file_of_another_format_in_the_batch_is_read_alone(tmp_path):
    otlp = tmp_path / "requests.json"
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "llm_request", "startTimeUnixNano": "1000",
            "endTimeUnixNano": "5000", "attributes": []}
    otlp.write_text(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}))
    paths = [kineto(tmp_path / "rank3.json"), otlp, synth_file(tmp_path)]
    check_batch(paths)


def test_a_batch_takes_the_same_queries_however_many_files(tmp_path):
    sim = synth.simulate("1f1b", 16, 4, [100_000] * 16, [200_000] * 16)
    paths = sorted(synth.write_pipeline(tmp_path / "job", sim).glob("*.json"))
    counts = []
    for n in (2, 16):
        with counting() as count:
            together(paths[:n])
        counts.append(count[0])
    # the events put together; their spans and skipped counts; their operator ids (a sampled trace is said)
    assert counts[0] == counts[1] <= 4, counts
