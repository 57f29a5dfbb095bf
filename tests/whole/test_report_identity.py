"""The JSON report of every shared trace and repro, held to a digest recorded from an earlier version: a
change meant to make pipebubble faster (or tidier) must not change one number it prints.

Each input (a trace alone, a per-rank folder, a repro) is analysed in this process without the cache;
its canonical JSON (keys sorted, the shared folder's path replaced by ``<shared>``), or for a rejected
input its error, is hashed and compared with ``tests/golden/shared_reports.json``. A change that is meant to
alter reports records the digests again, and says so in its commit:

    python tests/whole/test_report_identity.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
DIGESTS = ROOT / "tests" / "golden" / "shared_reports.json"


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


def digest(paths: list[Path]) -> str:
    """The sha256 of the input's canonical report JSON, or of its error when it is rejected."""
    from pipebubble.errors import PipebubbleError
    from pipebubble.options import Scale
    from pipebubble.run import run

    try:
        text = json.dumps(run(paths, scale=Scale(use_cache=False)).to_dict(), sort_keys=True)
    except PipebubbleError as exc:
        text = f"error: {exc}"
    return hashlib.sha256(text.replace(str(SHARED), "<shared>").encode()).hexdigest()


CASES = inputs()


def _recorded() -> dict[str, str]:
    return json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}


@pytest.mark.skipif(not CASES, reason="the shared traces and repros are absent")
@pytest.mark.parametrize("name", sorted(CASES))
def test_report_is_unchanged(name):
    recorded = _recorded()
    if name not in recorded:
        pytest.skip(f"{name}: no digest recorded (python tests/whole/test_report_identity.py --write)")
    assert digest(CASES[name]) == recorded[name], f"the report of {name} changed"


@pytest.mark.skipif(not CASES, reason="the shared traces and repros are absent")
def test_every_input_has_a_digest():
    missing = sorted(set(CASES) - set(_recorded()))
    assert not missing, f"no digest recorded for {missing} (python tests/whole/test_report_identity.py --write)"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        raise SystemExit(__doc__)
    DIGESTS.write_text(json.dumps({name: digest(paths) for name, paths in CASES.items()}, indent=1) + "\n")
    print(f"{len(CASES)} digests written to {DIGESTS.relative_to(ROOT)}")
