"""Allocator events of Chrome/Kineto JSON (torch.profiler's ``[memory]`` instants) into their own table:
counted, range-checked, the same on the typed and the tolerant decode paths and in every layout."""

from __future__ import annotations

import json

import polars as pl
import pytest

from pipebubble import allocations
from pipebubble.ingest import read_file


def memory_event(ts, nbytes, total, device=-1, dtype=0, reserved=0, **extra):
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 7, "tid": 7, "ts": ts,
            "args": {"Total Reserved": reserved, "Total Allocated": total, "Bytes": nbytes, "Device Id": device,
                     "Device Type": dtype, "Addr": 94231351678976, **extra}}


EVENTS = [
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1.0, "dur": 10.0},
    memory_event(2.0, 4096, 4096),
    memory_event(3.0, 1 << 20, 1 << 20, device=0, dtype=1, reserved=2 << 20),
    memory_event(4.0, -4096, 0),
    {"ph": "i", "name": "some instant", "pid": 7, "tid": 7, "ts": 5.0},
    memory_event(6.0, -(1 << 20), 0, device=0, dtype=1, reserved=2 << 20),
]


def write(tmp_path, events, name="trace.json", compact=False, header=None):
    path = tmp_path / name
    body = {"schemaVersion": 1, **(header or {}), "traceEvents": events}
    path.write_text(json.dumps(body, separators=(",", ":")) if compact else json.dumps(body, indent=1))
    return path


@pytest.mark.parametrize("compact", [False, True])
def test_memory_events_read(tmp_path, compact):
    r = read_file(write(tmp_path, EVENTS, compact=compact), use_cache=False)
    assert r.events_read == 6 and r.skipped == {"instant": 1} and r.spans.height == 1
    m = r.memory
    assert dict(m.schema) == allocations.SCHEMA
    cpu = m.filter(pl.col("lane") == "rank0/cpu")
    gpu = m.filter(pl.col("lane") == "rank0/gpu0")
    assert cpu.select("ts", "bytes", "allocated").rows() == [(2000, 4096, 4096), (4000, -4096, 0)]
    assert gpu.select("ts", "bytes", "allocated", "reserved").rows() == [
        (3000, 1 << 20, 1 << 20, 2 << 20), (6000, -(1 << 20), 0, 2 << 20)]
    assert cpu["device"].to_list() == [None, None] and gpu["device"].to_list() == [0, 0]
    assert set(m["baseline"]) == {"allocator"} and set(m["device_type"]) == {"cpu", "cuda"}


def test_no_memory_events_no_table(tmp_path):
    r = read_file(write(tmp_path, EVENTS[:1]), use_cache=False)
    assert r.memory is None


def test_tolerant_path_same_table(tmp_path):
    """A block the typed decoder rejects (a name that is a number) reads its allocator events the same."""
    odd = {"ph": "X", "cat": "cpu_op", "name": 12, "pid": 7, "tid": 7, "ts": 0.5, "dur": 1.0}
    fast = read_file(write(tmp_path, EVENTS, "a.json"), use_cache=False)
    slow = read_file(write(tmp_path, [odd, *EVENTS], "b.json"), use_cache=False)
    assert slow.skipped == fast.skipped and slow.events_read == fast.events_read + 1
    assert slow.memory.drop("source").equals(fast.memory.drop("source"))


def test_bad_values_counted(tmp_path):
    events = [
        *EVENTS[:2],
        memory_event(3.0, None, 10),  # no bytes
        memory_event(3.5, 10, 10, device=2**31, dtype=1),  # no Int32 device
        memory_event(None, 10, 10),  # no time
        memory_event(4.0, 2**64 - 1, 10),  # bytes beyond int64
        {"ph": "i", "name": "[memory]", "pid": 7, "tid": 7, "ts": 5.0, "args": {"Bytes": "12"}},  # tolerant path
    ]
    r = read_file(write(tmp_path, events), use_cache=False)
    assert r.memory.height == 1
    assert r.skipped == {"memory_bad_value": 3, "device_out_of_range": 1, "bad_time": 1}
    assert r.events_read == 7


def test_old_traces_without_totals(tmp_path):
    """No ``Total Allocated`` (older torch): running sums since the trace began, said so."""
    events = [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": t, "args": {"Bytes": b, "Device Id": 0}}
              for t, b in [(1.0, 100), (2.0, 50), (3.0, -100)]]
    m = read_file(write(tmp_path, events), use_cache=False).memory
    assert m["allocated"].to_list() == [100, 150, 50] and set(m["baseline"]) == {"trace"}
    assert set(m["lane"]) == {"rank0/gpu0"}


def test_rank_and_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path / "cache"))
    path = write(tmp_path, EVENTS, header={"distributedInfo": {"rank": 3, "world_size": 4},
                                           "deviceProperties": [{"id": 0, "totalGlobalMem": 85899345920}]})
    first = read_file(path)
    again = read_file(path)
    assert set(first.memory["lane"]) == {"rank3/cpu", "rank3/gpu0"}
    assert again.memory.equals(first.memory)
    assert {int(k): v for k, v in again.meta["gpu_memory_bytes"].items()} == {0: 85899345920}


def test_cut_off_trace_keeps_memory_before_the_cut(tmp_path):
    path = write(tmp_path, EVENTS)
    text = path.read_text()
    cut = text.rindex('"Device Type"')  # inside the last event
    path.write_text(text[:cut])
    r = read_file(path, use_cache=False)
    assert r.memory.height == 3 and any("cut off" in w for w in r.warnings)
