"""Megatron pipelines as the field records them: MegaScan's merged Chrome trace (one process per PP rank,
``forward``/``backward`` B/E pairs whose E event names the micro-batch and model chunk) is a pipeline with no
flags. The real traces' figures are checked against a short reading of the raw JSON (json and gzip only)."""

from __future__ import annotations

import collections
import gzip
import json
import statistics
from fractions import Fraction

import polars as pl
import pytest
from conftest import shared

from pipebubble.gates.diff import diff
from pipebubble.ingest import read_file
from pipebubble.options import Options, Scale
from pipebubble.run import run


def analyse(path):
    return run([path], Options(), Scale(use_cache=False))


def _pass(pid, name, mb, start, end, chunk=0, on_begin=False):
    """One pass as MegaScan writes it: the B event bare but for the iteration, the E event with the rest."""
    args = {"iteration": 0, "microbatch": mb, "model_chunk": chunk, "pp_rank": pid}
    begin = {"name": name, "ph": "B", "ts": start, "pid": pid, "tid": 0, "args": args if on_begin else {"iteration": 0}}
    end_ = {"name": name, "ph": "E", "ts": end, "pid": pid, "tid": 0, "args": {} if on_begin else args}
    return [begin, end_]


def write_two_stage(path, steps=2, bad=False):
    """GPipe on 2 processes (pid = PP rank), 2 micro-batches, forward 10 µs, backward 20 µs, ``steps`` steps
    100 µs apart. Stage s runs F{k} over [(s+k)·10, +10]; stage 1 runs B0 over [30, 50], B1 over [50, 70]; stage
    0 runs B0 over [50, 70], B1 over [70, 90]. A step's window is 90 µs; each stage is busy 2·10 + 2·20 = 60 µs:
    bubble 1 − 120 / 180 = 1/3. ``bad``: an event of a phase no decoder knows sends the block to the tolerant
    decoder, which must read the same arguments."""
    events = []
    for step in range(steps):
        t = step * 100
        for s in range(2):
            for k in range(2):
                events += _pass(s, "forward", k, t + (s + k) * 10, t + (s + k) * 10 + 10, on_begin=s == 1)
        for k in range(2):
            events += _pass(1, "backward", k, t + 30 + 20 * k, t + 50 + 20 * k)
            events += _pass(0, "backward", k, t + 50 + 20 * k, t + 70 + 20 * k)
    if bad:
        events.append({"name": "odd", "ph": "?", "ts": 0, "pid": 0, "tid": 0})
    path.write_text(json.dumps(events))
    return path


@pytest.mark.parametrize("bad", [False, True], ids=["fast", "tolerant"])
def test_pairs_named_by_their_merged_arguments(tmp_path, bad):
    spans = read_file(write_two_stage(tmp_path / "t.json", bad=bad), use_cache=False).spans
    names = spans.filter(pl.col("pid") == 1).sort("start")["name"].to_list()
    # Stage 1's forwards name the micro-batch on B, its backwards on E: both are read.
    assert names[:4] == ["forward (microbatch 0, model_chunk 0)", "forward (microbatch 1, model_chunk 0)",
                         "backward (microbatch 0, model_chunk 0)", "backward (microbatch 1, model_chunk 0)"]


def test_pairs_without_a_microbatch_keep_their_name(tmp_path):
    events = [{"name": "forward", "ph": "B", "ts": 0, "pid": 0, "tid": 0, "args": {"model_chunk": 1}},
              {"name": "forward", "ph": "E", "ts": 5, "pid": 0, "tid": 0}]
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(events))
    spans = read_file(path, use_cache=False).spans
    assert spans["name"].to_list() == ["forward"]


def test_processes_with_labels_are_stages_with_no_flags(tmp_path):
    report = analyse(write_two_stage(tmp_path / "t.json"))
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.schedule, len(pipe.steps)) == (2, 2, "gpipe", 2)
    assert any(e.startswith("micro-batch labels (trace_args)") for e in pipe.evidence)
    assert [s.name for s in report.stages] == ["rank0/pid0", "rank0/pid1"]
    assert pipe.step_time_ns == 90_000
    assert Fraction(pipe.bubble_fraction).limit_denominator(1000) == Fraction(1, 3)
    assert [(s.busy_ns, s.forward_ns, s.backward_ns) for s in report.stages] == [(120_000, 40_000, 80_000)] * 2


# --- the real traces ---


