"""Point-to-point sends and receives paired across ranks (``analysis/comm/p2p.py``): each receive's wait for its
peer's send and its transfer, per pair and per stage, the pipeline waits they explain, pairing that does
not depend on the ranks' clocks, and the real CPU pipelines' sends all paired."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import polars as pl
import pytest
from conftest import shared
from p2p_shapes import MS, gpipe_p2p
from shapes import all_to_all

from pipebubble.analysis.comm import p2p as pp
from pipebubble.analysis.job import CommPart
from pipebubble.analysis.pipeline.report import combine
from pipebubble.ingest import read_file
from pipebubble.options import Options, Scale
from pipebubble.render import render
from pipebubble.report import Report
from pipebubble.run import mapper, run, wire

US = 1_000


def analyse(folder) -> Report:
    return run([folder], Options(), Scale(use_cache=False))


def parts_of(folder) -> list[mapper.FilePart]:
    files = sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))
    options = replace(Options(), files=len(files))
    return [mapper.map_spans(read_file(f, i, False), options) for i, f in enumerate(files)]


def job_pairs(folder) -> tuple[pl.DataFrame, dict[str, int]]:
    """The pairs as the reduce makes them, before any window: every file mapped alone."""
    parts = parts_of(folder)
    ops = pl.concat([p.comm.p2p for p in parts])
    _, work, _, _ = combine([p.stages for p in parts if p.stages is not None])
    passes = work.filter((pl.col("role") == "compute") & pl.col("phase").is_not_null())
    return pp.match(ops, pp.stage_of(ops, work), passes)


def two_stages(folder, shift=None):
    return gpipe_p2p(folder, [2 * MS, 1 * MS], [1 * MS, 2 * MS], 2, lead_f={1: 600 * US}, lead_b={0: -50 * US},
                     shift=shift)


def four_stages(folder, shift=None):
    return gpipe_p2p(folder, [2500 * US, 1000 * US, 1500 * US, 1000 * US], [MS] * 4, 3,
                     lead_f={1: 1400 * US, 2: 250 * US, 3: 500 * US}, lead_b={0: 300 * US, 1: 400 * US, 2: -100 * US},
                     shift=shift)


def test_two_stages_wait_and_transfer_per_pair_and_stage(tmp_path):
    pairs, unpaired = job_pairs(two_stages(tmp_path))
    assert unpaired == {}
    rows = sorted(pairs.select("send_who", "recv_who", "seq", "wait", "transfer").iter_rows())
    # forward: each receive began 0.6 ms before its send and ended with it 0.2 ms after the send began;
    # backward: each began 50 µs after its send, so it never waited and transferred for 150 µs
    assert rows == [(0, 1, 0, 600 * US, 200 * US), (0, 1, 1, 600 * US, 200 * US),
                    (1, 0, 0, 0, 150 * US), (1, 0, 1, 0, 150 * US)]
    report = analyse(tmp_path)
    s0, s1 = report.stages
    assert (s0.p2p_wait_ns, s0.p2p_transfer_ns) == (0, 300 * US)
    assert (s1.p2p_wait_ns, s1.p2p_transfer_ns) == (1200 * US, 400 * US)
    assert report.pipeline.p2p == {"pairs": 4, "wait_ns": 1200 * US, "transfer_ns": 700 * US, "unpaired": {}}


def test_four_stages_per_stage_sums_and_upstream_waits(tmp_path):
    report = analyse(four_stages(tmp_path))
    got = [(s.stage, s.p2p_wait_ns, s.p2p_transfer_ns) for s in report.stages]
    # stage 0: 3 gradients, lead 0.3 ms; stage 1: 3 activations (lead 1.4 ms) and 3 gradients (0.4 ms);
    # stage 2: 3 activations (0.25 ms) and 3 gradients that began 0.1 ms late (0.1 ms each); stage 3: 3
    # activations (0.5 ms). Every transfer of a receive that waited is the send's 0.2 ms.
    assert got == [(0, 900 * US, 600 * US), (1, 5400 * US, 1200 * US), (2, 750 * US, 900 * US),
                   (3, 1500 * US, 600 * US)]
    assert report.pipeline.p2p == {"pairs": 18, "wait_ns": 8550 * US, "transfer_ns": 3300 * US, "unpaired": {}}
    # stage 1 finishes a forward 1.5 ms before stage 0 sends the next activation: of the 2 ms gap before its
    # forwards 1 and 2, its receive (posted 0.1 ms into the gap) spun 1.4 ms waiting for rank 0's send
    before_forward = [w for w in report.waits if w.stage == 1 and w.after in ("F1", "F2")]
    assert [(w.cause, w.waited_for, w.dur_ns) for w in before_forward] == [("upstream", 0, 2 * MS)] * 2


def test_pairing_does_not_depend_on_the_clocks(tmp_path):
    plain, _ = job_pairs(four_stages(tmp_path / "plain"))
    shifted, unpaired = job_pairs(four_stages(tmp_path / "shifted", shift={1: 3 * MS}))
    assert unpaired == {}
    key = ["send_who", "recv_who", "seq"]
    assert shifted.height == plain.height == 18
    assert sorted(shifted.select(key).iter_rows()) == sorted(plain.select(key).iter_rows())
    moved = shifted.join(plain, on=key, suffix="_plain")
    # every time of rank 1 moved by 3 ms, and nothing else
    recv_off = moved["recv_start"] - moved["recv_start_plain"]
    send_off = moved["send_start"] - moved["send_start_plain"]
    assert sorted(set(recv_off.to_list()) | set(send_off.to_list())) == [0, 3 * MS]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_real_cpu_pipelines_pair_every_send(schedule):
    folder = shared("pipeline_cpu", schedule)
    sends = recvs = 0
    for path in sorted(folder.glob("rank*.pt.trace.json.gz")):
        with gzip.open(path) as file:
            events = json.load(file)["traceEvents"]
        sends += sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "c10d::send")
        recvs += sum(1 for e in events if e.get("ph") == "X" and e.get("name") == "c10d::recv_")
    assert sends == recvs > 0
    pairs, unpaired = job_pairs(folder)
    assert unpaired == {} and pairs.height == sends
    recv_len = pairs["recv_end"] - pairs["recv_start"]
    assert ((pairs["wait"] + pairs["transfer"]) == recv_len).all()
    assert (pairs["wait"] >= 0).all() and (pairs["transfer"] >= 0).all()
    report = analyse(folder)
    assert report.pipeline.p2p["pairs"] == sends and report.pipeline.p2p["unpaired"] == {}
    assert sum(s.p2p_wait_ns for s in report.stages) == report.pipeline.p2p["wait_ns"]


def test_all_to_all_send_recv_kernels_are_not_point_to_point(tmp_path):
    all_to_all(tmp_path)
    for path in sorted(tmp_path.glob("*.json")):
        spans = read_file(path, 0, False).spans
        assert spans.filter(pl.col("name").str.contains("SendRecv")).height  # the kernels are there
        assert pp.p2p_part(spans).is_empty()
    assert analyse(tmp_path).pipeline is None


def test_real_all_to_all_of_nsight_is_not_point_to_point():
    spans = read_file(shared("nsys", "torchrun_2xh100_nccl.sqlite"), 0, False).spans
    assert spans.filter(pl.col("name") == "ncclSend").height
    assert pp.p2p_part(spans).is_empty()


def test_part_travels_in_the_envelope_and_the_report_round_trips(tmp_path):
    part = parts_of(two_stages(tmp_path))[1]
    assert part.comm.p2p.height == 4  # rank 1: two receives, two sends
    [back] = wire.decode(wire.encode([part]))
    assert back.comm.p2p.equals(part.comm.p2p)
    assert CommPart(pl.DataFrame(), {}).p2p.schema == pl.Schema(pp.SCHEMA)
    report = analyse(tmp_path)
    assert Report.from_dict(report.to_dict()).to_dict() == report.to_dict()
    assert "p2p wait" in render(report, "text", width=200)


def test_map_together_splits_the_operations_by_rank(tmp_path):
    folder = two_stages(tmp_path)
    files = sorted(folder.glob("*.json"))
    options = replace(Options(), files=len(files))
    together = mapper.map_together([read_file(f, i, False) for i, f in enumerate(files)], options)
    alone = parts_of(folder)
    for a, b in zip(together, alone, strict=True):
        assert a.comm.p2p.sort("start").equals(b.comm.p2p.sort("start"))
