"""`diff` of the same job recorded again under other CUDA stream ids: streams whose ids differ match by their
order of first use within each GPU, so nothing is "only in one report" and ``--strict`` passes; a stream that
really got slower still regresses, named as in the baseline; a stream only one report has stays unmatched."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import shared

from pipebubble import cli
from pipebubble.gates import diff, paired_names

GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "ac2g"}
RESNET = ("kineto", "resnet_ddp_a100_nccl_rank0.json.gz")  # streams 7 (compute) and 40 (NCCL)
RECSYS = [("kineto", f"recsys_128rank_sampled_rank-{rank}.json.gz") for rank in (0, 1)]
# new ids in the reverse order of the old ones, so matching by id order would pair them wrongly
RESNET_IDS = {7: 41, 40: 9}
RECSYS_IDS = [{7: 300, 23: 250, 25: 210, 84: 90, 203: 13}, {7: 301, 23: 251, 25: 211, 84: 91, 203: 14}]


def renumbered(source: Path, target: Path, ids: dict[int, int], longer: dict[int, float] | None = None) -> Path:
    """``source`` with the streams of its GPU events renumbered by ``ids`` (their ``tid``, ``args.stream`` and
    the stream's thread name); ``longer``: old stream id -> factor its kernels' durations are multiplied by."""
    trace = json.loads(gzip.decompress(source.read_bytes()))
    events = trace["traceEvents"]
    gpus = {e["pid"] for e in events if str(e.get("cat", "")).lower() in GPU_CATEGORIES}
    moved = []
    for event in events:
        if event.get("pid") in gpus and event.get("tid") in ids:
            old = event["tid"]
            event = {**event, "tid": ids[old], "args": dict(event.get("args") or {})}
            if event["args"].get("stream") == old:
                event["args"]["stream"] = ids[old]
            if event.get("name") == "thread_name":
                event["args"]["name"] = f"stream {ids[old]} "
            if (longer or {}).get(old) and event.get("cat") == "kernel":
                event["dur"] = event["dur"] * longer[old]
        moved.append(event)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(gzip.compress(json.dumps({**trace, "traceEvents": moved}).encode(), mtime=0))
    return target


def invoke(capsys, monkeypatch, tmp_path, *args) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)  # no config file of this project applies
    with pytest.raises(SystemExit) as done:
        cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return done.value.code, out, err


def saved(capsys, monkeypatch, tmp_path, source: Path, name: str) -> Path:
    report = tmp_path / name
    code, _, err = invoke(capsys, monkeypatch, tmp_path, "analyze", source, "--format", "json", "-o", report)
    assert code == 0, err
    return report


def recsys_pair(tmp_path: Path, longer: dict[int, float] | None = None) -> tuple[Path, Path]:
    """The two ranks as recorded (a folder of their own) and again under other stream ids."""
    base, new = tmp_path / "base", tmp_path / "again"
    base.mkdir()
    for parts, ids in zip(RECSYS, RECSYS_IDS, strict=True):
        path = shared(*parts)
        shutil.copy(path, base / path.name)
        renumbered(path, new / path.name, ids, longer)
    return base, new


def expected_pairs(ids: dict[int, int], rank: int = 0, device: int = 0) -> set[tuple[str, str]]:
    gpu = f"rank{rank}/gpu{device}"
    return {(f"{gpu}/stream{old}", f"{gpu}/stream{new}") for old, new in ids.items()}


def test_a_real_trace_with_renumbered_streams_diffs_clean_with_strict(capsys, monkeypatch, tmp_path):
    source = shared(*RESNET)
    again = renumbered(source, tmp_path / "again" / source.name, RESNET_IDS)
    base = saved(capsys, monkeypatch, tmp_path, source, "base.json")
    new = saved(capsys, monkeypatch, tmp_path, again, "new.json")
    code, out, err = invoke(capsys, monkeypatch, tmp_path, "diff", base, new, "--strict", "--tolerance", "0%")
    assert code == 0, out + err
    assert "only in" not in out + err and "not comparable" not in out
    note = [line for line in out.splitlines() if "matched by order of first use" in line]
    assert note == ["note: 2 GPU stream(s) matched by order of first use (their numbers differ): "
                    "rank0/gpu0/stream7 as stream41, rank0/gpu0/stream40 as stream9"], out
    code, out, _ = invoke(capsys, monkeypatch, tmp_path, "diff", base, new, "--strict", "--format", "json")
    body = json.loads(out)
    assert code == 0 and body["unmatched"] == [] and not body["failed"]
    assert {(p["base"], p["new"]) for p in body["streams_matched_by_order"]} == expected_pairs(RESNET_IDS)
    lanes = {d["key"] for d in body["deltas"] if d["key"].startswith("lanes[")}
    assert {"lanes[rank0/gpu0/stream7].busy_ns", "lanes[rank0/gpu0/stream40].busy_ns"} <= lanes


def test_two_ranks_with_renumbered_streams_match_every_stream_of_each_rank(capsys, monkeypatch, tmp_path):
    source, again = recsys_pair(tmp_path)
    base = saved(capsys, monkeypatch, tmp_path, source, "base.json")
    code, out, err = invoke(capsys, monkeypatch, tmp_path, "diff", base, again, "--strict", "--tolerance", "0%",
                            "--format", "json")
    body = json.loads(out)
    assert code == 0 and body["unmatched"] == [] and body["regressions"] == [], err
    pairs = {(p["base"], p["new"]) for p in body["streams_matched_by_order"]}
    assert pairs == expected_pairs(RECSYS_IDS[0], 0, 0) | expected_pairs(RECSYS_IDS[1], 1, 1)  # rank 1 on GPU 1


def test_a_renumbered_stream_that_got_slower_still_regresses(capsys, monkeypatch, tmp_path):
    source, again = recsys_pair(tmp_path, longer={23: 3.0})
    code, out, err = invoke(capsys, monkeypatch, tmp_path, "diff", source, again, "--strict", "--format", "json")
    body = json.loads(out)
    assert code == 1 and body["unmatched"] == [], err
    assert "lane rank0/gpu0/stream23 busy" in body["regressions"]
    assert not any("stream250" in name or "stream251" in name for name in body["regressions"])
    untouched = {d["metric"]: d for d in body["deltas"]}["lane rank0/gpu0/stream7 busy"]
    assert untouched["base"] == untouched["new"]


# ---- synthetic reports --------------------------------------------------------------------------------------


def lane(stream: int | None, start: int, device: int = 0, rank: int | None = 0, busy: int = 100) -> dict:
    where = f"rank{rank}/" if rank is not None else ""
    return {"lane": f"{where}gpu{device}" + (f"/stream{stream}" if stream is not None else ""), "kind": "gpu",
            "rank": rank, "pid": None, "tid": None, "device": device, "stream": stream, "busy_ns": busy,
            "idle_ns": 1000 - busy, "window_start_ns": start, "window_end_ns": 1000}


def gpu_report(*streams: tuple[int, int], busy: dict[int, int] | None = None) -> dict:
    """One GPU of rank 0 with (stream id, first use) streams, a wait on each stream and a collective."""
    busy = busy or {}
    lanes = [lane(None, 0), *(lane(s, start, busy=busy.get(s, 100)) for s, start in streams)]
    waits = [{"stage": None, "start_ns": start + 10, "dur_ns": 50, "cause": "sync", "before": None, "after": None,
              "step": None, "lane": f"rank0/gpu0/stream{s}", "rank": 0, "waited_for": None} for s, start in streams]
    return {"lanes": lanes, "waits": waits}


def test_an_extra_stream_is_only_in_one_report_and_the_rest_match_in_order():
    base = gpu_report((7, 0), (20, 100))
    new = gpu_report((28, 100), (13, 0), (35, 200))  # listed out of order: the first use decides
    result = diff(base, new, 0.0, strict=True)
    assert result.streams == [("rank0/gpu0/stream7", "rank0/gpu0/stream13"),
                              ("rank0/gpu0/stream20", "rank0/gpu0/stream28")]
    assert result.unmatched == ["1 lane(s) only in the new report: rank0/gpu0/stream35"] and result.failed
    keys = {d.key for d in result.deltas}
    assert {"lanes[rank0/gpu0/stream7].busy_ns", "lanes[rank0/gpu0/stream20].busy_ns"} <= keys
    # the waits on a stream pair by the base's name; the extra stream's wait has none to pair with
    waits = {d.metric: (d.base, d.new) for d in result.deltas if d.key.startswith("waits")}
    assert waits == {f"wait rank0/gpu0/stream{s} sync (- → -)": pair for s, pair in
                     ((7, (50, 50)), (20, (50, 50)), (35, (0, 50)))}


def test_a_stream_id_in_both_reports_matches_itself_and_only_the_others_go_by_order():
    base = gpu_report((7, 0), (20, 100), (22, 300))
    new = gpu_report((9, 50), (7, 120), (30, 200))  # 7 is in both, first used later than 9 in the new report
    names = paired_names(base["lanes"], new["lanes"])
    assert names[2] == [("rank0/gpu0/stream20", "rank0/gpu0/stream9"), ("rank0/gpu0/stream22", "rank0/gpu0/stream30")]
    assert names[1]["rank0/gpu0/stream7"] == "rank0/gpu0/stream7"
    assert names[1]["rank0/gpu0/stream9"] == "rank0/gpu0/stream20"


def test_streams_match_within_their_gpu_ties_by_id_and_rankless_gpus_too():
    base = {"lanes": [lane(3, 0, device=0, rank=None), lane(5, 0, device=0, rank=None),
                      lane(3, 10, device=1, rank=None)]}
    new = {"lanes": [lane(8, 0, device=0, rank=None), lane(6, 0, device=0, rank=None)]}  # tie: 6 before 8
    result = diff(base, new, 0.0)
    assert result.streams == [("gpu0/stream3", "gpu0/stream6"), ("gpu0/stream5", "gpu0/stream8")]
    assert result.unmatched == ["1 lane(s) only in the base report: gpu1/stream3"]


def test_a_slower_stream_matched_by_order_regresses_under_the_baseline_name():
    base = gpu_report((7, 0), (20, 100))
    new = gpu_report((13, 0), (28, 100), busy={28: 300})
    result = diff(base, new, 0.05, strict=True)
    assert [d.metric for d in result.regressions] == ["lane rank0/gpu0/stream20 busy"]
    assert [d.metric for d in result.improvements] == ["lane rank0/gpu0/stream20 idle"]
    assert not result.unmatched


def test_reports_with_the_same_stream_ids_say_nothing_of_matching():
    base = gpu_report((7, 0), (20, 100))
    result = diff(base, gpu_report((20, 0), (7, 100)), 0.0)
    assert result.streams == [] and not any("matched by order" in n for n in result.notes)