def raw_figures(path):
    """p, m, v, steps, mean step window (ns) and the pooled bubble, from the raw JSON: B/E paired on a stack
    per pid/tid, their args merged; a step is an ``iteration``, its window its passes' first start to last end."""
    events = json.load(gzip.open(path))
    stacks, spans = collections.defaultdict(list), []
    for e in sorted((e for e in events if e["ph"] in "BE"), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"])
        if e["ph"] == "B":
            stacks[key].append(e)
            continue
        b = stacks[key].pop()
        args = {**b.get("args", {}), **e.get("args", {})}
        spans.append((e["pid"], args["iteration"], args["microbatch"], args["model_chunk"], b["ts"], e["ts"]))
    windows, busy = collections.defaultdict(lambda: [float("inf"), float("-inf")]), 0.0
    for _, it, _, _, start, end in spans:
        windows[it] = [min(windows[it][0], start), max(windows[it][1], end)]
        busy += end - start
    lengths = [end - start for start, end in windows.values()]
    p = len({s[0] for s in spans})
    return {
        "p": p, "m": len({s[2] for s in spans}), "v": len({s[3] for s in spans}), "steps": len(windows),
        "step_ns": statistics.mean(lengths) * 1000, "bubble": 1 - busy / (p * sum(lengths)),
    }


@pytest.mark.parametrize("run_name", ["pp", "dpp"])
def test_megascan_is_an_interleaved_pipeline(run_name):
    path = shared("megatron_megascan", f"{run_name}-aggregated.json.gz")
    want = raw_figures(path)
    report = analyse(path)
    pipe = report.pipeline
    assert (pipe.stages, pipe.microbatches, pipe.chunks, len(pipe.steps)) == (4, 8, 4, 20)
    assert (want["p"], want["m"], want["v"], want["steps"]) == (4, 8, 4, 20)
    assert pipe.schedule == "interleaved_1f1b"
    assert pipe.step_time_ns == pytest.approx(want["step_ns"], abs=1)
    assert pipe.bubble_fraction == pytest.approx(want["bubble"], abs=1e-6)
    assert pipe.bubble_fraction > pipe.theoretical_bubble_fraction > 0
    assert [s.name for s in report.stages] == [f"rank0/pid{p}" for p in range(4)]
    assert report.findings


def test_megascan_diff_says_which_schedule_is_faster():
    base, new = (shared("megatron_megascan", f"{n}-aggregated.json.gz") for n in ("pp", "dpp"))
    result = diff(analyse(base).to_dict(), analyse(new).to_dict(), 0.05)
    step = next(d for d in result.deltas if d.metric == "step time")
    fast, slow = raw_figures(base)["step_ns"], raw_figures(new)["step_ns"]
    # Megatron's own interleaved schedule (pp) is the faster: the changed one (dpp) takes 27 % longer a step.
    assert step.status == "regressed"
    assert step.change == pytest.approx(slow / fast - 1, abs=1e-6)
    assert 0.27 < step.change < 0.28


# --- Megatron's step-timer timelines ---


def write_step_timers(path, pp=4, dp=2, m=4, forward_us=100.0, heavy=None, steps=(3, 4, 9)):
    """A step-timer timeline as Megatron writes one for a whole job: ``pid`` = DP rank, a thread per PP rank
    and class (``PP rank {p}, TP rank 0, compute`` / ``pp-comm``), X events in float µs: ``forward-compute`` /
    ``backward-compute`` with args {step, model_chunk, mb_id, seq_id}, ``forward-send`` / ``backward-recv`` on
    the comm thread, ``optimizer`` on the misc thread after the step's passes; only the ``steps`` sampled (with
    gaps), each 1 s apart.
    GPipe: stage s's forward takes ``forward_us`` (× ``heavy[s]``), its backward twice that; F(s, k) starts when
    F(s−1, k) and F(s, k−1) have ended, B(s, k) when B(s+1, k), B(s, k−1) and F(s, m−1) have. Returns the path
    and, per replica and step, each stage's passes [(phase, mb, start, end)] in µs."""
    heavy = heavy or {}
    events, passes = [], {}
    for d in range(dp):
        for s in range(pp):
            for c, kind in ((0, "compute"), (1, "pp-comm"), (2, "misc")):
                events.append({"name": "thread_name", "ph": "M", "pid": d, "tid": 10 * s + c,
                               "args": {"name": f"PP rank {s}, TP rank 0, {kind}"}})
        for step in steps:
            t0 = 1_000_000.0 * step + 7.5 * d
            f_end, b_end, rows = {}, {}, {s: [] for s in range(pp)}
            for k in range(m):
                for s in range(pp):
                    start = max(f_end.get((s - 1, k), t0), f_end.get((s, k - 1), t0))
                    f_end[(s, k)] = start + forward_us * heavy.get(s, 1.0)
                    rows[s].append(("forward", k, start, f_end[(s, k)]))
            for k in range(m):
                for s in reversed(range(pp)):
                    start = max(b_end.get((s + 1, k), t0), b_end.get((s, k - 1), t0), f_end[(s, m - 1)])
                    b_end[(s, k)] = start + 2 * forward_us * heavy.get(s, 1.0)
                    rows[s].append(("backward", k, start, b_end[(s, k)]))
            passes[(d, step)] = rows
            for s, row in rows.items():
                for phase, k, start, end in row:
                    args = {"step": step, "model_chunk": 0, "mb_id": k, "seq_id": 0}
                    events.append({"name": f"{phase}-compute", "ph": "X", "pid": d, "tid": 10 * s,
                                   "ts": start, "dur": end - start, "args": args})
                    if (phase == "forward" and s < pp - 1) or (phase == "backward" and s > 0):
                        timer = "forward-send" if phase == "forward" else "backward-send"
                        events.append({"name": timer, "ph": "X", "pid": d, "tid": 10 * s + 1, "ts": end,
                                       "dur": 1.0, "args": {"step": step}})
                last = max(end for other in rows.values() for *_, end in other)
                events.append({"name": "optimizer", "ph": "X", "pid": d, "tid": 10 * s + 2, "ts": last + 5,
                               "dur": 20.0, "args": {"step": step}})
    path.write_text(json.dumps({"traceEvents": events}))
    return path, passes


def test_step_timer_timeline_is_a_pipeline(tmp_path):
    path, passes = write_step_timers(tmp_path / "timers.json")
    report = analyse(path)
    pipe = report.pipeline
    assert pipe is not None
    assert (pipe.stages, pipe.microbatches, pipe.schedule, len(pipe.steps)) == (4, 4, "gpipe", 3)
    assert [s.name for s in report.stages] == ["pp0", "pp1", "pp2", "pp3"]
    # The first replica's pipeline (pid 0), over the three sampled steps.
    windows = []
    busy = 0.0
    for step in (3, 4, 9):
        rows = passes[(0, step)]
        starts = [start for row in rows.values() for _, _, start, _ in row]
        ends = [end for row in rows.values() for _, _, _, end in row]
        windows.append(max(ends) - min(starts))
        busy += sum(end - start for row in rows.values() for _, _, start, end in row)
    assert pipe.step_time_ns == pytest.approx(statistics.mean(windows) * 1000, abs=1)
    assert pipe.bubble_fraction == pytest.approx(1 - busy / (4 * sum(windows)), abs=1e-9)
    assert [s.microbatches for s in report.stages] == [4] * 4


def test_step_timer_stages_are_the_first_replicas_threads(tmp_path):
    path, _ = write_step_timers(tmp_path / "timers.json", dp=2)
    spans = read_file(path, use_cache=False).spans
    named = spans.filter(pl.col("stage").is_not_null())
    # Ingest names every PP-rank thread's stage, in both replicas; the passes are named by their args.
    assert named.select("pid", "stage").unique().sort("pid", "stage").rows() == [
        (d, s) for d in range(2) for s in range(4)]
    assert "forward-compute (microbatch 2, model_chunk 0)" in set(spans["name"])
    from pipebubble.analysis.pipeline.stages import assign

    mapped = assign(spans)
    assert mapped.names == ["pp0", "pp1", "pp2", "pp3"]
    assert set(mapped.spans.filter(pl.col("stage").is_not_null())["pid"]) == {0}


def test_step_timer_args_are_read_by_the_tolerant_decoder_too(tmp_path):
    path, _ = write_step_timers(tmp_path / "timers.json", dp=1)
    trace = json.loads(path.read_text())
    trace["traceEvents"].append({"name": "odd", "ph": "?", "ts": 0, "pid": 0, "tid": 0})
    path.write_text(json.dumps(trace))
    fast = read_file(write_step_timers(tmp_path / "fast.json", dp=1)[0], use_cache=False).spans
    tolerant = read_file(path, use_cache=False).spans
    assert sorted(tolerant["name"].unique()) == sorted(fast["name"].unique())
