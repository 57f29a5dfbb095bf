"""Why a rank is late: ``analysis.rootcause`` on synthetic data-parallel jobs, copies of a real rank's
trace with one copy entering its steps late, and the real two-rank recsys job."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from rootcause_shapes import STEP_MS, copies_entered_late, dp_job
from shapes import MS

from pipebubble import spans as sp
from pipebubble.analysis.comm import collectives, p2p
from pipebubble.analysis.rootcause import chain, findings, part
from pipebubble.analysis.rootcause.result import late_ranks
from pipebubble.ingest import read_file

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "kineto"


def _parts(paths: list[Path], offsets: dict[int, int] | None = None):
    """Each file mapped (collective calls, p2p operations, windows), its times moved by ``offsets[k]`` ns as
    a wrong clock would, then taken back off as the reduce's alignment does: the windows and the matched
    collectives on the job's clock."""
    calls, windows, ops = [], [], []
    for k, path in enumerate(paths):
        spans = read_file(path, use_cache=False).spans
        off = (offsets or {}).get(k, 0)
        spans = spans.with_columns(pl.col("start") + off, pl.col("end") + off)
        own, _ = collectives.collective_part(spans)
        mine = p2p.p2p_part(spans)
        win = part.windows(spans, own, mine)
        back = [pl.col(c) - off for c in ("start", "end")]
        calls.append(own.with_columns(back))
        ops.append(mine.with_columns(back))
        windows.append(win.with_columns(pl.col(c) - off for c in ("origin", "arrival", "end")))
    matched, _ = collectives.match(pl.concat(calls))
    return pl.concat(windows), matched, p2p.match(pl.concat(ops))[0]


def test_data_loader_names_the_rank_and_its_loader(tmp_path):
    """4 ranks; rank 2's loader takes 3 ms longer every step: its peers wait 3 ms at each all-reduce, the
    step time a faster loader gives back."""
    windows, matched, pairs = _parts(dp_job(tmp_path, loader_ms={2: 3.0}))
    late = late_ranks(windows, matched, pairs)
    assert [r.rank for r in late] == [2]
    r = late[0]
    assert r.cause == "data_loader" and r.steps == [0, 1, 2]
    assert r.worth_ns == [3 * MS] * 3 and r.late_ns == [3 * MS] * 3 and r.entered_late_ns == [0] * 3
    assert r.evidence["excess_ns"]["loader"] == 9 * MS
    (found,) = findings.findings(late, step_ns=STEP_MS * MS, gpus=4)
    assert found.kind == "data_loader" and found.where.ranks == [2]
    assert found.worth_ns == 3 * MS and found.worth_gpu_ns == 12 * MS
    assert "data loader" in found.title


def test_synthetic_rank_entering_late(tmp_path):
    """Rank 1 starts every step 4 ms late, otherwise like its peers: entered late, nothing inside."""
    windows, matched, pairs = _parts(dp_job(tmp_path, enter_ms={1: 4.0}))
    (r,) = late_ranks(windows, matched, pairs)
    assert (r.rank, r.cause) == (1, "entered_late")
    assert r.entered_late_ns == [4 * MS] * 3 and r.inside_ns == [0] * 3 and r.worth_ns == [4 * MS] * 3
    (found,) = findings.findings([r], step_ns=STEP_MS * MS)
    assert found.kind == "late_rank" and "before the step" in found.title and "capture more steps" in found.action


def test_wrong_clocks_taken_off_give_the_same_answer(tmp_path):
    """A file whose clock is 7 ms off, moved back by its offset before the reduce: the windows' four
    times are the ones to shift."""
    paths = dp_job(tmp_path, loader_ms={2: 3.0})
    same = late_ranks(*_parts(paths))
    moved = late_ranks(*_parts(paths, {2: 7 * MS, 0: -3 * MS}))
    assert moved == same


def test_no_late_rank_when_all_arrive_together(tmp_path):
    windows, matched, pairs = _parts(dp_job(tmp_path))
    assert late_ranks(windows, matched, pairs) == []


