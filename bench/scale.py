"""Scaling: wall time over 1, 2 and all cores for many rank traces, and peak RSS against trace size.

    python bench/scale.py [--ranks 64] [--events-per-rank 100000] [--big-events 6000000]

Part 1 generates ``--ranks`` Kineto-like rank traces and times ``pipebubble analyze --no-cache`` on the folder
with ``--workers 1``, ``2`` and all cores (fresh processes; speed-up = 1-core time / N-core time).
Part 2 times big generated traces, with spans in memory and spilled to Parquet (what a trace over
``PIPEBUBBLE_SPILL_BYTES`` gets), and prints the driver's peak RSS: spilled, it should not grow with the
trace. Figures vary with the machine; compare ratios.
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


def ranks_folder(ranks: int, events: int) -> Path:
    folder = HERE / "_data" / f"ranks_{ranks}x{events}"
    if not (folder / f"rank{ranks - 1}.json").exists():
        print(f"generating {ranks} rank traces in {folder} ...", flush=True)
        for rank in range(ranks):
            generate(folder / f"rank{rank}.json", events, rank=rank, world=ranks, seed=rank)
    return folder


def analyze(target: Path, workers: int, cache: str, spill: bool = False) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "pipebubble", "analyze", str(target), "--format", "json", "--no-cache", "-q",
           "--workers", str(workers)]
    env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache, "PIPEBUBBLE_SPILL_BYTES": "1" if spill else str(10**15)}
    measured = run(cmd, env)
    return measured.wall_s, measured.peak_tree_rss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events-per-rank", type=int, default=30_000)
    parser.add_argument("--big-events", type=int, nargs="+", default=[6_000_000, 12_000_000])
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
        for events in args.big_events:
            big = HERE / "_data" / f"kineto_{events}.json"
            if not big.exists():
                print(f"generating {big} ...", flush=True)
                generate(big, events)
            size = big.stat().st_size
            for spill in (False, True):
                seconds, rss = analyze(big, cores, cache, spill)
                how = "spilled to Parquet" if spill else "in memory        "
                print(f"one {size / 1e9:.2f} GB trace, {how}: {seconds:6.2f} s, driver peak RSS {rss / 1e9:.2f} GB "
                      f"= {rss / size:.2f}x the file")

if __name__ == "__main__":
    main()
