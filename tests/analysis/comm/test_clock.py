"""One clock for the job: each file's offset estimated from the job (collective ends, dependent passes),
taken off before anything crosses ranks. Jobs built from real traces (moved as a second host's clock moves
them) and synthetic ones must give the same calls, waits, straggler, bubble and causes as unmoved, with
offsets that match the move."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from clock_shapes import job
from conftest import SHARED_TRACES, shared
from shapes import data_parallel
from synth import simulate, write_pipeline

from pipebubble.analysis.comm import clock
from pipebubble.options import Options, Scale
from pipebubble.run import run

MS = 1_000_000


def analyse(*paths, **settings):
    return run(list(paths), Options.from_settings(settings), Scale(use_cache=False))


def offsets(report) -> list[int]:
    return [o.offset_ns for o in report.ingest.clock_offsets]


def waits_by_rank(report) -> dict[int, int]:
    return {r.rank: r.wait_ns for r in report.collectives.ranks}


def close(a: int, b: int) -> bool:
    """Within 2 % or 50 µs."""
    return abs(a - b) <= max(50_000, 0.02 * max(abs(a), abs(b)))


# --- the solver on hand-made evidence ---


def test_solver_puts_each_tree_on_the_clock_most_of_its_files_share():
    """Files 0, 1 and 3 share a clock; file 2 runs 3 ms ahead of them: only file 2 moves."""
    edges = [clock.Edge(0, 1, 0, 10, "collectives"), clock.Edge(0, 2, 3 * MS, 10, "collectives"),
             clock.Edge(0, 3, 4_000, 10, "collectives")]
    found, problems = clock.solve(edges, 4)
    assert [c.offset for c in found] == [0, 0, 3 * MS, 0] and problems == []


def test_solver_follows_the_majority_when_the_first_file_is_the_one_moved():
    edges = [clock.Edge(0, 1, -2 * MS, 10, "collectives"), clock.Edge(0, 2, -2 * MS, 10, "collectives")]
    found, _ = clock.solve(edges, 3)
    assert [c.offset for c in found] == [2 * MS, 0, 0]


def test_an_offset_within_the_noise_of_its_measurement_is_no_offset():
    """30 µs measured from 4 calls that scatter by 40 µs: not told apart from 0."""
    found, _ = clock.solve([clock.Edge(0, 1, 30_000, 4, "collectives", residual=40_000)], 2)
    assert [c.offset for c in found] == [0, 0]
    found, _ = clock.solve([clock.Edge(0, 1, 300_000, 4, "collectives", residual=40_000)], 2)
    assert [c.offset for c in found] == [0, 300_000]


def test_contradicting_evidence_is_said_and_not_guessed():
    """Collectives say file 1 is 3 ms ahead of file 0 and file 2 level with it; the sends say file 2 is 5 ms
    ahead of file 1: no single offset per file explains both, so none is applied."""
    edges = [clock.Edge(0, 1, 3 * MS, 9, "collectives"), clock.Edge(0, 2, 0, 9, "collectives"),
             clock.Edge(1, 2, 5 * MS, 9, "send_recv")]
    found, problems = clock.solve(edges, 3, ["rank 0", "rank 1", "rank 2"])
    assert [c.offset for c in found] == [0, 0, 0] and all(c.problem for c in found)
    assert len(problems) == 1 and "rank 1 and rank 2" in problems[0]


def test_drifting_clocks_are_said_and_not_guessed():
    found, problems = clock.solve([clock.Edge(0, 1, 2 * MS, 20, "collectives", residual=1_000, drift=400_000)], 2)
    assert [c.offset for c in found] == [0, 0] and "drift" in problems[0]


def test_pass_bounds_keep_recorded_clocks_that_satisfy_them_and_else_take_the_nearest_bound():
    passes = pl.DataFrame(
        {"file": [0, 1, 0, 1], "stage": [0, 1, 0, 1], "phase": ["forward", "forward", "backward", "backward"],
         "step": [0] * 4, "microbatch": [0] * 4,
         # forward: stage 1 starts 1 ms after stage 0 ended; backward: stage 0 starts 2 ms after stage 1 ended
         "start": [0, 11 * MS, 40 * MS, 20 * MS], "end": [10 * MS, 20 * MS, 50 * MS, 38 * MS]})
    (edge,) = clock.pass_edges(passes)
    assert (edge.low, edge.high, edge.offset) == (-2 * MS, 1 * MS, 0)
    ahead = passes.with_columns(pl.when(pl.col("file") == 1).then(pl.col(c) + 5 * MS).otherwise(c) for c in
                                ("start", "end"))
    (edge,) = clock.pass_edges(ahead)
    assert (edge.low, edge.high, edge.offset) == (3 * MS, 6 * MS, 3 * MS)


def test_collective_ends_vote_for_the_offset_not_for_a_neighbouring_call():
    """Calls every 10 ms; file 1's trace opens one call later and its clock is 2.5 ms behind. Pairing each
    call with the nearest end would find −2.5 ms; pairing by order, +7.5 ms."""
    ends = [k * 10 * MS for k in range(8)]
    calls = pl.DataFrame({"file": [0] * 8 + [1] * 7, "group": [0] * 15, "kind": ["all_reduce"] * 15,
                          "end": ends + [e - 2_500_000 + 7 for e in ends[1:]]})
    (edge,) = clock.collective_edges(calls)
    assert (edge.a, edge.b, edge.offset, edge.support) == (0, 1, -2_500_000 + 7, 7)


# --- whole jobs, moved ---


@pytest.mark.parametrize("move", [2_500_000, -2_500_000, 7_300_000])
def test_a_data_parallel_job_with_half_its_ranks_moved_gives_the_same_collectives(tmp_path, move):
    base = data_parallel(tmp_path / "base", [2, 2, 3, 5], steps=3)
    files = sorted(base.glob("rank*.json"))
    moved = job(tmp_path / "moved", files, {2: move, 3: move})
    a, b = analyse(base), analyse(moved)
    assert offsets(a) == [0, 0, 0, 0] and not any(n.startswith("clocks:") for n in a.notes)
    assert offsets(b) == [0, 0, move, move]
    assert (b.collectives.calls, b.collectives.unmatched, b.collectives.straggler) == (3, 0, 3)
    assert waits_by_rank(a) == waits_by_rank(b)
    assert [(w.rank, w.dur_ns, w.waited_for) for w in a.waits] == [(w.rank, w.dur_ns, w.waited_for) for w in b.waits]
    assert any(n.startswith("clocks: 2 of 4 files put on the job's clock") for n in b.notes)


def test_no_align_keeps_the_recorded_clocks_and_says_what_it_found(tmp_path):
    base = data_parallel(tmp_path / "base", [2, 2, 3, 5], steps=3)
    moved = job(tmp_path / "moved", sorted(base.glob("rank*.json")), {3: 2_500_000})
    report = analyse(moved, align=False)
    assert offsets(report) == [0, 0, 0, 2_500_000] and not any(o.aligned for o in report.ingest.clock_offsets)
    assert any("kept as recorded (--no-align)" in n for n in report.notes)


RECSYS = sorted((SHARED_TRACES / "kineto").glob("recsys_128rank_sampled_rank-*.json.gz"))


@pytest.mark.parametrize("move", [3_700_000, -2_500_000])
def test_real_ranks_on_a_second_host_give_the_same_calls_waits_and_straggler(tmp_path, move):
    """Two real ranks of a 128-rank job, the second's clock moved as another host's would be."""
    shared("kineto", "recsys_128rank_sampled_rank-0.json.gz")
    a = analyse(*RECSYS)
    b = analyse(job(tmp_path / "moved", RECSYS, {1: move}))
    assert all(abs(o) <= 50_000 for o in offsets(a))
    assert offsets(b)[0] == 0 and abs(offsets(b)[1] - move) <= 0.05 * abs(move)
    ca, cb = a.collectives, b.collectives
    assert (cb.calls, cb.straggler) == (ca.calls, ca.straggler) == (5, 1)
    assert all(close(waits_by_rank(a)[r], waits_by_rank(b)[r]) for r in (0, 1))
    assert [w.after for w in ca.worst] == [w.after for w in cb.worst] if hasattr(ca.worst[0], "after") else True
    assert [(w.name, w.seq, w.last_rank) for w in ca.worst] == [(w.name, w.seq, w.last_rank) for w in cb.worst]


@pytest.mark.parametrize("moves", [{1: 3 * MS, 3: -2 * MS}, {2: -4 * MS}])
def test_a_synthetic_pipeline_with_stages_moved_gives_the_same_bubble_and_causes(tmp_path, moves):
    sim = simulate("1f1b", 4, 8, [MS, MS, 2 * MS, MS], [2 * MS] * 4)
    base = write_pipeline(tmp_path / "base", sim)
    moved = job(tmp_path / "moved", sorted(base.glob("rank*.json")), moves)
    a, b = analyse(base), analyse(moved)
    assert offsets(a) == [0, 0, 0, 0]
    assert offsets(b) == [moves.get(k, 0) for k in range(4)]
    assert abs(a.pipeline.bubble_fraction - b.pipeline.bubble_fraction) <= 0.005
    assert Counter((w.stage, w.cause) for w in a.waits) == Counter((w.stage, w.cause) for w in b.waits)


@pytest.mark.parametrize("name", ["gpipe", "interleaved1f1b"])
def test_a_real_pipeline_with_stages_moved_gives_the_same_bubble_and_causes(tmp_path, name):
    """torch.distributed.pipelining on 4 CPU ranks; ranks 1 and 3 moved by +3 and −2 ms. Pass order bounds
    each offset (the forward side tightly): within 0.5 ms here, the bubble within 0.5 points."""
    folder = shared("pipeline_cpu", name)
    files = sorted(folder.glob("rank*.json.gz"))
    a, b = analyse(folder), analyse(job(tmp_path / name, files, {1: 3 * MS, 3: -2 * MS}))
    assert offsets(a) == [0, 0, 0, 0]
    assert all(abs(o - e) <= MS // 2 for o, e in zip(offsets(b), [0, 3 * MS, 0, -2 * MS], strict=True))
    assert abs(a.pipeline.bubble_fraction - b.pipeline.bubble_fraction) <= 0.005
    share_a, share_b = cause_shares(a), cause_shares(b)
    assert set(share_a) == set(share_b)
    assert all(abs(share_a[c] - share_b[c]) <= 0.02 for c in share_a), (share_a, share_b)


def cause_shares(report) -> dict[str, float]:
    """Each cause's share of the time waited (a wait near the threshold may come or go with a few µs)."""
    total = sum(w.dur_ns for w in report.waits)
    shares = Counter()
    for w in report.waits:
        shares[w.cause] += w.dur_ns / total
    return dict(shares)


def test_offsets_are_in_the_json_under_keys_naming_them(tmp_path):
    base = data_parallel(tmp_path / "base", [2, 5], steps=2)
    report = analyse(job(tmp_path / "moved", sorted(base.glob("rank*.json")), {1: 1_200_000}))
    rows = report.to_dict()["ingest"]["clock_offsets"]
    assert [(Path(r["source"]).name, r["rank"], r["offset_ns"], r["evidence"], r["aligned"]) for r in rows] == [
        ("rank0.json", 0, 0, "collectives", True), ("rank1.json", 1, 1_200_000, "collectives", True)]
