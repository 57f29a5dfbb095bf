"""Why a rank is late: ``analysis.rootcause`` on synthetic data-parallel jobs, copies of a real rank's
trace with one copy entering its steps late, and the real two-rank recsys job, each analysed through ``run``
as a user's command does (the late rank's finding carries its verdict); the map's rows and the chain of
waits on their own."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from rootcause_shapes import STEP_MS, copies_entered_late, dp_job
from shapes import MS

from pipebubble import spans as sp
from pipebubble.analysis.comm import collectives, p2p
from pipebubble.analysis.rootcause import chain, part
from pipebubble.analysis.rootcause.result import late_ranks
from pipebubble.options import Options, Scale
from pipebubble.report import Finding
from pipebubble.run import run

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "kineto"
LATE = ("late_rank", "data_loader")


def late(paths: list[Path]) -> list[Finding]:
    """The late ranks' findings of the job, as ``pipebubble analyze`` reports them."""
    report = run(paths, Options(), Scale(use_cache=False))
    return [f for f in report.findings if f.kind in LATE]


def test_data_loader_names_the_rank_and_its_loader(tmp_path):
    """4 ranks; rank 2's loader takes 3 ms longer every step: its peers wait 3 ms at each all-reduce, the
    step time a faster loader gives back."""
    (found,) = late(dp_job(tmp_path, loader_ms={2: 3.0}))
    assert (found.kind, found.cause, found.where.ranks) == ("data_loader", "data_loader", [2])
    e = found.evidence
    assert e["steps"] == [0, 1, 2] and e["worth_ns_per_step"] == [3 * MS] * 3 and e["late_ns"] == [3 * MS] * 3
    assert e["entered_late_ns"] == [0] * 3 and e["excess_ns"]["loader"] == 9 * MS
    assert found.worth_ns == 3 * MS and found.worth_gpu_ns == 12 * MS and e["step_ns"] <= STEP_MS * MS
    assert "data loader" in found.title


def test_synthetic_rank_entering_late(tmp_path):
    """Rank 1 starts every step 4 ms late, otherwise like its peers: entered late, nothing inside."""
    (found,) = late(dp_job(tmp_path, enter_ms={1: 4.0}))
    assert (found.kind, found.cause, found.where.ranks) == ("late_rank", "entered_late", [1])
    e = found.evidence
    assert e["entered_late_ns"] == [4 * MS] * 3 and e["inside_ns"] == [0] * 3 and e["worth_ns_per_step"] == [4 * MS] * 3
    assert "before the step" in found.title and "capture more steps" in found.action


def shifted(path: Path, offset_ns: int) -> None:
    """``path``'s clock moved by ``offset_ns`` (every event's time), as a host whose clock is off records."""
    doc = json.loads(path.read_text())
    for event in doc["traceEvents"]:
        event["ts"] += offset_ns / 1000
    path.write_text(json.dumps(doc))


def test_wrong_clocks_taken_off_give_the_same_answer(tmp_path):
    """Files whose clocks are 7 ms and -3 ms off: the job's clock taken from the collectives puts them back,
    and the late rank's verdict is the same."""
    same = late(dp_job(tmp_path / "same", loader_ms={2: 3.0}))
    paths = dp_job(tmp_path / "moved", loader_ms={2: 3.0})
    shifted(paths[2], 7 * MS)
    shifted(paths[0], -3 * MS)
    assert late(paths) == same


def test_no_late_rank_when_all_arrive_together(tmp_path):
    assert late(dp_job(tmp_path)) == []


@pytest.mark.skipif(not TRACES.is_dir(), reason="the shared real traces are absent")
def test_real_copies_one_entering_late(tmp_path):
    """ResNet DDP rank 0 (a real A100 trace) copied into 4 ranks, copy 2 entering each of its 3 steps 5 ms
    late: it is named, late through entering, not inside; its peers wait 5 ms a step at the step's first
    collective (a broadcast)."""
    paths = copies_entered_late(TRACES / "resnet_ddp_a100_nccl_rank0.json.gz", tmp_path, late=2, delay_us=5_000)
    (found,) = late(paths)
    assert (found.kind, found.cause, found.where.ranks) == ("late_rank", "entered_late", [2])
    e = found.evidence
    assert len(e["steps"]) == 3
    assert all(abs(x - 5 * MS) <= 2_000 for x in e["entered_late_ns"])
    assert all(i <= 0.05 * x for i, x in zip(e["inside_ns"], e["entered_late_ns"], strict=True))
    assert all(abs(w - 5 * MS) <= 2_000 for w in e["worth_ns_per_step"])
    assert "enters its steps late" in found.title


@pytest.mark.skipif(not TRACES.is_dir(), reason="the shared real traces are absent")
def test_real_recsys_rank_late_inside_its_step():
    """The real two-rank recsys job: rank 1 arrives last at every matched call, late inside its steps (it
    entered them 0.2 ms after rank 0), not by entering late."""
    (found,) = late([TRACES / f"recsys_128rank_sampled_rank-{k}.json.gz" for k in (0, 1)])
    assert found.where.ranks == [1] and found.cause != "entered_late"
    assert sum(found.evidence["inside_ns"]) > 10 * sum(found.evidence["entered_late_ns"])


def test_empty_and_one_span_tables():
    """The map on tables without communication gives no rows; the reduce of nothing, no late rank."""
    one = sp.conform(pl.DataFrame({"kind": ["kernel"], "name": ["k"], "start": [0], "end": [5], "rank": [0],
                                   "device": [0], "lane": ["rank0/gpu0"]}))
    for spans in (sp.empty(), one):
        calls, _ = collectives.collective_part(spans)
        assert part.windows(spans, calls, p2p.p2p_part(spans)).is_empty()
    assert late_ranks(part.empty(), collectives.match(collectives.collective_part(one)[0])[0], None) == []


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
