"""Collectives across ranks: every real call matched whatever each rank's profile window (a rank that
entered the step late is the one its peers spun longest for), every call accounted for, ranks named as the
job names them (a process where the trace names no ranks, never a pid as a rank), and the evidence's
strength said next to each claim."""

from __future__ import annotations

import gzip
import json

from clock_shapes import cut, load
from conftest import shared
from shapes import ALL_TO_ALL, MS, SEND_RECV_KERNEL, Rank

from pipebubble.options import Options, Scale
from pipebubble.render import render
from pipebubble.run import run


def analyse(*paths, **settings):
    return run(list(paths), Options.from_settings(settings), Scale(use_cache=False))


def late_entry(folder, world: int = 4, late: int = 3, late_ms: float = 7.6, steps: int = 3):
    """Expert parallel: each step every rank computes 1 ms, then all_to_all (0.5 ms once all are in). Rank
    ``late`` entered step 0 ``late_ms`` late: its trace opens at its all_to_all's launch, after its peers'
    all_to_all kernels had started, so they spin ``late_ms`` for it."""
    for r in range(world):
        rank = Rank(r, world)
        for k in range(steps):
            base = MS + 20 * MS * k
            skew = int(late_ms * MS) if k == 0 else 0
            if r != late or k > 0:
                rank.step(k, base - 50_000, 9 * MS)
                rank.kernel("moe_expert_gemm", base, MS)
                arrive = base + MS
            else:
                arrive = base + MS + skew
            rank.kernel(SEND_RECV_KERNEL, arrive, base + MS + skew + MS // 2 - arrive, 20, ALL_TO_ALL)
        rank.write(folder)
    return folder


def test_the_late_ranks_first_call_is_matched_and_its_peers_full_spin_is_the_biggest_wait(tmp_path):
    report = analyse(late_entry(tmp_path))
    c = report.collectives
    assert (c.calls, c.unmatched, c.participant_calls) == (3, 0, 12)
    top = report.waits[:3]
    assert [(w.rank, w.dur_ns, w.waited_for, w.after) for w in top] == [
        (r, 7_600_000, 3, "all_to_all #0") for r in (0, 1, 2)]
    assert (c.worst[0].skew_ns, c.worst[0].last_rank, c.worst[0].seq) == (7_600_000, 3, 0)
    assert c.straggler == 3 and c.ranks[3].late_ns == 3 * 7_600_000
    text = render(report, "text", width=100)
    assert "rank 0   " in text and "all_to_all #0   rank 3" in text


def test_matched_and_left_out_calls_account_for_every_collective_kernel(tmp_path):
    """Rank 3's trace opens after step 0's all_to_all ended on its peers (it holds steps 1 and 2 only):
    step 0's call cannot be in its trace, so its peers' three kernels are left out for that reason."""
    folder = late_entry(tmp_path / "job")
    path = folder / "rank3.json"
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e["ts"] >= 15_000]
    path.write_text(json.dumps(doc))
    c = analyse(folder).collectives
    assert (c.calls, c.left_out, c.participant_calls) == (2, {"outside_window": 3}, 11)
    kernels = sum(1 for p in folder.glob("rank*.json") for e in json.loads(p.read_text())["traceEvents"]
                  if e["cat"] == "kernel" and e["name"].startswith("nccl"))
    assert c.calls * 4 + sum(c.left_out.values()) == kernels == c.participant_calls


def test_a_real_rank_whose_window_opens_mid_call_keeps_the_call_its_peer_spun_longest_in(tmp_path):
    """Real ranks: rank 1 arrived 22.3 ms after rank 0 at an all_reduce. Rank 1's trace cut to open while
    rank 0 was already spinning there (and its kernel's launch cut away): the call is still matched and
    rank 0's spin in it is still the biggest wait, waiting for rank 1."""
    ranks = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    whole = analyse(*ranks)
    worst = whole.collectives.worst[0]
    assert worst.last_rank == 1 and worst.skew_ns > 20 * MS
    at_us = (worst.start_ns + worst.skew_ns // 2) / 1000
    doc = load(ranks[1])
    base = doc.get("baseTimeNanoseconds")
    assert base is None  # the trace's times are absolute µs
    later = cut(ranks[1], tmp_path / ranks[1].name, at_us)
    report = analyse(ranks[0], later)
    c = report.collectives
    assert (c.worst[0].name, c.worst[0].skew_ns, c.worst[0].last_rank) == (worst.name, worst.skew_ns, 1)
    assert report.waits[0].dur_ns == whole.waits[0].dur_ns and report.waits[0].waited_for == 1
    assert c.left_out.get("outside_window", 0) > 0
    counted = sum(1 for p in (ranks[0], later) for e in json.load(gzip.open(p, "rt"))["traceEvents"]
                  if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel"))
    assert c.participant_calls == counted


def test_a_trace_without_ranks_names_processes_never_pids_as_ranks():
    report = analyse(shared("nsys", "torchrun_2xh100_nccl.sqlite"))
    c = report.collectives
    assert [(r.rank, r.pid) for r in c.ranks] == [(None, 144), (None, 145)]
    assert c.straggler is None and c.straggler_pid == 145
    assert all(w.last_rank is None and w.last_pid in (144, 145) for w in c.worst)
    assert all(w.rank is None and w.pid in (144, 145) for w in report.waits)
    assert {b.rank for b in report.breakdown} == {None}
    text = render(report, "text", width=100)
    assert "process 145 arrived last" in text and "rank 144" not in text and "rank 145" not in text


def test_thin_evidence_is_said_next_to_the_claim(tmp_path):
    """Two of a 128-rank job's ranks: the straggler's JSON support says so, and the text says it once."""
    ranks = [shared("kineto", f"recsys_128rank_sampled_rank-{r}.json.gz") for r in (0, 1)]
    report = analyse(*ranks)
    support = report.to_dict()["collectives"]["support"]
    assert support == {"calls": 5, "ranks": 2, "world": 128, "straggler_calls": 5, "thin": True}
    text = render(report, "text", width=100)
    assert text.count("evidence across ranks is thin: 2 of the job's 128 ranks traced") == 1
