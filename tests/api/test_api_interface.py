"""The public names of ``import pipebubble``, tested as an interface: removing or renaming one fails here. Each
is checked in a fresh interpreter too, since ``import pipebubble`` must stay cheap (no polars until used)."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pipebubble as pb

PUBLIC = ["Check", "Diff", "PipebubbleError", "Report", "Settings", "analyze", "check", "diff"]
TABLES = ["lanes", "stages", "replicas", "workers", "waits", "breakdown", "kernels", "findings", "memory",
          "memory_stages", "requests", "steps", "recommendations", "timeline", "collective_ranks", "collective_calls",
          "critical_path", "idle", "host_api", "host_ranges", "host_ops", "gpu_annotations", "launch_queue",
          "launch_delays", "memcpy", "memcpy_lanes", "flops", "flops_ops", "flops_stages", "flops_steps"]
REPORT = ["data", "pipeline", "notes", "warnings", "tables", "table", "to_pandas", "to_dict", "render", "save",
          "_repr_html_", "spans", "show", "origin_ns", "queue_series"]
VERDICT = ["passed", "render", "_repr_markdown_"]
SETTINGS = ["stage_by", "stage", "pp_size", "rank_order", "microbatch_regex", "wait_threshold", "gpu_cost",
            "memory_limit", "peak_flops", "peak_bandwidth", "step_regex", "tbt_slo", "align", "no_align", "executor",
            "ray_address", "workers", "memory_budget", "cache"]
GATES = ["max_bubble", "max_excess_bubble", "min_utilization", "max_stage_cv", "max_imbalance", "max_wait_ms",
         "max_decode_slowdown", "max_finding", "max_ttft_p99", "max_tpot_p99", "max_queue_p99", "max_preemptions",
         "strict", "allow_partial", "config"]


def test_public_names():
    assert sorted(pb.__all__) == sorted(PUBLIC)
    assert all(name in dir(pb) for name in PUBLIC)
    assert issubclass(pb.PipebubbleError, Exception)


def test_report_attributes():
    assert list(pb.Report.tables) == TABLES
    for name in [*TABLES, *REPORT]:
        assert hasattr(pb.Report, name) or name == "data", name
    assert all(getattr(pb.Report, name).__doc__ for name in TABLES)


def test_verdicts():
    for cls in (pb.Check, pb.Diff):
        assert all(hasattr(cls, name) for name in VERDICT)
    assert hasattr(pb.Check, "gates") or "gates" in pb.Check.__dataclass_fields__
    assert {"regressions", "improvements"} <= {n for n in dir(pb.Diff)} and "notes" in pb.Diff.__dataclass_fields__


def test_keyword_arguments():
    params = {func: inspect.signature(getattr(pb, func)).parameters for func in ("analyze", "check", "diff")}
    assert list(params["analyze"]) == ["paths", "config", *SETTINGS]
    assert list(params["check"]) == ["report", *GATES, *SETTINGS]
    assert list(params["diff"]) == ["base", "new", "tolerance", "strict", "allow_partial", "by", "max_op_regression",
                                    "config", *SETTINGS]
    assert list(pb.Settings.__dataclass_fields__) == SETTINGS


PROBE = """\
import json, sys
import pipebubble
before = sorted(sys.modules)
names = {name: type(getattr(pipebubble, name)).__name__ for name in pipebubble.__all__}
print(json.dumps({"before": before, "names": names, "after": sorted(sys.modules)}))
"""


def test_import_pipebubble_loads_no_analysis_and_no_polars():
    """`import pipebubble` is the package's __init__ alone; the API (and still no polars) loads on first use."""
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    ours = [m for m in found["before"] if m.startswith("pipebubble")]
    assert ours == ["pipebubble"] and "polars" not in found["before"]
    assert "polars" not in found["after"]  # names resolved, nothing analysed yet
    assert set(found["names"]) == set(PUBLIC)
