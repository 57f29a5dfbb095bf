"""Ingest throughput and memory against a json.load baseline, measured in the same run.

    python bench/ingest.py [--events 2000000] [--repeat 3]

Generates a Kineto-like trace (about 250 bytes an event, as real ones), then times in fresh processes, in
turn (A B A B ...), ``pipebubble analyze --format json --no-cache`` and a bare ``json.load`` of the file,
then a cached re-run. Prints MB/s, the median time ratio pair by pair (with its range) and the peak RSS
of the whole process tree over the file size. Figures vary with the machine; the ratios are what to
compare (targets on 2 cores: analyze/json.load <= 0.20, tree RSS <= 1.5x the file, cached >= 10x faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen import generate  # noqa: E402
from tree import paired, run  # noqa: E402

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--trace", type=Path, default=HERE / "_data" / "kineto_{events}.json")
    parser.add_argument("--repeat", type=int, default=3, help="A/B pairs (median quoted)")
    args = parser.parse_args()
    trace = Path(str(args.trace).format(events=args.events))
    if not trace.exists():
        print(f"generating {trace} ...", flush=True)
        generate(trace, args.events)
    size = trace.stat().st_size
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        py = sys.executable
        load = [py, "-c", f"import json; json.load(open({str(trace)!r}))"]
        pair = paired([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "--no-cache", "-q"], load,
                      env, args.repeat)
        run([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "-q"], env)  # fills the cache
        cached = run([py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "-q"], env).wall_s
    mb = size / 1e6
    first, rss, base = pair.a.wall_s, pair.a.peak_tree_rss, pair.b
    print(f"trace: {mb:,.0f} MB, {args.events:,} events, {os.cpu_count()} cores, {args.repeat} A/B pairs")
    print(f"json.load:            {base.wall_s:6.2f} s  {mb / base.wall_s:7.1f} MB/s  "
          f"tree RSS {base.peak_tree_rss / size:.2f}x file")
    print(f"pipebubble analyze:   {first:6.2f} s  {mb / first:7.1f} MB/s  tree RSS {rss / size:.2f}x file  "
          f"cpu {pair.a.cpu_s:.1f} s")
    print(f"cached re-run:        {cached:6.2f} s")
    print(f"ratio analyze/json.load = {pair.text()} (target <= 0.20)")
    print(f"ratio first/cached      = {first / cached:.1f}x (target >= 10)")
    print(f"peak tree RSS / file    = {rss / size:.2f} (target <= 1.5)")

if __name__ == "__main__":
    main()
