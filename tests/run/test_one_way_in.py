"""analyze, check, diff and export enter through one door: on the same input they give the same numbers, and
the export's timestamps share the report's time origin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import shared

from pipebubble import cli

ROOT = Path(__file__).resolve().parents[2]


def cli_json(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_:
        cli.main(list(args))
    out, err = capsys.readouterr()
    assert exit_.value.code in (0, 1), err
    return json.loads(out)


def inputs() -> list:
    return [
        pytest.param(lambda: ROOT / "sample_traces" / "pipeline_1f1b", id="kineto-folder"),
        pytest.param(lambda: shared("nsys", "torchrun_2xh100_nccl.sqlite"), id="nsight-export"),
    ]


@pytest.mark.parametrize("where", inputs())
def test_every_command_sees_the_same_numbers(capsys, tmp_path, where):
    path = str(where())
    report = cli_json(capsys, "analyze", path, "--format", "json", "--no-cache")
    assert report["lanes"]
    # diff of the traces against the saved report: every metric equal, none regressed.
    saved = tmp_path / "base.json"
    saved.write_text(json.dumps(report))
    delta = cli_json(capsys, "diff", str(saved), path, "--format", "json", "--no-cache")
    assert not delta["regressed"] and delta["deltas"]
    assert all(d["base"] == d["new"] for d in delta["deltas"]), [d for d in delta["deltas"] if d["base"] != d["new"]]
    # check measures what analyze reported.
    gates = cli_json(capsys, "check", path, "--min-utilization", "0", "--max-wait-ms", "1e9", "--format", "json")
    values = {g["name"]: g["value"] for g in gates["gates"]}
    if report["pipeline"] is not None:
        assert values["utilization"] == pytest.approx(1 - report["pipeline"]["bubble_fraction"])
        assert values["wait"] == pytest.approx(max(w["dur_ns"] for w in report["waits"]) / 1e6)
    # export: the original spans and the waits sit where the report says, on one time origin.
    exported = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exit_:
        cli.main(["export", path, "-o", str(exported), "--no-cache", "-q"])
    assert exit_.value.code == 0, capsys.readouterr().err
    trace = json.loads(exported.read_text())
    origin = trace["otherData"]["origin_ns"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    starts = {round(e["ts"] * 1000) + origin for e in slices}
    assert {lane["window_start_ns"] for lane in report["lanes"]} <= starts  # each lane's first work, exported
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    waits = sorted(round(e["ts"] * 1000) + origin for e in slices if threads.get((e["pid"], e["tid"]), "").endswith(
        " waits"))
    assert waits == sorted(w["start_ns"] for w in report["waits"])


def test_the_exports_report_is_the_report(tmp_path):
    """The export reads the traces once for its spans and its report; the report equals run's."""
    from pipebubble.options import Options, Scale
    from pipebubble.run import run, with_spans

    folder = ROOT / "sample_traces" / "pipeline_1f1b"
    report, table = with_spans([folder], Options(), Scale(use_cache=False))
    assert report.to_dict() == run([folder], Options(), Scale(use_cache=False)).to_dict()
    assert table.height == report.ingest.spans
