"""The requests section: percentiles of a vLLM-shaped OTLP export against hand-computed values, TTFT's parts,
the tail attributed to engine steps, the findings and the gates."""

from __future__ import annotations

import math

import polars as pl
import pytest
from otlp_shapes import MS, write_vllm

from pipebubble import gates, requests_table
from pipebubble.analysis.requests import findings, summarize
from pipebubble.analysis.serving.steps_llm import STEP_COLUMNS
from pipebubble.gates import requests as request_gates
from pipebubble.ingest import read_file
from pipebubble.report.requests import JSON_KEYS, Requests


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    path = tmp_path_factory.mktemp("otlp") / "traces.json"
    written = write_vllm(path)
    result = summarize(read_file(path, use_cache=False).requests)
    return result, written


def close(quantiles, expected_ms):
    """Each percentile within 1 ns of the hand-computed value (seconds go through a double in OTLP)."""
    assert quantiles is not None and set(quantiles) == {"p50", "p90", "p99"}
    for name, ms in expected_ms.items():
        assert quantiles[name] == pytest.approx(ms * MS, abs=1), name


def linear(values, q):
    """Linear interpolation between closest ranks, written out: position (n − 1)·q."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    return ordered[lo] + (h - lo) * (ordered[min(lo + 1, len(ordered) - 1)] - ordered[lo])


def test_percentiles_equal_hand_computed_values(section):
    result, written = section
    assert result.count == 300 and result.with_tpot == 300
    # queue i ms, i = 0..299: the q-th percentile sits at position 299·q, i.e. 299·q ms
    close(result.queue_ns, {"p50": 149.5, "p90": 269.1, "p99": 296.01})
    close(result.ttft_ns, {"p50": 174.5, "p90": 294.1, "p99": 321.01})  # queue + 25 ms
    # TPOT 10 + (i mod 50) ms, each value 6 times: sorted index k holds 10 + k // 6 ms
    close(result.tpot_ns, {"p50": 34.5, "p90": 54.1, "p99": 59.0})
    close(result.prefill_ns, {"p50": 20.0, "p90": 20.0, "p99": 20.0})
    e2e = [r["e2e"] / MS for r in written]
    close(result.e2e_ns, {p: linear(e2e, q) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))})
    assert result.completion_tokens == {"p50": 5.0, "p90": 8.0, "p99": 8.0}
    assert result.window_ns == max(r["arrival"] + r["e2e"] for r in written) - written[0]["arrival"]


def test_ttft_split_into_queue_and_prefill(section):
    result, _ = section
    split = result.ttft_split_ns
    assert split["all"] == pytest.approx({"queue": 149.5 * MS, "prefill": 20 * MS, "other": 5 * MS}, abs=1)
    # the tail: TTFT >= its p90 (294.1 ms), the requests queued 270..299 ms
    assert split["tail"] == pytest.approx({"queue": 284.5 * MS, "prefill": 20 * MS, "other": 5 * MS}, abs=1)
    assert result.ttft_p99_without_queue_ns == pytest.approx(25 * MS, abs=1)
    assert result.steps is None and any("KV-cache" in n for n in result.notes)


def test_queueing_finding(section):
    result, _ = section
    found = findings.findings(result)
    assert [f.kind for f in found] == ["queueing"]
    f = found[0]
    assert f.worth_ns == pytest.approx((321.01 - 25) * MS, abs=2) and f.worth_gpu_ns == 0
    assert f.evidence["step_ns"] == round(result.ttft_ns["p99"]) and "faster than the engine" in f.cause


def test_tpot_needs_two_tokens():
    one = requests_table.conform(pl.DataFrame({"ttft_ns": [5 * MS, 5 * MS], "e2e_ns": [5 * MS, 25 * MS],
                                               "completion_tokens": [1, 3]}))
    result = summarize(one)
    assert result.with_tpot == 1 and result.tpot_ns == {"p50": 10 * MS, "p90": 10 * MS, "p99": 10 * MS}
    assert summarize(requests_table.empty()) is None


def test_section_round_trips_and_keeps_the_contract_keys(section):
    result, _ = section
    body = result.to_dict()
    assert list(body) == list(JSON_KEYS)
    assert {"count", "ttft_ns", "queue_ns", "tpot_ns", "e2e_ns"} <= set(body)
    assert Requests.from_dict(body) == result


# --- the tail attributed to engine steps ---

#: One engine thread's steps: (class, ms, prompt tokens); decode steps take 10 ms.
ENGINE = [("decode", 10, 0)] * 5 + [("prefill", 30, 4000)] + [("decode", 10, 0)] * 14 + [("mixed", 50, 2000)] + \
    [("decode", 10, 0)] * 20


def engine_steps() -> pl.DataFrame:
    starts = [sum(ms for _, ms, _ in ENGINE[:i]) for i in range(len(ENGINE))]
    rows = [{"step": i, "lane": "rank0/cpu/1", "rank": 0, "pid": 1, "tid": 1, "name": cls, "start": s * MS,
             "end": (s + ms) * MS, "cls": cls, "source_label": "generic", "prefill_reqs": int(tokens > 0),
             "prefill_tokens": tokens, "decode_reqs": 4}
            for i, ((cls, ms, tokens), s) in enumerate(zip(ENGINE, starts, strict=True))]
    other = [{**r, "lane": "rank1/cpu/2"} for r in rows[:3]]  # a second thread with fewer steps: not the engine
    return pl.DataFrame(rows + other).select(STEP_COLUMNS)


def request_rows() -> pl.DataFrame:
    """(arrival, scheduled, first token, completion) in ms and output tokens: one request decodes in [100, 200)
    among decode steps after waiting through the 4000-token prefill; one decodes in [200, 310) across the
    50 ms mixed step; one lies outside the steps' window."""
    rows = [(1, 90, 100, 200, 11), (150, 190, 200, 310, 8), (1000, 1010, 1020, 1120, 11)]
    return requests_table.conform(pl.DataFrame({
        "arrival": [a * MS for a, *_ in rows], "scheduled": [s * MS for _, s, *_ in rows],
        "first_token": [f * MS for _, _, f, *_ in rows], "completion": [c * MS for *_, c, _ in rows],
        "queue_ns": [(s - a) * MS for a, s, *_ in rows], "ttft_ns": [(f - a) * MS for a, _, f, *_ in rows],
        "e2e_ns": [(c - a) * MS for a, _, _, c, _ in rows], "completion_tokens": [t for *_, t in rows]}))


