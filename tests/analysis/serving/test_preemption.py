"""Preemptions and the engine's traced steps in the requests section: a synthetic journey of requests
preempted once and twice (their requeue waits and the KV-cache use at each, exactly), an independent walk of
the raw OTLP events, the prefill-heavy steps a TTFT tail waited through (hand-computed), the findings and
``check --max-preemptions``."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import polars as pl
import pytest
from otlp_shapes import MS, journey_spans, preempted_journey, step_span, vllm_request, write_lines

from pipebubble import gates, requests_table
from pipebubble.analysis.findings import preemption as preemption_findings
from pipebubble.analysis.requests import summarize
from pipebubble.analysis.requests.step_trace import matched, with_heavy
from pipebubble.ingest import read_file
from pipebubble.options import Scale
from pipebubble.report import Report
from pipebubble.run import run
from pipebubble.spans import conform


@pytest.fixture(scope="module")
def journey(tmp_path_factory):
    spans, steps = preempted_journey()
    path = tmp_path_factory.mktemp("journey") / "journey.otlp.jsonl"
    write_lines(path, [*spans, step_span(steps)])
    return path, run([path], scale=Scale(use_cache=False))


def test_each_preemption_with_its_wait_and_the_kv_cache_beside_it(journey):
    _, report = journey
    pre = report.requests.preemptions
    assert (pre.known, pre.requests, pre.count, pre.requeue_ns, pre.lost_tokens) == (3, 2, 3, 90 * MS, 236)
    t0 = vllm_request(0)["arrival"]
    # cmpl-1 arrives at +20 ms, preempted 42 ms later; cmpl-2 at +40 ms, preempted 17 and 47 ms later; a step
    # starts every 5 ms with KV use 0.50 + 0.01 a step: the step started last at or before each preemption
    assert [(w.request_id, w.at_ns - t0, w.requeue_ns, w.step, w.kv_usage) for w in pre.worst] == [
        ("cmpl-2", 87 * MS, 40 * MS, 17, 0.67), ("cmpl-1", 62 * MS, 30 * MS, 12, 0.62),
        ("cmpl-2", 57 * MS, 20 * MS, 11, 0.61)]
    rows = {r.request_id: r for r in report.requests.rows}
    assert (rows["cmpl-1"].preemptions, rows["cmpl-1"].requeue_ns, rows["cmpl-1"].lost_tokens) == (1, 30 * MS, 106)
    assert (rows["cmpl-2"].preemptions, rows["cmpl-2"].requeue_ns, rows["cmpl-2"].lost_tokens) == (2, 60 * MS, 130)


def test_preemption_finding_worth_is_the_e2e_tail_given_back(journey):
    _, report = journey
    found = [f for f in report.findings if f.kind == "preemption"]
    # e2e 42, 102, 122 ms; without the requeue waits 42, 72, 62: p99 by linear interpolation (h = 1.98)
    e2e, without = 102 + 0.98 * 20, 62 + 0.98 * 10
    assert len(found) == 1 and found[0].worth_ns == round((e2e - without) * MS)
    assert found[0].evidence["preemptions"] == 3 and found[0].worth_gpu_ns == 0


def test_max_preemptions_gate(journey):
    path, report = journey
    body = report.to_dict()
    assert gates.check(body, {"max_preemptions": "2"}).gates[0].status == "fail"
    assert gates.check(body, {"max_preemptions": 3}).gates[0].status == "pass"
    assert gates.check({"requests": {"count": 1, "preemptions": None}}, {"max_preemptions": 1}).gates[0].status \
        == "skip"
    cli = [sys.executable, "-m", "pipebubble", "check", str(path), "--no-cache", "--max-preemptions"]
    assert subprocess.run([*cli, "2"], capture_output=True).returncode == 1


def _walk(lines: list[str]) -> dict[str, tuple[int, int, int]]:
    """Independently of the reader: per request id, (preemptions, requeue ns, lost tokens), walking the raw
    OTLP JSON: a core span's events in time order, each PREEMPTED waiting until the next SCHEDULED."""
    spans = [s for line in lines for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    ids = {s["spanId"]: a["value"]["stringValue"] for s in spans for a in s["attributes"]
           if a["key"] == "gen_ai.request.id"}
    out = {}
    for s in spans:
        if s["name"] != "llm_core":
            continue
        events = sorted(s["events"], key=lambda e: int(e["timeUnixNano"]))
        count = wait = lost = 0
        since = None
        for e in events:
            attrs = {a["key"]: int(a["value"]["intValue"]) for a in e["attributes"] if "intValue" in a["value"]}
            if e["name"] == "journey.PREEMPTED":
                count, since = count + 1, int(e["timeUnixNano"])
                lost += attrs.get("prefill.done_tokens", 0) + attrs.get("decode.done_tokens", 0)
            elif e["name"] == "journey.SCHEDULED" and since is not None:
                wait, since = wait + int(e["timeUnixNano"]) - since, None
        out[ids.get(s["spanId"]) or ids[s["parentSpanId"]]] = (count, wait, lost)
    return out


def _random_journey(rng: random.Random, r: dict) -> list[tuple[str, int, dict]]:
    t, done, events = r["arrival"] + 2 * MS, 0, [("QUEUED", r["arrival"] + 2 * MS, {})]
    for _ in range(rng.randrange(4)):
        t += rng.randrange(1, 9) * MS
        events.append(("SCHEDULED", t, {"prefill__done_tokens": done}))
        t += rng.randrange(1, 9) * MS
        done += rng.randrange(1, 50)
        events.append(("PREEMPTED", t, {"prefill__done_tokens": done, "decode__done_tokens": rng.randrange(3)}))
    t += rng.randrange(1, 9) * MS
    events += [("SCHEDULED", t, {}), ("FIRST_TOKEN", t + 3 * MS, {}), ("FINISHED", t + 9 * MS, {})]
    return events


def test_an_independent_walk_of_the_raw_events_agrees(tmp_path):
    rng = random.Random(7)
    sent = [vllm_request(i) for i in range(200)]
    spans = [s for r in sent for s in journey_spans(r, _random_journey(rng, r))]
    path = tmp_path / "random.otlp.jsonl"
    write_lines(path, spans)
    walked = _walk(path.read_text().splitlines())
    table = read_file(path, use_cache=False).requests
    got = {r["request_id"]: (r["preemptions"], r["requeue_ns"], r["lost_tokens"]) for r in table.iter_rows(named=True)}
    assert got == walked and sum(c for c, _, _ in walked.values()) > 100


def _frame(rows: list[dict], schema: dict) -> pl.DataFrame:
    """``rows`` in ``schema``, the columns they do not give null."""
    return conform(pl.DataFrame(rows), schema)


def test_prefill_heavy_steps_in_the_ttft_tail_hand_computed():
    # steps every 10 ms, 2 ms long but the prefill-heavy ones at 10 and 30 ms (8 ms: 6 ms over a median other)
    steps = _frame([{"step": k, "start": 10 * k * MS, "end": (10 * k + (8 if k in (1, 3) else 2)) * MS,
                     "waiting": k, "running": 2, "prefill_tokens": 500 if k in (1, 3) else 0, "decode_tokens": 10,
                     "scheduled_tokens": 510 if k in (1, 3) else 10, "kv_usage": 0.1 * k} for k in range(5)],
                   requests_table.STEP_SCHEMA)
    # A waits 0–15 ms (steps 0, 1), B 5–45 (1–4), C 18–22 (2)
    windows = {"A": (0, 15), "B": (5, 45), "C": (18, 22)}
    rows = _frame([{"request_id": k, "arrival": a * MS, "first_token": f * MS, "ttft_ns": (f - a) * MS,
                    "completion": (f + 1) * MS, "e2e_ns": (f - a + 1) * MS} for k, (a, f) in windows.items()],
                  requests_table.SCHEMA)
    section = summarize(rows, None, None, steps)
    trace = section.step_trace
    assert (trace.steps, trace.prefill_heavy, trace.coverage) == (5, 2, 1.0)
    # TTFT 15, 40, 4 ms: p90 = 15 + 0.8·25 = 35, so the tail is B (2 of its 4 steps heavy), the rest A and C (1 of 3)
    assert trace.ttft_steps["tail"] == {"requests": 1, "steps_per_request": 4.0, "waiting": 2.5, "kv_peak": 0.4,
                                        "prefill_heavy_share": 0.5}
    assert trace.ttft_steps["rest"]["prefill_heavy_share"] == pytest.approx(1 / 3)
    # without the excess: 9, 28, 4 ms; p99 = 9 + 0.98·19
    assert trace.ttft_p99_without_prefill_heavy_ns == pytest.approx((9 + 0.98 * 19) * MS)
    found = preemption_findings.findings(Report(requests=section))
    assert [f.kind for f in found] == ["prefill_heavy_tail"]
    assert found[0].worth_ns == round((15 + 0.98 * 25 - (9 + 0.98 * 19)) * MS)


def test_traced_steps_matched_to_kineto_serving_steps():
    traced = with_heavy(conform(pl.DataFrame({
        "step": [0, 1, 2], "start": [0, 10 * MS, 20 * MS], "end": [2 * MS, 18 * MS, 22 * MS],
        "prefill_tokens": [0, 500, 0], "decode_tokens": [10, 10, 10]}), requests_table.STEP_SCHEMA))
    # Kineto steps of the same engine: the first two overlap traced steps 0 and 1; the third ends before step 2
    kineto = pl.DataFrame({"start": [MS, 11 * MS, 15 * MS], "end": [3 * MS, 17 * MS, 19 * MS],
                           "cls": ["decode", "prefill", "decode"]})
    assert matched(traced, kineto) == {"matched": 2, "steps": 3, "heavy": {"prefill": 1}, "other": {"decode": 1}}
    assert matched(traced, None) is None
