"""The minimal JSON/gzip repros beside the project: each gives exact spans and counts, or a one-line
TraceFormatError naming the file. Small inline inputs cover what the mutation fuzzer found."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT

from pipebubble import spans as span_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import read_one
from pipebubble.ingest.json import chrome
from pipebubble.ingest.json import trace as jsontrace

REPROS = ROOT.parent / "shared" / "repros"


def repro(name: str) -> Path:
    path = REPROS / name
    if not path.exists():
        pytest.skip(f"repros not available ({path} is absent)")
    return path


#: file -> (span count, skipped counts, substrings every warning list must contain, in order)
READS = {
    "01_kernel_pid_2pow31.json": (0, {"device_out_of_range": 1}, []),
    "02_chrome_kernel_string_pid.json": (0, {"device_out_of_range": 1}, []),
    "03_ts_1e16.json": (0, {"out_of_range": 1}, []),
    "03b_ts_1e19.json": (0, {"out_of_range": 1}, []),
    "04_dur_1e16.json": (0, {"out_of_range": 1}, []),
    "05_deep_args_1000.json": (1, {}, ["nested too deep"]),
    "05b_deep_args_list_1000.json": (1, {}, ["nested too deep"]),
    "06_invalid_utf8_name.json": (1, {}, ["1 invalid UTF-8"]),
    "07_invalid_utf8_name_cut.json": (1, {}, ["1 invalid UTF-8", "cut off"]),
    "08_pg_config_bigint.json": (1, {}, ["pg_config changed to be storable"]),
    "10_BE_null_ts.json": (1, {"bad_time": 1, "unmatched_end": 1}, []),
    "12_end_overflow.json": (0, {"out_of_range": 2}, []),
    "13_pid_2pow63.json": (0, {"id_out_of_range": 1}, []),
    "13b_pid_digit_string_huge.json": (0, {"id_out_of_range": 1}, []),
    "14_exact_ts_misaligned.json": (2, {"metadata": 1}, []),
    "14b_exact_ts_BE_first.json": (3, {}, []),
    "16_window_overflow.json": (0, {"out_of_range": 2}, []),
    "17_pipeline_max_empty.json": (2, {}, []),
    "17b_two_gpus_zero_length_kernels.json": (2, {}, []),
    "18_pipeline_zero_division.json": (2, {}, []),
    "19_spilled_trace_without_spans.json": (0, {"counter": 1}, []),
    "21_nested_list_name_depth300.json": (1, {"metadata": 4}, []),
    "21_nested_list_name_depth600.json": (1, {"metadata": 4}, []),
    "rank3000000000.json": (1, {}, ["rank in the file name does not fit Int32"]),
    "G1_gzip_trailing_zero_padding.json.gz": (100, {}, []),
    "G2_gzip_second_member_cut.json.gz": (55, {}, ["gzip stream cut off after 4822 bytes", "cut off"]),
    "15_toy_train_original.json": (714, {"metadata": 8, "flow": 40, "instant": 2, "profiler_trace": 1}, []),
    "15_toy_train_uptime_110d.json": (714, {"metadata": 8, "flow": 40, "instant": 2, "profiler_trace": 1}, []),
}
ERRORS = {
    "09_rank_2pow31.json": "distributedInfo.rank is out of range",
    "11_base_time_huge.json": "baseTimeNanoseconds is out of range",
    "20_midfile_damage_read_as_cutoff.json": "malformed JSON at byte 9825",
}


@pytest.mark.parametrize("name", sorted(READS))
def test_repro_reads(name):
    count, skipped, warned = READS[name]
    result = read_one(repro(name))
    assert span_table.validate(result.spans) == []
    assert result.spans.height == count and dict(result.skipped) == skipped
    assert len(result.warnings) == len(warned)
    assert all(w in line and name in line for w, line in zip(warned, result.warnings, strict=True))


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_repro_is_a_format_error(name):
    with pytest.raises(TraceFormatError) as caught:
        read_one(repro(name))
    assert name in str(caught.value) and ERRORS[name] in str(caught.value) and "\n" not in str(caught.value)


def test_exact_timestamps_land_on_their_own_events():
    rows = read_one(repro("14b_exact_ts_BE_first.json")).spans.rows(named=True)
    by_name = {r["name"]: (r["start"], r["end"]) for r in rows}
    assert by_name == {
        "first": (1712195495519695812, 1712195495519697312),
        "second": (1712195495519800250, 1712195495519802250),
        "outer": (1712195495519000500, 1712195495529000500),
    }
    by_name = {r["name"]: r["start"] for r in read_one(repro("14_exact_ts_misaligned.json")).spans.rows(named=True)}
    assert by_name == {"first": 1712195495519695812, "second": 1712195495519800250}


def test_shifted_trace_matches_the_original_exactly():
    """The same trace with timestamps 4.5e15 ns later (>102 days of uptime): identical after the shift."""
    original = read_one(repro("15_toy_train_original.json")).spans.drop("source")
    shifted = read_one(repro("15_toy_train_uptime_110d.json")).spans.drop("source")
    shift = 4_500_000_000_000_000
    back = shifted.with_columns(start=pl.col("start") - shift, end=pl.col("end") - shift)
    assert back.equals(original)


@pytest.mark.parametrize("name", ["G1_gzip_trailing_zero_padding.json.gz", "G2_gzip_second_member_cut.json.gz"])
def test_gzip_repros_read_the_same_in_memory_and_streamed(tmp_path, monkeypatch, name):
    path = repro(name)
    memory = chrome.read(path, 0, None, tmp_path / "scratch")
    monkeypatch.setattr(jsontrace, "GUNZIP_TO_DISK", 0)
    streamed = chrome.read(path, 0, None, tmp_path / "scratch")
    assert streamed.spans.equals(memory.spans) and streamed.warnings == memory.warnings
    assert dict(streamed.skipped) == dict(memory.skipped)


def test_midfile_damage_is_an_error_whatever_the_block_size(monkeypatch):
    path = repro("20_midfile_damage_read_as_cutoff.json")
    for size in (16 << 20, 4096, 64):
        monkeypatch.setattr(jsontrace, "BLOCK_BYTES", size)
        with pytest.raises(TraceFormatError, match="malformed JSON at byte 9825"):
            chrome.read(path)


def pipeline(path: Path):
    """The whole report for one file, uncached, through the one way in."""
    from pipebubble.options import Options, Scale
    from pipebubble.run import run

    return run([path], Options(), Scale(use_cache=False))


@pytest.mark.parametrize(
    "name", ["06_invalid_utf8_name.json", "08_pg_config_bigint.json", "15_toy_train_uptime_110d.json"]
)
def test_repros_through_the_whole_pipeline(name):
    report = pipeline(repro(name))
    assert report.lanes and all(lane.idle_ns >= 0 and lane.window_ns >= 0 for lane in report.lanes)


def test_window_overflow_repro_is_skipped_cleanly():
    with pytest.raises(TraceFormatError, match="no event became a span .*out_of_range 2"):
        pipeline(repro("16_window_overflow.json"))


def test_widest_window_within_the_limit_gives_correct_idle(tmp_path):
    """Spans at -4.6e18 and +4.6e18 ns: the window (9.2e18 ns) still fits int64, idle is exact."""
    path = tmp_path / "wide.json"
    path.write_text(json.dumps([x(ts=-4.6e15), x(ts=4.6e15)]))
    report = pipeline(path)
    (lane,) = report.lanes
    assert lane.window_ns == 9_200_000_000_000_001_000 and lane.idle_ns == lane.window_ns - 2000


# Found by tests/fuzz/test_fuzz_json.py and the checks above, as small inline inputs.


def read_bytes(tmp_path, content: bytes, name: str = "t.json"):
    path = tmp_path / name
    path.write_bytes(content)
    return chrome.read(path)


def x(**fields) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1} | fields


@pytest.mark.parametrize(
    "event, reason",
    [
        (x(ts=1e400), "out_of_range"),
        (x(dur=-1e400), "out_of_range"),
        (x(ts=10**400), "out_of_range"),
        (x(pid=-(2**63) - 1), "id_out_of_range"),
        (x(tid="-99999999999999999999"), "id_out_of_range"),
        (x(pid=int("1" * 400)), "id_out_of_range"),
        ({"ph": "B", "pid": 10**30, "tid": 1, "ts": 1}, "id_out_of_range"),
        (x(ts=4.6e15, dur=1e15), "out_of_range"),
        (x(ts="12"), "bad_time"),
        (x(ts=True), "bad_time"),
        (x(dur=-1), "bad_time"),
        ({"ph": "B", "pid": 1, "tid": 1, "ts": "zero"}, "bad_time"),
        ({"ph": "B", "pid": 1, "tid": 1, "ts": 1e17}, "out_of_range"),
        (5, "not_an_event"),
        ({"ph": ["X"] * 3}, "phase '<array>'"),
    ],
)
def test_bad_values_are_counted(tmp_path, event, reason):
    text = json.dumps([event, x()]).replace("Infinity", "1e400").encode()
    result = read_bytes(tmp_path, text)
    assert result.spans.height == 1 and dict(result.skipped) == {reason: 1}


def test_lone_surrogate_escapes_are_replaced(tmp_path):
    text = rb'[{"ph": "X", "name": "a\ud800b", "pid": 1, "tid": 1, "ts": 1, "dur": 1}]'
    result = read_bytes(tmp_path, text)
    assert result.spans["name"].to_list() == ["a\ufffdb"] and "1 invalid UTF-8" in result.warnings[0]


def test_huge_numbers_in_names_args_and_ids_do_not_crash(tmp_path):
    big = "9" * 5000
    text = (
        f'[{{"ph": "b", "id": {big}, "cat": {big}, "name": "n", "pid": 1, "tid": 1, "ts": 1, '
        f'"args": {{"External id": {big}}}}}, {{"ph": "X", "name": {big}, "pid": 1, "tid": 1, "ts": 1, "dur": 1}}]'
    )
    result = read_bytes(tmp_path, text.encode())
    assert result.spans.height == 1 and result.spans["name"].to_list() == [None]
    assert dict(result.skipped) == {"unmatched_async_begin": 1}


@pytest.mark.parametrize("depth", [900, 5000])
def test_deep_names_and_values_take_bounded_time(tmp_path, depth):
    import time

    deep = "[" * depth + "]" * depth
    text = f'[{{"ph": "X", "name": {deep}, "cat": {deep}, "pid": {deep}, "tid": 1, "ts": 1, "dur": 1, "args": {deep}}},'
    text += f' {{"ph": {deep}}}, {{"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {{"name": {deep}}}}}]'
    started = time.perf_counter()
    result = read_bytes(tmp_path, text.encode())
    assert time.perf_counter() - started < 3
    assert result.spans.height == 1 and result.spans["name"].to_list() == [None]
    assert dict(result.skipped) == {"phase '<array>'": 1, "metadata": 1}


def test_deep_header_values_are_bounded(tmp_path):
    deep = "[" * 3000 + "1" + "]" * 3000
    doc = f'{{"distributedInfo": {{"rank": 1, "pg_config": {deep}}}, "traceEvents": [{json.dumps(x())}]}}'
    result = read_bytes(tmp_path, doc.encode())
    assert result.spans["rank"].to_list() == [1] and "pg_config" in result.warnings[0]


def test_cut_off_file_damaged_before_its_end_is_an_error(tmp_path):
    events = ",".join(json.dumps(x(ts=i)) for i in range(50))
    text = ("[" + events).encode()
    damaged = text[:200] + b",," + text[200:-20]
    with pytest.raises(TraceFormatError, match="malformed JSON at byte"):
        read_bytes(tmp_path, damaged)
    result = read_bytes(tmp_path, text[:-20])
    assert result.spans.height == 49 and "cut off" in result.warnings[0]


def test_zero_padded_gzip_member_then_another_member(tmp_path):
    one, two = json.dumps([x(name="one")]).encode(), json.dumps(x(name="two")).encode()
    text = gzip.compress(one[:-1] + b",") + b"\0" * 64 + gzip.compress(two + b"]") + b"\0" * 1000
    result = read_bytes(tmp_path, text, "t.json.gz")
    assert result.spans["name"].to_list() == ["one", "two"] and result.warnings == []


def test_invalid_utf8_inside_a_header_value(tmp_path):
    head = b'{"distributedInfo": {"rank": 2, "backend": "nc\xffcl"}, "traceEvents": ['
    text = head + json.dumps(x()).encode() + b"]}"
    result = read_bytes(tmp_path, text)
    assert result.spans["rank"].to_list() == [2] and result.meta["backend"] == "nc\ufffdcl"
    assert "distributedInfo: 1 invalid UTF-8" in result.warnings[0]


def test_cut_off_file_damaged_early_gives_one_outcome_whatever_the_block_size(tmp_path, monkeypatch):
    """Damage early in a cut-off file (found by the fuzzer: the prefix search looked only near the end, so
    the outcome depended on where blocks began): the same result, or the same error, for every block size."""
    events = [x(ts=i, name=f"e{i}") for i in range(80)]
    text = json.dumps(events).encode()
    pos = text.index(b'"e5"')
    for damage in (b'"', b'\\u', b"{"):
        damaged = (text[:pos] + damage + text[pos:])[:-30]
        outcomes = set()
        for size in (16 << 20, 64, 200, 1000):
            monkeypatch.setattr(jsontrace, "BLOCK_BYTES", size)
            try:
                result = read_bytes(tmp_path, damaged)
                outcomes.add((tuple(result.spans["name"].to_list()), result.meta["unread_bytes"]))
            except TraceFormatError as exc:
                outcomes.add(str(exc))
        assert len(outcomes) == 1, damage


@pytest.mark.parametrize("base, shift, warned", [("1000.0", 1000, False), ("1000.5", 0, True), ('"x"', 0, True)])
def test_base_time_that_is_not_an_int_is_used_whole_or_ignored_with_a_warning(tmp_path, base, shift, warned):
    path = tmp_path / "t.json"
    event = '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2}'
    path.write_text(f'{{"baseTimeNanoseconds": {base}, "traceEvents": [{event}]}}')
    result = chrome.read(path)
    assert result.spans["start"].to_list() == [1000 + shift]
    assert any("baseTimeNanoseconds ignored" in w for w in result.warnings) == warned
