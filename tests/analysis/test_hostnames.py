"""The host summary counts what a user counts: an operator's NVTX ranges as one name whatever call details
PyTorch wrote after it, and each synchronize once (its call, not also Nsight's CUPTI record of it); on names,
a small Kineto trace and the real Nsight export of a torchrun job."""

from __future__ import annotations

import json
import re
import sqlite3

import polars as pl
from conftest import shared
from synth import _x

from pipebubble.analysis.hostnames import per_range, range_name, sync_record
from pipebubble.options import Options, Scale
from pipebubble.run import run

US = 1_000
#: What PyTorch appends to an operator's name in an NVTX range (``getNvtxStr``), as the export holds it.
DETAILS = re.compile(r", (seq|op_id|sizes|input_op_ids) = ")


def analyse(*paths):
    return run(list(paths), Options(), Scale(use_cache=False, workers=1))


def test_call_details_are_dropped_from_range_names():
    names = {
        "aten::to, seq = 12, op_id = 999599": "aten::to",
        "aten::to, op_id = 2": "aten::to",
        "aten::add, seq = -1": "aten::add",
        "aten::mm, seq = 3, op_id = 4, sizes = [[2, 3], [3, 4]], input_op_ids = [(1, 0), (2, 0)]": "aten::mm",
        "x, sizes = [[1]]": "x",
        "FSDP::pre_forward (blocks.3._checkpoint_wrapped_module), op_id = 5":
            "FSDP::pre_forward (blocks.3._checkpoint_wrapped_module)",
        "ProfilerStep#3": "ProfilerStep#3",
        "forward, backward": "forward, backward",
        "my_range, seq = start": "my_range, seq = start",
    }
    got = pl.DataFrame({"name": list(names)}).select(range_name(pl.col("name")))["name"].to_list()
    assert got == list(names.values())


def test_ranges_of_one_operator_are_summed():
    calls = pl.LazyFrame({"name": ["aten::to, op_id = 1", "aten::to, seq = 4, op_id = 2", "aten::mm"],
                          "count": [1, 2, 5], "total": [10, 30, 7], "max": [10, 20, 2]})
    got = per_range(calls).collect().sort("name").rows()
    assert got == [("aten::mm", 5, 7, 2), ("aten::to", 3, 40, 20)]


def test_sync_records_are_not_calls():
    spans = pl.DataFrame({
        "kind": ["sync", "sync", "sync", "sync", "sync", "runtime", "sync"],
        "name": ["Stream sync", "Stream Sync", "Stream wait sync", "Stream Wait Event", "Context sync",
                 "cudaStreamSynchronize", "cudaStreamSynchronize"],
    })
    assert spans.select(sync_record())["kind"].to_list() == [True] * 5 + [False, False]


def test_a_kineto_synchronize_stays_a_runtime_call(tmp_path):
    """Kineto names a synchronize by its call (kind ``sync``): it is listed once, as the call."""
    events = [_x("cuda_runtime", "cudaLaunchKernel", 1, 1, 1_000 * US, 5 * US, 1),
              _x("kernel", "gemm", 0, 7, 1_010 * US, 100 * US, 1),
              _x("cuda_runtime", "cudaStreamSynchronize", 1, 1, 1_006 * US, 110 * US),
              _x("user_annotation", "aten::to, op_id = 7", 1, 1, 1_000 * US, 120 * US),
              _x("user_annotation", "aten::to, op_id = 8", 1, 1, 1_200 * US, 10 * US)]
    path = tmp_path / "sync.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    host = analyse(path).host
    assert [(c.name, c.count) for c in host.api if "ynchron" in c.name] == [("cudaStreamSynchronize", 1)]
    assert [(c.name, c.count, c.total_ns) for c in host.ranges] == [("aten::to", 2, 130 * US)]


def test_nsys_export_counts_each_operator_and_each_wait_once():
    """The torchrun export's 19,118 NVTX ranges carry 18,499 distinct names (``aten::to, seq = N, op_id =
    N``): the host ranges are its operators, each counted as the export holds it; its 33
    ``cudaStreamSynchronize`` calls, each with a CUPTI "Stream sync" record of the same wait, are listed once."""
    path = shared("nsys", "torchrun_2xh100_nccl.sqlite")
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT coalesce(n.text, s.value) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                          "ON n.textId = s.id WHERE n.eventType IN (59, 60, 70, 71) AND n.end IS NOT NULL").fetchall()
        records = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION").fetchone()[0]
    operators: dict[str, int] = {}
    for (name,) in rows:
        if name:
            cut = DETAILS.search(name)
            operators[name[:cut.start()] if cut else name] = operators.get(name[:cut.start()] if cut else name, 0) + 1
    host = analyse(path).host
    assert host.ranges_total == len(operators) < 100
    assert not [r.name for r in host.ranges if DETAILS.search(r.name)]
    assert {r.name: r.count for r in host.ranges} == {k: n for k, n in operators.items()
                                                      if k in {r.name for r in host.ranges}}
    assert next(r for r in host.ranges if r.name == "aten::to").count == operators["aten::to"] == 1_995
    names = [c.name for c in host.api]
    assert records > 0 and not [n for n in names if re.search(r"(?i)^(stream|event|context|stream wait) sync$", n)]
    (sync,) = [c for c in host.api if c.name == "cudaStreamSynchronize"]
    assert sync.count == 33
    # Every call whose name says it waits, summed: the synchronizes counted once (324.5 ms, not twice that).
    waits = sum(c.total_ns for c in host.api if re.search(r"(?i)synchron|\bsync\b", c.name))
    assert waits == sync.total_ns
