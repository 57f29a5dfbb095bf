"""``diff --by op``: operators added, removed and changed, by count and time, per step where both runs mark
steps. Figures checked against hand-computed timelines and, on real traces, against the raw events read by
a plain-Python script (``independent.py``'s readers of ts/dur, nothing of pipebubble's)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import independent as ind
import pytest
from conftest import shared
from runs import run_cli

import pipebubble
from pipebubble.errors import PipebubbleError
from pipebubble.gates.ops import ops_diff
from pipebubble.render.gates_ops import render_ops

US = 1_000


def _x(cat: str, name: str, start_us: int, dur_us: int, pid: int = 100, tid: int = 100) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": start_us, "dur": dur_us}


def _trace(path: Path, steps: int, ops: dict[str, int], kernels: dict[str, int]) -> Path:
    """``steps`` profiler steps of 1 ms each, every one running each CPU operator of ``ops`` (name: µs) and each
    kernel of ``kernels`` (name: µs) once, one after the other."""
    events = []
    for s in range(steps):
        base = 1_000 * s
        events.append(_x("user_annotation", f"ProfilerStep#{s + 1}", base, 1_000))
        at = base + 10
        for name, dur in ops.items():
            events.append(_x("cpu_op", name, at, dur))
            at += dur + 5
        at = base + 10
        for name, dur in kernels.items():
            events.append(_x("kernel", name, at, dur, pid=0, tid=7))
            at += dur + 5
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """The base: 2 steps of mm 100 µs, add 20 µs, relu 50 µs, kernels gemm 200 µs and relu_kernel 10 µs. The
    new run: 3 steps (a longer run), relu gone, gelu 40 µs and gelu_kernel 30 µs added, add slower (30 µs)."""
    folder = tmp_path_factory.mktemp("ops")
    base = _trace(folder / "base.json", 2, {"aten::mm": 100, "aten::add": 20, "aten::relu": 50},
                  {"gemm_kernel": 200, "relu_kernel": 10})
    new = _trace(folder / "new.json", 3, {"aten::mm": 100, "aten::add": 30, "aten::gelu": 40},
                 {"gemm_kernel": 200, "gelu_kernel": 30})
    return base, new


def _by_name(result) -> dict[str, object]:
    return {r.name: r for r in result.rows}


def test_host_ops_table_of_a_synthetic_trace(pair):
    report = pipebubble.analyze(pair[0], workers=1, cache=False)
    data = report.to_dict()["host"]
    ops = {o["name"]: (o["count"], o["total_ns"], o["max_ns"]) for o in data["ops"]}
    assert ops == {"aten::mm": (2, 200 * US, 100 * US), "aten::relu": (2, 100 * US, 50 * US),
                   "aten::add": (2, 40 * US, 20 * US)}
    assert data["steps"] == 2
    assert [o["name"] for o in data["ops"]] == ["aten::mm", "aten::relu", "aten::add"]  # biggest total first


def test_added_removed_and_slower_per_step(pair):
    result = pipebubble.diff(*pair, by="op", workers=1, cache=False)
    assert result.per_step and (result.base_steps, result.new_steps) == (2, 3)
    rows = _by_name(result)
    assert {r.name for r in result.added} == {"aten::gelu", "gelu_kernel"}
    assert {r.name for r in result.removed} == {"aten::relu", "relu_kernel"}
    assert {r.name for r in result.changed} == {"aten::add"}
    add = rows["aten::add"]
    assert (add.base_count, add.new_count, add.base_ns, add.new_ns) == (1, 1, 20 * US, 30 * US)
    assert (add.delta_ns, add.change, add.base_total_ns, add.new_total_ns) == (10 * US, 0.5, 40 * US, 90 * US)
    mm = rows["aten::mm"]  # 2 calls in 2 steps, 3 in 3: the same per step
    assert mm.status == "same" and (mm.base_total_count, mm.new_total_count) == (2, 3) and mm.delta_count == 0
    gelu = rows["aten::gelu"]
    assert (gelu.kind, gelu.base_ns, gelu.new_ns, gelu.change, gelu.new_total_count) == ("cpu_op", 0, 40 * US,
                                                                                         None, 3)
    relu = rows["relu_kernel"]
    assert (relu.kind, relu.cls, relu.base_ns, relu.delta_ns, relu.change) == ("kernel", "compute", 10 * US,
                                                                               -10 * US, -1.0)
    assert [r.status for r in result.rows] == sorted((r.status for r in result.rows),
                                                     key=["added", "removed", "changed", "same"].index)
    assert result.passed and not result.regressions  # informational without a threshold


def test_by_kernel_leaves_cpu_operators_out(pair):
    result = pipebubble.diff(*pair, by="kernel", workers=1, cache=False)
    assert {r.kind for r in result.rows} == {"kernel"}
    assert sorted(r.name for r in result.rows) == ["gelu_kernel", "gemm_kernel", "relu_kernel"]


def test_a_threshold_makes_it_a_gate(pair):
    strict = pipebubble.diff(*pair, by="op", max_op_regression="20%", workers=1, cache=False)
    # add grew 10 µs > 20% of 20 µs and > 1% of the base's 170 µs of operators per step; the added ones too
    assert {r.name for r in strict.regressions} == {"aten::add", "aten::gelu", "gelu_kernel"}
    assert not strict.passed
    loose = pipebubble.diff(*pair, by="op", max_op_regression=0.6, workers=1, cache=False)
    assert {r.name for r in loose.regressions} == {"aten::gelu", "gelu_kernel"}


def test_frame_is_one_row_per_operator(pair):
    result = pipebubble.diff(*pair, by="op", workers=1, cache=False)
    frame = result.frame
    assert frame.height == 7 and {"kind", "class", "name_full", "status", "delta_ns", "change"} <= set(frame.columns)
    assert frame.filter(frame["status"] == "added")["name"].sort().to_list() == ["aten::gelu", "gelu_kernel"]


def _report(ops: dict[str, tuple[int, int]], steps: int | None) -> dict:
    return {"host": {"ops": [{"name": n, "count": c, "total_ns": t} for n, (c, t) in ops.items()], "steps": steps},
            "kernels": []}


def test_totals_where_a_run_has_no_steps():
    result = ops_diff(_report({"a": (4, 400)}, 2), _report({"a": (4, 440), "b": (1, 5)}, None))
    assert not result.per_step and "marked no steps" in result.notes[0]
    a = _by_name(result)["a"]
    assert (a.base_count, a.base_ns, a.new_ns, a.status) == (4, 400, 440, "changed")  # +10% > 5%
    assert ops_diff(_report({"a": (4, 400)}, None), _report({"a": (4, 410)}, None)).rows[0].status == "same"


def test_bad_arguments():
    with pytest.raises(ValueError, match="by 'lane'"):
        ops_diff({}, {}, by="lane")
    with pytest.raises(ValueError, match="tolerance"):
        ops_diff({}, {}, tolerance=-1)


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "github", "markdown"])
def test_every_format(pair, fmt):
    result = pipebubble.diff(*pair, by="op", max_op_regression="20%", workers=1, cache=False)
    out = result.render(fmt)
    assert "gelu" in out and "relu" in out
    if fmt == "json":
        body = json.loads(out)
        assert body["added"] == ["aten::gelu", "gelu_kernel"] and body["failed"] and body["per_step"]
        assert {"kind", "class", "name", "name_full", "status", "base_ns", "new_ns", "change"} <= set(
            body["operators"][0])
    if fmt == "text":
        assert "ADDED" in out and "REMOVED" in out and "CHANGED REGRESSED" in out
        assert "0.04 ms" in out  # gelu's 40 µs a step
    if fmt == "github":
        assert out.count("::error") == 3
    with pytest.raises(ValueError):
        render_ops(result, "html")


def test_cli_exit_codes(pair):
    base, new = (str(p) for p in pair)
    informational = run_cli("diff", base, new, "--by", "op", "--workers", "1")
    assert informational.returncode == 0, informational.stderr
    assert "aten::gelu" in informational.stdout and "per step" in informational.stdout
    gated = run_cli("diff", base, new, "--by", "op", "--max-op-regression", "20%", "-f", "json", "--workers", "1")
    assert gated.returncode == 1 and json.loads(gated.stdout)["regressions"]
    alone = run_cli("diff", base, new, "--max-op-regression", "20%")
    assert alone.returncode == 2 and "--by" in alone.stderr


def test_api_refuses_a_bad_threshold(pair):
    with pytest.raises(PipebubbleError, match="max_op_regression"):
        pipebubble.diff(*pair, by="op", max_op_regression="20", workers=1, cache=False)


# ---- real traces, against their raw events ------------------------------------------------------------------

def raw_ops(path: Path, by: str = "op") -> tuple[dict[tuple[str, str], list[int]], int]:
    """Per (kind, name): [count, total ns] of the file's complete events, CPU operators (``cpu_op``) and GPU
    operations (Kineto's kernel, memcpy and memset categories); and its distinct ``ProfilerStep#N`` on the host."""
    doc = ind.load_json(path)
    table: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    steps = set()
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X" or e.get("dur") is None:
            continue
        cat, name = str(e.get("cat") or "").lower(), e.get("name") or ""
        kind = "cpu_op" if cat == "cpu_op" and by == "op" else "kernel" if cat in ind.GPU_CATEGORIES else None
        if kind:
            table[(kind, name)][0] += 1
            table[(kind, name)][1] += ind.dur_ns(e["dur"])
        if name.startswith("ProfilerStep#") and cat not in {*ind.GPU_CATEGORIES, "gpu_user_annotation"}:
            steps.add(name)
    return dict(table), len(steps)


PAIRS = [("kineto", "recsys_128rank_sampled_rank-0.json.gz", "recsys_128rank_sampled_rank-1.json.gz"),
         ("pipeline_cpu", "gpipe/rank0.pt.trace.json.gz", "interleaved1f1b/rank0.pt.trace.json.gz")]


@pytest.mark.parametrize(("folder", "a", "b"), PAIRS)
def test_real_traces_against_their_raw_events(folder, a, b):
    base, new = shared(folder, a), shared(folder, b)
    result = pipebubble.diff(base, new, by="op", workers=1)
    (ta, sa), (tb, sb) = raw_ops(base), raw_ops(new)
    assert (result.base_steps, result.new_steps) == (sa, sb) and result.per_step
    assert {(r.kind, r.name_full) for r in result.added} == tb.keys() - ta.keys()
    assert {(r.kind, r.name_full) for r in result.removed} == ta.keys() - tb.keys()
    assert len(result.rows) == len(ta.keys() | tb.keys())
    for r in result.rows:
        ca, na = ta.get((r.kind, r.name_full), [0, 0])
        cb, nb = tb.get((r.kind, r.name_full), [0, 0])
        assert (r.base_total_count, r.base_total_ns, r.new_total_count, r.new_total_ns) == (ca, na, cb, nb), r.name
        assert r.base_ns == na / sa and r.new_count == cb / sb


def test_real_traces_differ():
    """The two recsys ranks ran different embedding work: operators only in one of them, on both sides."""
    base, new = shared("kineto", PAIRS[0][1]), shared("kineto", PAIRS[0][2])
    result = pipebubble.diff(base, new, by="op", workers=1)
    assert Counter(r.kind for r in result.removed) == {"cpu_op": 12, "kernel": 11}
    assert Counter(r.kind for r in result.added) == {"cpu_op": 3}
    assert "aten::gather" in {r.name for r in result.removed}


def test_a_saved_report_carries_what_the_diff_reads(pair, tmp_path):
    saved = tmp_path / "baseline.json"
    saved.write_text(json.dumps(pipebubble.analyze(pair[0], workers=1, cache=False).to_dict()))
    from_saved = pipebubble.diff(saved, pair[1], by="op", workers=1, cache=False)
    fresh = pipebubble.diff(*pair, by="op", workers=1, cache=False)
    assert from_saved.rows == fresh.rows and from_saved.base_steps == 2
