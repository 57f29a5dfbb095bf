"""Mutated traces through the real command line: every run ends with exit 0 (a report, warnings on
stderr) or exit 2 (one line naming the file), never a traceback or an internal error. Each run picks one
output of the format registry (every analyze format, CSV with each table, every export format, check with
gates no sound report fails) and checks that what it wrote is what that format promises.

Run with ``python -m pytest -m fuzz tests/fuzz/test_fuzz_cli.py``; ``PIPEBUBBLE_FUZZ_CLI_RUNS`` sets the
number of runs (default 320), ``PIPEBUBBLE_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from every_format import EXPORT_NAMES, GATES, assert_export, assert_valid, cases

ROOT = Path(__file__).resolve().parents[2]
SEEDS = sorted((ROOT / "sample_traces").glob("*/rank0.pt.trace.json.gz"))
SHARED = ROOT.parent / "shared"


def _seeds() -> list[tuple[str, bytes]]:
    found = [(p.parent.name, gzip.decompress(p.read_bytes())) for p in SEEDS]
    nsys = sorted((SHARED / "repros").glob("N0_*.sqlite")) if SHARED.exists() else []
    return found + [(p.name, p.read_bytes()) for p in nsys]


def _mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four mutations a real disk, a real writer or a real user makes."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "cut", "insert", "delete", "number", "utf8", "nest", "dup"))
        at = rng.randrange(len(out)) if out else 0
        if kind == "flip" and out:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = rng.choice((b",", b"{", b"}", b"[", b"]", b'"', b"null", b":", b"\\", b"\x00"))
        elif kind == "delete":
            del out[at : at + rng.randint(1, 64)]
        elif kind == "number":
            out[at:at] = rng.choice((b"1e308", b"-1", b"9223372036854775808", b"NaN", b"2147483648", b"1e16"))
        elif kind == "utf8":
            out[at:at] = rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf0\x28\x8c\xbc"))
        elif kind == "nest":
            depth = rng.randint(10, 400)
            out[at:at] = b"[" * depth + b"]" * depth
        elif kind == "dup" and out:
            end = min(len(out), at + rng.randint(1, 4096))
            out[end:end] = out[at:end]
    return bytes(out)


def outputs() -> list[tuple[str, list[str]]]:
    """(what it checks, the command and its arguments before and after the file): every format there is."""
    analyze = [(what, ["analyze", "--no-cache", *args]) for what, args in cases()]
    export = [(f"export {name}", ["export", "--no-cache", "--quiet", "-o", out]) for name, out in EXPORT_NAMES.items()]
    return [*analyze, *export, ("check", ["check", "--no-cache", *GATES, "--format", "json"])]


def valid(what: str, stdout: str, folder: Path) -> bool:
    """Whether a run that ended with exit 0 wrote what its format promises."""
    try:
        if what.startswith("export "):
            name = what.removeprefix("export ")
            assert_export(folder / "in", name, folder / EXPORT_NAMES[name])
        elif what == "check":
            assert json.loads(stdout)["passed"] is True
        else:
            assert_valid(Path("in"), what, stdout)
            if what == "json":
                report = json.loads(stdout)
                assert not any(lane["idle_ns"] < 0 or lane["busy_ns"] < 0 for lane in report["lanes"])
    except Exception:  # noqa: BLE001 - output that does not read back as its format is invalid
        return False
    return True


@pytest.mark.fuzz
def test_mutated_traces_through_the_cli(tmp_path):
    runs = int(os.environ.get("PIPEBUBBLE_FUZZ_CLI_RUNS", 320))
    rng = random.Random(int(os.environ.get("PIPEBUBBLE_FUZZ_SEED", 12)))
    seeds = _seeds()
    env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": str(tmp_path / "cache")}
    outcomes: Counter[str] = Counter()
    failures = []
    for i in range(runs):
        name, data = rng.choice(seeds)
        mutated = _mutate(rng, data)
        suffix = ".sqlite" if name.endswith(".sqlite") else rng.choice((".json", ".json.gz"))
        path = tmp_path / f"in{i}{suffix}"
        path.write_bytes(gzip.compress(mutated) if suffix == ".json.gz" else mutated)
        what, (command, *args) = rng.choice(outputs())
        proc = subprocess.run(
            [sys.executable, "-m", "pipebubble", command, str(path), *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            cwd=tmp_path,  # where an export's -o lands
        )
        outcomes[f"exit {proc.returncode}"] += 1
        bad = proc.returncode not in (0, 2) or "Traceback" in proc.stderr
        if proc.returncode == 2:
            bad |= proc.stderr.count("\n") != 1 or path.name not in proc.stderr
        if proc.returncode == 0:
            bad |= not valid(what, proc.stdout, tmp_path)
        for out in EXPORT_NAMES.values():  # no later run's check finds this one's output
            (tmp_path / out).unlink(missing_ok=True)
        if bad:
            kept = tmp_path.parent / f"fuzz-cli-failure-{i}{suffix}"
            kept.write_bytes(path.read_bytes())
            failures.append((kept, what, proc.returncode, proc.stderr.strip().splitlines()[-1:]))
        path.unlink()
    print(f"\nCLI fuzz: {runs} runs, {dict(sorted(outcomes.items()))}, failures {len(failures)}")
    assert not failures, failures[:5]
