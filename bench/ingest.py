"""Ingest throughput and memory against a json.load baseline, measured in the same run, in both layouts.

    python bench/ingest.py [--events 2000000] [--repeat 3] [--layout both|multiline|compact]

Generates a Kineto-like trace (about 250 bytes an event, as real ones) in torch's multi-line layout and in the
compact one-line layout other Chrome-trace writers use, then, for each, times in fresh processes, in turn
(A B A B ...), ``pipebubble analyze --format json --no-cache`` and a bare ``json.load`` of the same file, then a
cached re-run. Prints MB/s, the median time ratio pair by pair (with its range) and the peak anonymous memory
(RssAnon: the heap, not the mapped trace's page cache) of the whole process tree over the file size. Figures
vary with the machine; the ratios are what to compare (targets on 2 cores: analyze/json.load <= 0.25 in both
layouts, peak tree memory <= 2.5x the file, cached >= 10x faster). ``PIPEBUBBLE_SPILL_BYTES`` is passed on:
set it high to time the in-memory path, to 1 to time the spilled one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen import generate  # noqa: E402
from tree import Paired, paired, run  # noqa: E402

HERE = Path(__file__).resolve().parent
LAYOUTS = {"multiline": False, "compact": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument(
        "--trace",
        type=Path,
        default=HERE / "_data" / "kineto_{events}{layout}.json",
        help="path template ({events}, {layout}: '' or '_compact')",
    )
    parser.add_argument("--repeat", type=int, default=3, help="A/B pairs (median quoted)")
    parser.add_argument("--layout", choices=["both", *LAYOUTS], default="both")
    parser.add_argument("--memory", action="store_true",
                        help="allocator events too (2 of every 7 events, as profile_memory=True records them)")
    args = parser.parse_args()
    spill = os.environ.get("PIPEBUBBLE_SPILL_BYTES", "default")
    print(f"{args.events:,} events, {os.cpu_count()} cores, {args.repeat} A/B pairs, PIPEBUBBLE_SPILL_BYTES={spill}")
    layouts = list(LAYOUTS) if args.layout == "both" else [args.layout]
    results = {name: _measure(_trace(args, name), args.repeat) for name in layouts}
    print()
    for name, (size, pair, _) in results.items():
        print(
            f"{name:9s}  ratio analyze/json.load = {pair.text()} (target <= 0.25)   "
            f"peak tree anon / file = {pair.a.peak_tree_anon / size:.2f} (target <= 2.5)"
        )


def _trace(args: argparse.Namespace, layout: str) -> Path:
    suffix = ("_compact" if LAYOUTS[layout] else "") + ("_memory" if args.memory else "")
    trace = Path(str(args.trace).format(events=args.events, layout=suffix))
    if not trace.exists():
        print(f"generating {trace} ...", flush=True)
        generate(trace, args.events, compact=LAYOUTS[layout], memory=args.memory)
    return trace


def _measure(trace: Path, repeat: int) -> tuple[int, Paired, float]:
    """One layout: the A/B pairs against json.load, then a cached re-run; prints its lines as it goes."""
    size = trace.stat().st_size
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        py = sys.executable
        analyze = [py, "-m", "pipebubble", "analyze", str(trace), "--format", "json", "-q"]
        load = [py, "-c", f"import json; json.load(open({str(trace)!r}))"]
        pair = paired([*analyze, "--no-cache"], load, env, repeat)
        run(analyze, env)  # fills the cache
        cached = run(analyze, env).wall_s
    mb, first, base = size / 1e6, pair.a.wall_s, pair.b
    print(f"trace: {trace.name}, {mb:,.0f} MB")
    print(
        f"  json.load:            {base.wall_s:6.2f} s  {mb / base.wall_s:7.1f} MB/s  "
        f"tree anon {base.peak_tree_anon / size:.2f}x file  cpu {base.cpu_s:.1f} s"
    )
    print(
        f"  pipebubble analyze:   {first:6.2f} s  {mb / first:7.1f} MB/s  "
        f"tree anon {pair.a.peak_tree_anon / size:.2f}x file (RSS {pair.a.peak_tree_rss / size:.2f}x)  "
        f"cpu {pair.a.cpu_s:.1f} s"
    )
    print(f"  cached re-run:        {cached:6.2f} s")
    print(
        f"  ratio analyze/json.load = {pair.text()} (target <= 0.25); "
        f"CPU seconds {pair.a.cpu_s / base.cpu_s:.2f} (steadier on a busy machine)"
    )
    print(f"  ratio first/cached      = {first / cached:.1f}x (target >= 10)", flush=True)
    return size, pair, cached


if __name__ == "__main__":
    main()
