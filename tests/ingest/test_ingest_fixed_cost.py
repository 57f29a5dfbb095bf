"""The fixed cost of reading one small trace file: a job of many small rank files pays it once a file, and
most of it is polars queries (each a plan to optimise and run, a fraction of a millisecond however few its
rows). A small Kineto file's complete events become spans in one plan, its names in one query more, so
reading one takes a handful of queries, not the 30-odd it took when each step ran eagerly."""

from __future__ import annotations

import json
from pathlib import Path

from queries import counting

from pipebubble.ingest import read_file

#: Queries to read one small Kineto file of complete, flow and metadata events: 5 (the block's columns; its
#: spans, events left and skipped counts, one plan of three frames; the process and thread names); 30 before.
LIMIT = 8
#: The same with begin/end pairs as well (their order and bad times one plan of two, their spans another): 9;
#: 49 before.
PAIRED_LIMIT = 12


def kineto(path: Path, pairs: bool = False) -> Path:
    """A small Kineto trace: operators, launches, kernels with their flows, the profiler's own span, and the
    process and thread names; with ``pairs``, begin/end ranges too."""
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": 7, "tid": 7, "ts": 0, "dur": 9_000},
        {"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 8, "args": {"name": "main"}},
        {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}},
    ]
    for i in range(200):
        ts = 10 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 8, "ts": ts, "dur": 4,
             "args": {"External id": i}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 8, "ts": ts + 1,
             "dur": 2, "args": {"External id": i, "correlation": i}},
            {"ph": "s", "id": i, "pid": 7, "tid": 8, "ts": ts + 1, "cat": "ac2g", "name": "ac2g"},
            {"ph": "X", "cat": "kernel", "name": "gemm" if i % 2 else "ncclDevKernel_AllReduce", "pid": 0,
             "tid": 7, "ts": ts + 3, "dur": 5, "args": {"External id": i, "correlation": i}},
            {"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": ts + 3, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        ]
        if pairs:
            events += [{"ph": "B", "name": "step", "pid": 7, "tid": 9, "ts": ts},
                       {"ph": "E", "pid": 7, "tid": 9, "ts": ts + 8}]
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 1_700_000_000_000_000_000,
           "distributedInfo": {"rank": 3, "world_size": 8}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def queries_to_read(path: Path):
    with counting() as count:
        result = read_file(path, use_cache=False)
    return count[0], result


def test_one_small_kineto_file_takes_a_handful_of_queries(tmp_path):
    queries, result = queries_to_read(kineto(tmp_path / "rank3.json"))
    assert queries <= LIMIT, f"{queries} polars queries to read one small file"
    kinds = result.spans["kind"].value_counts().sort("kind")
    assert dict(kinds.iter_rows()) == {"kernel": 100, "comm": 100, "cpu_op": 200, "runtime": 200}
    assert result.skipped == {"profiler_trace": 1, "flow": 400, "metadata": 3}
    assert result.meta["process_names"] == {"7": "python", "0": "GPU 0"}
    assert result.meta["thread_names"] == {"7/8": "main"}
    assert set(result.spans["lane"]) == {"rank3/gpu0", "rank3/pid7/tid8"}


def test_begin_end_pairs_add_a_few_queries_not_one_per_pair(tmp_path):
    queries, result = queries_to_read(kineto(tmp_path / "rank3.json", pairs=True))
    assert queries <= PAIRED_LIMIT, f"{queries} polars queries to read one small file with pairs"
    steps = result.spans.filter(result.spans["name"] == "step")
    assert steps.height == 200 and (steps["end"] - steps["start"] == 8_000).all()
