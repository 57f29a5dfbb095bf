"""Completeness is part of every gate: a job with one rank file cut off mid-write (a profiler that crashed, a
disk that filled up) fails ``check`` and ``diff`` in every gate format, naming the file, unless
``--allow-partial``; ranks missing against ``world_size`` are a gap too; and a diff over an incomplete input
never calls a change an improvement."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from conftest import shared

from pipebubble import cli
from pipebubble.gates import check, diff
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "sample_traces" / "pipeline_1f1b"
CUT = "rank1.pt.trace.json.gz"


@pytest.fixture
def cut_job(tmp_path) -> Path:
    """The 4-rank sample job with rank 1's file cut in half."""
    folder = tmp_path / "cut"
    shutil.copytree(PIPELINE, folder)
    path = folder / CUT
    data = gzip.decompress(path.read_bytes())
    path.write_bytes(gzip.compress(data[: len(data) // 2]))
    return folder


def invoke(capsys, monkeypatch, tmp_path, *args) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return done.value.code, out, err


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "github", "markdown"])
def test_check_fails_on_a_cut_off_file_in_every_format(cut_job, capsys, monkeypatch, tmp_path, fmt):
    code, out, err = invoke(capsys, monkeypatch, tmp_path, "check", cut_job, "--max-bubble", "0.95", "--format", fmt)
    assert code == 1 and CUT in out and "cut off" in out
    assert f"input incomplete: {cut_job / CUT}" in err  # and on stderr, whatever the format
    code, out, _ = invoke(capsys, monkeypatch, tmp_path, "check", cut_job, "--max-bubble", "0.95", "--format", fmt,
                          "--allow-partial")
    assert code == 0 and CUT in out  # judged by the threshold alone, the gap still said
    if fmt == "json":
        body = json.loads(out)
        assert body["passed"] and body["allow_partial"] and body["gates"][0]["status"] == "skip"


@pytest.mark.parametrize("fmt", ["text", "json", "junit", "github", "markdown"])
def test_diff_fails_on_a_cut_off_file_in_every_format(cut_job, capsys, monkeypatch, tmp_path, fmt):
    base = tmp_path / "baseline.json"
    assert invoke(capsys, monkeypatch, tmp_path, "analyze", PIPELINE, "--format", "json", "-o", base)[0] == 0
    code, out, _ = invoke(capsys, monkeypatch, tmp_path, "diff", base, cut_job, "--format", fmt)
    assert code == 1 and CUT in out
    if fmt == "json":
        assert json.loads(out)["incomplete"] == [f"new: {cut_job / CUT}: cut off mid-write"]


def test_diff_of_a_job_against_one_cut_rank_claims_no_improvement(cut_job):
    """The 4-rank baseline against its rank 1 file alone, cut off: the gaps are named (the cut, 1 of 4 ranks,
    no pipeline), rank 1's lane is compared with rank 1's, and its lost work is no improvement; allowed, the
    diff is judged by the tolerance alone."""
    whole = run([PIPELINE], Options(), Scale(use_cache=False)).to_dict()
    cut = run([cut_job / CUT], Options(), Scale(use_cache=False)).to_dict()
    result = diff(whole, cut, 0.05)
    assert result.failed and not result.improvements
    assert result.incomplete == [f"new: {cut_job / CUT}: cut off mid-write",
                                 "new: 1 of the job's 4 ranks present, the other report holds 4"]
    compared = [d.metric for d in result.deltas if d.metric.startswith(("lane", "stage"))]
    assert compared and all(m.startswith(("lane rank1/", "stage 1 ")) for m in compared)  # rank 1's alone
    allowed = diff(whole, cut, 0.05, allow_partial=True)
    assert allowed.failed == bool(allowed.regressions) and not allowed.improvements


def test_a_complete_job_has_no_completeness_gate():
    report = run([PIPELINE], Options(), Scale(use_cache=False)).to_dict()
    assert report["ingest"]["completeness"] == {"complete": True, "cut_off": [], "unread_bytes": 0, "lost_events": 0,
                                                "ranks": 4, "world_size": 4, "reasons": []}
    assert [g.name for g in check(report, {"max_bubble": 0.95}).gates] == ["bubble"]
    assert not diff(report, report, 0.05).incomplete


def test_ranks_missing_against_world_size_are_a_gap():
    """Two ranks of a 128-rank job (HolisticTraceAnalysis's sampled recsys ranks): check fails on it unless
    allowed; a diff of two such inputs holding the same ranks compares them alike, one holding fewer is a gap."""
    folder = shared("kineto")
    files = sorted(folder.glob("recsys_128rank_sampled_rank-*.json.gz"))
    both = run(files, Options(), Scale(use_cache=False))
    completeness = both.ingest.completeness
    assert (completeness.complete, completeness.ranks, completeness.world_size) == (False, 2, 128)
    assert completeness.reasons == ["2 of the job's 128 ranks present (world_size 128)"]
    assert check(both.to_dict(), {}).failed and not check(both.to_dict(), {}, allow_partial=True).failed
    one = run(files[:1], Options(), Scale(use_cache=False)).to_dict()
    assert not diff(both.to_dict(), both.to_dict(), 0.05).incomplete
    assert diff(both.to_dict(), one, 0.05).incomplete == [
        "new: 1 of the job's 128 ranks present, the other report holds 2"]
