"""Ingest throughput and memory against a json.load baseline, measured in the same run.

    python bench/ingest.py [--events 2000000]

Generates a Kineto-like trace (about 250 bytes an event, as real ones), then times in fresh processes:
a bare ``json.load`` of the file, ``pipebubble analyze --format json --no-cache``, and a cached re-run.
Prints MB/s, the time ratios and peak RSS over file size. Figures vary with the machine; the ratios are
what to compare (targets: analyze/json.load <= 0.25, RSS <= 2.5x the file, cached >= 10x faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen import generate  # noqa: E402
from tree import run  # noqa: E402

HERE = Path(__file__).resolve().parent


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a child process and everything it started (the whole tree's
    summed resident memory, pool workers included)."""
    measured = run(cmd, env)
    return measured.wall_s, measured.peak_tree_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--trace", type=Path, default=HERE / "_data" / "kineto_{events}.json")
    args = parser.parse_args()
    trace = Path(str(args.trace).format(events=args.events))
    if not trace.exists():
        print(f"generating {trace} ...", flush=True)
        generate(trace, args.events)
    size = trace.stat().st_size
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        py = sys.executable
        baseline, base_rss = timed([py, "-c", f"import json; json.load(open({str(trace)!r}))"], env)
        first, rss = timed([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "--no-cache"], env)
        timed([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "-q"], env)  # fills the cache
        cached, _ = timed([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json"], env)
    mb = size / 1e6
    print(f"trace: {mb:,.0f} MB, {args.events:,} events, {os.cpu_count()} cores")
    print(f"json.load:            {baseline:6.2f} s  {mb / baseline:7.1f} MB/s  tree RSS {base_rss / size:.2f}x file")
    print(f"pipebubble analyze:   {first:6.2f} s  {mb / first:7.1f} MB/s  tree RSS {rss / size:.2f}x file")
    print(f"cached re-run:        {cached:6.2f} s")
    print(f"ratio analyze/json.load = {first / baseline:.3f} (target <= 0.25)")
    print(f"ratio first/cached      = {first / cached:.1f}x (target >= 10)")
    print(f"peak tree RSS / file    = {rss / size:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