def test_tail_attributed_to_steps():
    result = summarize(request_rows(), engine_steps())
    steps = result.steps
    assert (steps.lane, steps.steps, steps.requests) == ("rank0/cpu/1", len(ENGINE), 2)
    assert steps.shared.count == 1 and steps.shared.tpot_ns["p50"] == pytest.approx(110 / 7 * MS)
    assert steps.apart.count == 1 and steps.apart.tpot_ns["p50"] == 10 * MS
    # the mixed step's 40 ms beyond a decode step taken out: 70 ms over 7 tokens
    assert steps.tpot_p99_without_interference_ns == pytest.approx(10 * MS)
    assert steps.prefill_tokens_ahead == {"tail": 4000, "rest": 0}


def test_interference_finding():
    result = summarize(request_rows(), engine_steps())
    found = {f.kind: f for f in findings.findings(result)}
    f = found["tail_interference"]
    p99 = result.tpot_ns["p99"]  # of 10, 10 and 110/7 ms
    assert p99 == pytest.approx((10 + 0.98 * (110 / 7 - 10)) * MS)
    assert f.worth_ns == round(p99 - 10 * MS) and f.evidence["shared_tpot_p99_ns"] > f.evidence["apart_tpot_p99_ns"]


def test_steps_on_another_clock_are_not_joined():
    late = engine_steps().with_columns(pl.col("start", "end") + 10**12)
    result = summarize(request_rows(), late)
    assert result.steps is None and any("same clock" in n for n in result.notes)


# --- gates ---


@pytest.mark.parametrize("key, above, below", [("max_ttft_p99", "321ms", "0.33s"), ("max_tpot_p99", "58.9ms", "59.1"),
                                               ("max_queue_p99", "296ms", "296100us")])
def test_gate_fails_above_the_p99_and_passes_below(section, key, above, below):
    report = {"requests": section[0].to_dict()}
    assert gates.check(report, {key: above}).gates[0].status == "fail"
    assert gates.check(report, {key: below}).gates[0].status == "pass"


def test_gate_without_requests_skips():
    gate = gates.check({"requests": None}, {"max_ttft_p99": "1s"}).gates[0]
    assert gate.status == "skip" and "no served requests" in gate.note
    assert request_gates.METRICS["tpot_p99"]({"requests": {"count": 1, "tpot_ns": None}})[0] is None


def test_diff_compares_percentiles(section):
    base = section[0].to_dict()
    slower = {**base, "ttft_ns": {k: v * 1.2 for k, v in base["ttft_ns"].items()}}
    unmatched: list[str] = []
    pairs = request_gates.percentile_pairs({"requests": base}, {"requests": slower}, unmatched)
    deltas = {key: gates.judge(label, a, b, "ns", 0.05, scale=scale, key=key) for label, key, a, b, scale in pairs}
    assert len(deltas) == 12 and not unmatched
    assert deltas["requests.ttft_ns.p99"].status == "regressed" and deltas["requests.e2e_ns.p99"].status == "ok"
    request_gates.percentile_pairs({"requests": base}, {}, unmatched)
    assert unmatched == ["requests only in the base report"]
