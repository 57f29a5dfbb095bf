"""The report of every shared trace and repro, held to its figures recorded from an earlier version: a change
meant to make pipebubble faster (or tidier) must not change one number it prints, and a change meant to alter
reports shows a reviewer which numbers it changed.

Each input (a trace alone, a per-rank folder, a repro) is analysed in this process without the cache; its
figures (``figures``: what was read, each finding's kind and worth, each GPU's whole-window breakdown and idle
by cause, the steps, the pipeline, the collectives, the critical path's composition, the kernels, requests and
memory), or for a rejected input its error, are compared with ``tests/golden/shared_reports.json``. A change
that is meant to alter reports records them again, and says so in its commit:

    python tests/whole/test_report_identity.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
FIGURES = ROOT / "tests" / "golden" / "shared_reports.json"


def inputs() -> dict[str, list[Path]]:
    """Name → paths analysed together: every trace file alone, every per-rank folder, every repro."""
    found: dict[str, list[Path]] = {}
    traces, repros = SHARED / "traces", SHARED / "repros"
    if traces.exists():
        for path in sorted(traces.rglob("*")):
            if path.is_file() and path.name.endswith((".json", ".json.gz", ".sqlite")):
                found[str(path.relative_to(SHARED))] = [path]
        for folder in sorted(p for p in traces.rglob("*") if p.is_dir() and any(p.glob("rank*.json.gz"))):
            found[f"{folder.relative_to(SHARED)}/"] = [folder]
        ranks = sorted((traces / "kineto").glob("recsys_128rank_sampled_rank-*.json.gz"))
        if len(ranks) > 1:
            found["traces/kineto/recsys_128rank_sampled (ranks together)"] = ranks
    if repros.exists():
        for path in sorted(repros.iterdir()):
            if path.is_file() and path.name.endswith((".json", ".json.gz", ".sqlite")):
                found[str(path.relative_to(SHARED))] = [path]
    return found


def figures(paths: list[Path]) -> dict | str:
    """The input's report as readable figures (module docstring), or its error when it is rejected."""
    from pipebubble.errors import PipebubbleError
    from pipebubble.options import Scale
    from pipebubble.run import run

    try:
        r = run(paths, scale=Scale(use_cache=False)).to_dict()
    except PipebubbleError as exc:
        return f"error: {exc}".replace(str(SHARED), "<shared>")
    return {
        "read": [r["ingest"]["events_read"], r["ingest"]["spans"], r["ingest"]["skipped"]],
        "findings": [[f["kind"], f["worth_ns"]] for f in r["findings"]],
        "lanes": [len(r["lanes"]), sum(lane["busy_ns"] for lane in r["lanes"])],
        "gpus": {b["lane"]: [b["window_ns"], b["compute_ns"], b["comm_exposed_ns"], b["memory_exposed_ns"],
                             b["idle_ns"], {k: v for k, v in sorted(b["idle_causes"].items()) if v}]
                 for b in r["breakdown"] if b["step"] is None},
        "steps": sorted({(b["step"], b["window_ns"]) for b in r["breakdown"] if b["step"] is not None}),
        "pipeline": None if r["pipeline"] is None else [
            r["pipeline"][k] for k in ("stages", "microbatches", "schedule", "bubble_fraction", "step_time_ns")],
        "collectives": None if r["collectives"] is None else [r["collectives"]["calls"],
                                                              r["collectives"].get("straggler")],
        "critical_path": [[p["step"], p["length_ns"], _shares(p)] for p in r["critical_path"]],
        "kernels": [len(r["kernels"]), sum(k["total_ns"] for k in r["kernels"])],
        "requests": None if r["requests"] is None else r["requests"]["count"],
        "memory": None if r["memory"] is None else [d["peak_bytes"] for d in r["memory"]["devices"]],
    }


def _shares(path: dict) -> dict:
    """A critical path's ns by kind, over its participants."""
    kinds = ("compute_ns", "memory_ns", "comm_ns", "host_ns", "waiting_ns")
    return {k: sum(s.get(k, 0) for s in path["by_rank"]) for k in kinds}


CASES = inputs()


def _recorded() -> dict:
    return json.loads(FIGURES.read_text()) if FIGURES.exists() else {}


@pytest.mark.skipif(not CASES, reason="the shared traces and repros are absent")
@pytest.mark.parametrize("name", sorted(CASES))
def test_report_is_unchanged(name):
    recorded = _recorded()
    if name not in recorded:
        pytest.skip(f"{name}: no figures recorded (python tests/whole/test_report_identity.py --write)")
    assert _plain(figures(CASES[name])) == recorded[name], f"the report of {name} changed"


def _plain(value):
    """``value`` as JSON reads it back (tuples as lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.skipif(not CASES, reason="the shared traces and repros are absent")
def test_every_input_has_its_figures():
    missing = sorted(set(CASES) - set(_recorded()))
    assert not missing, f"no figures recorded for {missing} (python tests/whole/test_report_identity.py --write)"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    FIGURES.write_text(json.dumps({name: figures(paths) for name, paths in CASES.items()}, indent=1) + "\n")
    print(f"{len(CASES)} reports' figures written to {FIGURES.relative_to(ROOT)}")
