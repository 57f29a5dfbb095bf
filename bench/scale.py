"""Scaling: wall time over 1, 2 and all cores for many rank traces, and peak RSS against trace size.

    python bench/scale.py [--ranks 64] [--events-per-rank 100000] [--big-events 6000000]

Part 1 generates ``--ranks`` Kineto-like rank traces and times ``pipebubble analyze --no-cache`` on the folder
with ``--workers 1``, ``2`` and all cores (fresh processes; speed-up = 1-core time / N-core time).
Part 2 times one big generated trace (several times the 1 GB RSS target when ``--big-events`` is large enough)
and prints its peak RSS over the file size. Figures vary with the machine; compare ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen import generate  # noqa: E402
from ingest import timed  # noqa: E402

HERE = Path(__file__).resolve().parent


def ranks_folder(ranks: int, events: int) -> Path:
    folder = HERE / "_data" / f"ranks_{ranks}x{events}"
    if not (folder / f"rank{ranks - 1}.json").exists():
        print(f"generating {ranks} rank traces in {folder} ...", flush=True)
        for rank in range(ranks):
            generate(folder / f"rank{rank}.json", events, rank=rank, world=ranks, seed=rank)
    return folder


def analyze(target: Path, workers: int, cache: str) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "pipebubble", "analyze", str(target), "--format", "json", "--no-cache", "-q",
           "--workers", str(workers)]
    return timed(cmd, {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events-per-rank", type=int, default=30_000)
    parser.add_argument("--big-events", type=int, default=6_000_000)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    folder = ranks_folder(args.ranks, args.events_per_rank)
    size = sum(p.stat().st_size for p in folder.iterdir())
    with tempfile.TemporaryDirectory() as cache:
        times = {n: analyze(folder, n, cache) for n in sorted({1, 2, cores})}
        print(f"{args.ranks} rank traces, {size / 1e6:,.0f} MB in all, {cores} cores")
        for n, (seconds, rss) in times.items():
            print(f"  workers={n:<3} {seconds:6.2f} s  {size / 1e6 / seconds:7.1f} MB/s  speed-up "
                  f"{times[1][0] / seconds:4.2f}x  peak RSS (driver) {rss / 1e6:,.0f} MB")
        big = HERE / "_data" / f"kineto_{args.big_events}.json"
        if not big.exists():
            print(f"generating {big} ...", flush=True)
            generate(big, args.big_events)
        seconds, rss = analyze(big, cores, cache)
        big_size = big.stat().st_size
        print(f"one {big_size / 1e9:.2f} GB trace: {seconds:.2f} s, peak RSS {rss / 1e9:.2f} GB "
              f"= {rss / big_size:.2f}x the file (target: <= 1 GB for a 10 GB trace)")


if __name__ == "__main__":
    main()