@pytest.mark.skipif(not TRACES.is_dir(), reason="the shared real traces are absent")
def test_real_copies_one_entering_late(tmp_path):
    """ResNet DDP rank 0 (a real A100 trace) copied into 4 ranks, copy 2 entering each of its 3 steps 5 ms
    late: it is named, late through entering, not inside; its peers wait 5 ms a step at the step's first
    collective (a broadcast)."""
    paths = copies_entered_late(TRACES / "resnet_ddp_a100_nccl_rank0.json.gz", tmp_path, late=2, delay_us=5_000)
    windows, matched, pairs = _parts(paths)
    late = late_ranks(windows, matched, pairs)
    assert [r.rank for r in late] == [2]
    r = late[0]
    assert r.cause == "entered_late" and len(r.steps) == 3
    assert all(abs(e - 5 * MS) <= 2_000 for e in r.entered_late_ns)
    assert all(i <= 0.05 * e for i, e in zip(r.inside_ns, r.entered_late_ns, strict=True))
    assert all(abs(w - 5 * MS) <= 2_000 for w in r.worth_ns)
    (found,) = findings.findings(late, step_ns=220 * MS, gpus=4)
    assert found.kind == "late_rank" and found.where.ranks == [2] and "enters its steps late" in found.title


@pytest.mark.skipif(not TRACES.is_dir(), reason="the shared real traces are absent")
def test_real_recsys_rank_late_inside_its_step():
    """The real two-rank recsys job: rank 1 arrives last at every matched call, late inside its steps (it
    entered them 0.2 ms after rank 0), not by entering late."""
    paths = [TRACES / f"recsys_128rank_sampled_rank-{k}.json.gz" for k in (0, 1)]
    late = late_ranks(*_parts(paths))
    assert [r.rank for r in late] == [1]
    r = late[0]
    assert r.cause != "entered_late"
    assert sum(r.inside_ns) > 10 * sum(r.entered_late_ns)


def test_empty_and_one_span_tables():
    """The map on tables without communication gives no rows; the reduce of nothing, no late rank."""
    one = sp.conform(pl.DataFrame({"kind": ["kernel"], "name": ["k"], "start": [0], "end": [5], "rank": [0],
                                   "device": [0], "lane": ["rank0/gpu0"]}))
    for spans in (sp.empty(), one):
        calls, _ = collectives.collective_part(spans)
        assert part.windows(spans, calls, p2p.p2p_part(spans)).is_empty()
    assert late_ranks(part.empty(), collectives.match(collectives.collective_part(one)[0])[0]) == []


def test_chain_follows_a_receive_to_the_sender():
    """Rank 3 arrives 3 ms late at its group's all-reduce after its receive spun 3 ms for rank 1's send:
    the chain names rank 1 and what it did before its send (its loader, more than anything else)."""
    zeros = {f"{at}_{c}": 0 for at in ("a", "e") for c in part.CLASSES}
    send = {**zeros, "who": 1, "step": 0, "kind": "send", "seq": 0, "peer": 3, "origin": 0, "arrival": 5 * MS,
            "end": 6 * MS, "gpu": True, "a_loader": 4 * MS, "a_idle": 4 * MS, "a_compute": MS}
    windows = pl.DataFrame([send], schema=part.SCHEMA)
    matched = pl.DataFrame({"group": [1, 1], "kind": ["all_reduce"] * 2, "call": [0, 0], "seq": [0, 0],
                            "who": [2, 3], "start": [8 * MS, 11 * MS], "last_who": [3, 3], "wait": [3 * MS, 0]})
    pairs = pl.DataFrame({"send_who": [1], "recv_who": [3], "seq": [0], "send_start": [5 * MS],
                          "recv_start": [2 * MS], "wait": [3 * MS]})
    (link,) = chain.follow(3, 0, 11 * MS, matched, pairs, matched.clear(), windows)
    assert (link.waiter, link.rank, link.at, link.waited_ns, link.cause) == (3, 1, "recv #0", 3 * MS, "data_loader")
