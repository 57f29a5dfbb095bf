"""Request spans from OTLP JSON (an OpenTelemetry Collector's file exporter) and Jaeger JSON into the request
table: vLLM's ``llm_request`` attributes, the format told by content, the cache, and bad input as a clear
message or counted skips."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest
from otlp_shapes import export_line, otlp_span, vllm_request, write_vllm

from pipebubble import requests_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import jaeger, otlp, read_file, readers


def test_vllm_otlp_lines_become_requests(tmp_path):
    path = tmp_path / "traces.json"
    written = write_vllm(path)
    assert readers.reader_for(path).name == "otlp"
    result = read_file(path, use_cache=False)
    table = result.requests
    assert dict(table.schema) == requests_table.SCHEMA and table.height == 300 and result.spans.is_empty()
    assert result.format == "otlp" and result.events_read == 306
    assert result.skipped == {"not_a_request": 6} and result.warnings == []
    first = table.row(7, named=True)
    r = written[7]
    assert first["request_id"] == "cmpl-7" and first["arrival"] == r["arrival"]
    assert first["queue_ns"] == r["queue"] and first["ttft_ns"] == r["ttft"] and first["e2e_ns"] == r["e2e"]
    assert first["first_token"] == r["arrival"] + r["ttft"] and first["completion"] == r["arrival"] + r["e2e"]
    assert first["scheduled"] == r["arrival"] + r["ttft"] - r["prefill"]
    assert (first["prompt_tokens"], first["completion_tokens"]) == (r["prompt"], r["tokens"])


def test_one_object_and_gzip(tmp_path):
    plain = tmp_path / "one.json"
    plain.write_text(json.dumps(json.loads(export_line([otlp_span(vllm_request(i)) for i in range(3)])), indent=2))
    packed = tmp_path / "one.json.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    for path in (plain, packed):
        assert readers.reader_for(path).name == "otlp"
        assert read_file(path, use_cache=False).requests["request_id"].to_list() == ["cmpl-0", "cmpl-1", "cmpl-2"]


def test_requests_come_back_from_the_cache(tmp_path):
    path = tmp_path / "traces.json"
    write_vllm(path, n=20)
    fresh = read_file(path)
    cached = read_file(path)
    assert cached.requests.equals(fresh.requests) and cached.skipped == fresh.skipped


def test_span_without_the_name_but_with_latencies_is_a_request(tmp_path):
    span = otlp_span(vllm_request(1)) | {"name": "generate"}
    path = tmp_path / "t.json"
    path.write_text(export_line([span]) + "\n")
    assert read_file(path, use_cache=False).requests.height == 1


def jaeger_span(r: dict, i: int) -> dict:
    tags = [{"key": "gen_ai.request.id", "type": "string", "value": r["id"]},
            {"key": "gen_ai.latency.time_to_first_token", "type": "float64", "value": r["ttft"] / 1e9},
            {"key": "gen_ai.latency.time_in_queue", "type": "float64", "value": r["queue"] / 1e9},
            {"key": "gen_ai.usage.completion_tokens", "type": "int64", "value": r["tokens"]},
            {"key": "span.kind", "type": "string", "value": "server"}]
    return {"traceID": f"{i:032x}", "spanID": f"{i:016x}", "flags": 1, "operationName": "llm_request",
            "references": [], "startTime": r["arrival"] // 1000, "duration": r["e2e"] // 1000, "tags": tags,
            "logs": [], "processID": "p1", "warnings": None}


def test_jaeger_json(tmp_path):
    requests = [vllm_request(i) for i in range(4)]
    traces = [{"traceID": f"{i:032x}", "spans": [jaeger_span(r, i)], "processes": {"p1": {"serviceName": "vllm"}},
               "warnings": None} for i, r in enumerate(requests)]
    traces[0]["spans"].append({**jaeger_span(requests[0], 99), "operationName": "HTTP GET", "tags": []})
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps({"data": traces, "total": 0, "limit": 0, "offset": 0, "errors": None}))
    assert readers.reader_for(path).name == "jaeger"
    result = read_file(path, use_cache=False)
    assert result.format == "jaeger" and result.skipped == {"not_a_request": 1}
    row = result.requests.row(2, named=True)
    r = requests[2]
    assert row["arrival"] == r["arrival"] and row["e2e_ns"] == r["e2e"]  # µs times: whole µs here
    assert row["ttft_ns"] == r["ttft"] and row["completion_tokens"] == r["tokens"] and row["prefill_ns"] is None


def test_kineto_json_is_not_claimed(tmp_path):
    path = tmp_path / "kineto.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [{"ph": "X", "name": "traceID", "ts": 1}]}))
    assert readers.reader_for(path).name == "json"


# --- bad input ---


def _write(tmp_path, text, name="t.json"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_wrong_types_are_counted_and_left_null(tmp_path):
    span = otlp_span(vllm_request(3))
    values = {"gen_ai.latency.e2e": {"doubleValue": "abc"}, "gen_ai.usage.completion_tokens": {"intValue": "x"},
              "gen_ai.latency.time_to_first_token": {"stringValue": "0.5"},
              "gen_ai.latency.time_in_queue": {"doubleValue": -1.0}}
    span["attributes"] = [a | {"value": values.get(a["key"], a["value"])} for a in span["attributes"]]
    span["endTimeUnixNano"] = "soon"
    result = read_file(_write(tmp_path, export_line([span])), use_cache=False)
    row = result.requests.row(0, named=True)
    assert result.skipped["bad_value"] == 5
    assert row["ttft_ns"] is None and row["queue_ns"] is None and row["completion_tokens"] is None
    assert row["e2e_ns"] is None and row["completion"] is None and row["arrival"] is not None
    assert any("wrong type or out of range" in w and "5 value(s)" in w for w in result.warnings)


def test_missing_times(tmp_path):
    bare = {"traceId": "1", "spanId": "1", "name": "llm_request", "attributes": []}
    no_start = otlp_span(vllm_request(5))
    del no_start["startTimeUnixNano"]
    result = read_file(_write(tmp_path, export_line([bare, no_start])), use_cache=False)
    assert result.skipped["request_without_times"] == 1
    row = result.requests.row(0, named=True)
    assert row["arrival"] is None and row["ttft_ns"] == vllm_request(5)["ttft"]


def test_cut_off_last_line(tmp_path):
    lines = [export_line([otlp_span(vllm_request(i))]) for i in range(3)]
    path = _write(tmp_path, "\n".join(lines) + "\n" + lines[0][:70])
    result = read_file(path, use_cache=False)
    assert result.requests.height == 3 and result.skipped["cut_off_line"] == 1
    assert any("cut off" in w and str(path) in w for w in result.warnings)


def test_duplicates_and_garbage_lines_are_counted(tmp_path):
    line = export_line([otlp_span(vllm_request(1))])
    result = read_file(_write(tmp_path, f"{line}\nnot json\n{line}\n[1, 2]\n"), use_cache=False)
    assert result.requests.height == 1
    assert result.skipped == {"not_a_request": 2, "duplicate_span": 1, "unreadable_line": 1, "malformed_line": 1}
    assert any("line 4: Expected `object`, got `array`" in w for w in result.warnings)


def test_malformed_shapes(tmp_path):
    bad = {"resourceSpans": [{"scopeSpans": "nope"}]}
    good = {"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "llm_request", "startTimeUnixNano": "12",
            "attributes": [{"key": "gen_ai.latency.e2e", "value": {"doubleValue": [1]}}]}]}]}]}
    result = otlp.read(_write(tmp_path, f"{json.dumps(bad)}\n{json.dumps(good)}\n"))
    assert result.skipped == {"malformed_line": 1, "bad_value": 1}
    assert result.requests.height == 1 and result.requests["arrival"].to_list() == [12]
    assert any("$.resourceSpans[0].scopeSpans" in w for w in result.warnings)
    with pytest.raises(TraceFormatError, match=r"not OTLP JSON .*\$\.resourceSpans\[0\]\.scopeSpans"):
        otlp.read(_write(tmp_path, json.dumps(bad)))


@pytest.mark.parametrize("text, reason", [("", "empty file"), ("   \n", "empty file"),
                                          ('{"resourceSpans": [', "not JSON"), ("hello", "not JSON")])
def test_unreadable_files_name_the_file(tmp_path, text, reason):
    path = _write(tmp_path, text)
    for reader in (otlp.read, jaeger.read):
        with pytest.raises(TraceFormatError) as err:
            reader(path)
        assert str(err.value).startswith(f"{path}: {reason}") and "\n" not in str(err.value)


def test_spans_but_no_requests_is_a_warning(tmp_path):
    result = read_file(_write(tmp_path, export_line([])), use_cache=False)
    assert result.requests.is_empty() and result.skipped == {"not_a_request": 1}
    assert any("no request spans" in w for w in result.warnings)


def test_out_of_range_times(tmp_path):
    span = otlp_span(vllm_request(2)) | {"startTimeUnixNano": str(2**63), "endTimeUnixNano": "-1"}
    result = read_file(_write(tmp_path, export_line([span])), use_cache=False)
    row = result.requests.row(0, named=True)
    assert result.skipped["bad_value"] == 1 and row["arrival"] is None  # the end alone is kept: no start to order it by
    assert result.requests.select(pl.col("e2e_ns")).item() == vllm_request(2)["e2e"]
