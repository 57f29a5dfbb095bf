"""What the export reads beyond the span table (``ingest.extras``) and how it binds to spans
(``render.perfetto.flows``): every event's args found again, flow events bound as the Trace Event Format says,
correlation ids drawn as flows; checked on real Kineto and Nsight traces against counts taken from the raw
files themselves, and on written edge cases."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import shared
from test_export import SAMPLE, decode, run_export

from pipebubble.ingest.json import extras
from pipebubble.render import perfetto
from pipebubble.render.perfetto.flows import attach
from pipebubble.run import with_spans

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "comm"}


def raw_events(path: Path) -> list[dict]:
    body = json.loads(gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes())
    return body["traceEvents"] if isinstance(body, dict) else body


def attached(path: Path) -> tuple[pl.DataFrame, extras.Extras]:
    report, table = with_spans([path])
    found = extras.read(extras.sources(table, [path]))
    return attach(table, found.args, found.flows), found


def complete_flows(events: list[dict], cat: str) -> int:
    """Flows of one category with both ends in the file (a start and a finish of one id)."""
    starts = {e["id"] for e in events if e.get("ph") == "s" and e.get("cat") == cat}
    return len(starts & {e["id"] for e in events if e.get("ph") == "f" and e.get("cat") == cat})


@pytest.mark.parametrize("name", ["resnet_ddp_a100_nccl_rank0.json.gz", "resnet_v100_ns_resolution.json.gz",
                                  "recsys_128rank_sampled_rank-0.json.gz", "large_integer_ts.json.gz"])
def test_every_complete_event_finds_its_args(name):
    """Times re-read through ingest's conversion land on the spans' own, to the ns (float µs with an ns
    fraction, huge integer µs, a base time): every span with args in the file gets them."""
    path = shared("kineto", name)
    table, found = attached(path)
    with_args = sum(1 for e in raw_events(path) if e.get("ph") == "X" and e.get("cat") != "Trace" and e.get("args"))
    assert table["args"].is_not_null().sum() == with_args and not found.warnings
    assert table["category"].is_not_null().all()


def test_kineto_flows_link_each_launch_to_its_kernel(tmp_path):
    """resnet_ddp's file draws ac2g (launch to kernel) and fwdbwd flows, and has other arrays after its
    events (the quick split must fall back to the full one)."""
    path = shared("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")
    events = raw_events(path)
    trace = decode(run_export(tmp_path, path, "out.pftrace").read_bytes())
    assert len(trace.flows) == complete_flows(events, "ac2g") + complete_flows(events, "fwdbwd")
    kinds = Counter()
    for steps in trace.flows.values():
        first, last = trace.slices[steps[0]], trace.slices[steps[-1]]
        kinds[first["category"][0], last["category"][0] in GPU_CATEGORIES] += 1
        if first["category"] == ["cuda_runtime"]:
            assert last["category"][0] in GPU_CATEGORIES and first["args"]["correlation"] == last["args"]["correlation"]
    assert kinds == {("cuda_runtime", True): complete_flows(events, "ac2g"),
                     ("cpu_op", False): complete_flows(events, "fwdbwd")}
    kernel = next(s for s in trace.slices if s["category"] == ["kernel"])
    assert {"grid", "block", "stream", "correlation"} <= set(kernel["args"])


def test_nsight_export_draws_correlation_flows_and_names_processes_shortly(tmp_path):
    path = shared("nsys", "torchrun_2xh100_nccl.sqlite")
    out = run_export(tmp_path, path, "out.pftrace")
    data = out.read_bytes()
    assert str(path).encode() not in data and str(path.parent).encode() not in data  # no folder anywhere
    trace = decode(data)
    assert {t.name for t in trace.tracks.values() if not t.parent_uuid} == {"pid 144", "pid 145"}
    _, table = with_spans([path])
    keyed = table.filter(pl.col("correlation").is_not_null())
    launches = keyed.filter(pl.col("device").is_null()).select("pid", "correlation").unique()
    launched = keyed.filter(pl.col("device").is_not_null()).join(launches, on=["pid", "correlation"])
    assert len(trace.flows) == launched.height > 5000
    for steps in trace.flows.values():
        first, last = (trace.slices[i] for i in steps)
        assert first["category"] in (["runtime"], ["sync"]) and last["category"][0] in GPU_CATEGORIES
        assert first["args"]["correlation"] == last["args"]["correlation"]
        assert trace.group(first["track"]) == trace.group(last["track"])  # one process's launch and kernel


def write_trace(path: Path, events: list[dict]) -> Path:
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": {"rank": 0}}))
    return path


def x(name: str, tid: int, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def flow(ph: str, fid: int, tid: int, ts: float, bp: str | None = None) -> dict:
    event = {"ph": ph, "cat": "test", "name": "test", "id": fid, "pid": 1, "tid": tid, "ts": ts}
    return {**event, "bp": bp} if bp else event


def linked(path: Path) -> set[tuple[str, ...]]:
    table, _ = attached(path)
    report, _ = with_spans([path])
    trace = decode(perfetto.to_proto(perfetto.build(table, report)))
    return {tuple(trace.slices[i]["name"] for i in steps) for steps in trace.flows.values()}


def test_flow_events_bind_as_the_trace_event_format_says(tmp_path):
    """``s``/``t`` bind to the innermost enclosing slice; ``f`` too with ``bp: e``, else to the next slice to
    begin; an id starts afresh after its ``f``; a start without a finish draws nothing."""
    events = [x("outer", 1, 0, 100), x("inner", 1, 10, 10), x("target", 2, 50, 10), x("next", 2, 70, 10),
              flow("s", 1, 1, 12), flow("f", 1, 2, 55, "e"),  # inner -> target
              flow("s", 2, 1, 15), flow("f", 2, 2, 65),  # inner -> next (no bp: the next slice)
              flow("s", 1, 1, 58), flow("f", 1, 2, 75, "e"),  # id 1 again, after its f: outer -> next
              flow("s", 3, 1, 5), flow("t", 3, 2, 52), flow("f", 3, 2, 71, "e"),  # outer -> target -> next
              flow("s", 4, 1, 40)]
    assert linked(write_trace(tmp_path / "flows.json", events)) == {
        ("inner", "target"), ("inner", "next"), ("outer", "next"), ("outer", "target", "next")}


def test_a_cut_off_trace_keeps_the_args_of_its_whole_events(tmp_path):
    events = [x(f"op{i}", 1, i * 10, 5, **{"Input Dims": [[i, 2]]}) for i in range(200)]
    text = json.dumps({"traceEvents": events})
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) * 2 // 3])
    args, flows, unread = extras.read_file(path, str(path))
    assert unread == 0  # only the partial last event is missing, as ingest itself warns
    assert 100 < args.height < 200 and args["name"].to_list() == [f"op{i}" for i in range(args.height)]
    assert json.loads(args["args"][5]) == {"Input Dims": [[5, 2]]}


def test_arguments_of_begin_events_and_damaged_args_blocks(tmp_path):
    events = [{"ph": "B", "cat": "user_annotation", "name": "region", "pid": 1, "tid": 1, "ts": 0,
               "args": {"note": "kept"}}, x("op", 1, 1, 2, n=1), {"ph": "E", "pid": 1, "tid": 1, "ts": 10},
              {"ph": "X", "name": 7, "pid": 1, "tid": 1, "ts": 20, "dur": 1}]  # a name that is no string
    table, _ = attached(write_trace(tmp_path / "b.json", events))
    args = dict(zip(table["name"].to_list(), table["args"].to_list(), strict=True))
    assert json.loads(args["region"]) == {"note": "kept"} and json.loads(args["op"]) == {"n": 1}


def test_sources_finds_a_file_named_otherwise(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "rank0.json", [x("op", 1, 0, 1)])
    table = pl.DataFrame({"source": [str(path), "rank0.json", str(tmp_path / "elsewhere" / "rank0.json"), None]})
    monkeypatch.chdir(tmp_path)
    assert extras.sources(table, [path]) == {str(path): path, "rank0.json": path,
                                             str(tmp_path / "elsewhere" / "rank0.json"): path}
    nsys = pl.DataFrame({"source": ["/x/job.sqlite"]})
    assert extras.sources(nsys, [Path("/x/job.sqlite")]) == {}  # no such JSON: nothing to read


def test_the_analysis_never_reads_the_extras():
    """Only the export re-reads arguments and flows: an analysis imports neither module."""
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    code = ("import sys; from pathlib import Path; from pipebubble.run import run; run([Path(sys.argv[1])]); "
            "print(any(m in sys.modules for m in "
            "('pipebubble.ingest.json.extras', 'pipebubble.render.perfetto.flows')))")
    proc = subprocess.run([sys.executable, "-c", code, str(SAMPLE)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_many_files_read_on_workers_as_in_this_process(monkeypatch):
    if not SAMPLE.exists():
        pytest.skip("sample traces absent")
    files = {str(p): p for p in sorted(SAMPLE.glob("rank*.json.gz"))}
    alone = extras.read(files)
    monkeypatch.setattr(extras, "PARALLEL_BYTES", 0)
    from pipebubble.options import Scale

    pooled = extras.read(files, Scale(workers=2))
    assert pooled.args.equals(alone.args) and pooled.flows.equals(alone.flows) and alone.flows.height == 784
