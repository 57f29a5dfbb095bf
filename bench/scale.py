"""Scaling: wall time over 1, 2 and all cores for many rank traces, and peak memory against trace size.

    python bench/scale.py [--ranks 64] [--events-per-rank 30000] [--big-events 12700000 52000000]
                          [--layout compact|multiline] [--baseline-below 4e9] [--memory-budget 800M]
                          [--data DIR]

Part 1 generates ``--ranks`` Kineto-like rank traces and times ``pipebubble analyze --no-cache`` on the folder
with ``--workers 1``, ``2`` and all cores (fresh processes; speed-up = 1-core time / N-core time).
Part 2 analyses big generated traces (compact one-line JSON by default: 12.7M events is about 2.4 GB,
52M about 10 GB) with the default memory budget (or ``--memory-budget``), which spills them to Parquet and
reads them back in windows, and prints the peak anonymous memory of the whole process tree, sampled while it
runs: the sum of each process's Pss_Anon (``tree.py``: a pool's forked workers share pages, which Pss counts
once; the heap, not the page cache's mapped file), which processes held it, and its wall time against a bare
``json.load`` of the same file (A/B, for files under ``--baseline-below`` bytes: json.load needs several times
a file's size in memory). Generated traces go to ``--data`` (default ``bench/_data``). Figures vary with the
machine; compare ratios. Targets: 2.4 GB <= 1 GB of anonymous memory by default and <= 800 MB under
``--memory-budget 800M``; 10 GB <= 1.5 GB by default.
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


def ranks_folder(ranks: int, events: int) -> Path:
    folder = HERE / "_data" / f"ranks_{ranks}x{events}"
    if not (folder / f"rank{ranks - 1}.json").exists():
        print(f"generating {ranks} rank traces in {folder} ...", flush=True)
        for rank in range(ranks):
            generate(folder / f"rank{rank}.json", events, rank=rank, world=ranks, seed=rank)
    return folder


def analyze(target: Path, workers: int, cache: str, budget: str | None = None) -> list[str]:
    return [sys.executable, "-m", "pipebubble", "analyze", str(target), "--format", "json", "--no-cache", "-q",
            "--workers", str(workers), *(["--memory-budget", budget] if budget else [])]


def where(m) -> str:
    """Which processes held the peak (``tree.Measured.peak_where``), in MB."""
    return ", ".join(f"{name} {anon / 1e6:,.0f}" for _, name, anon in m.peak_where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--events-per-rank", type=int, default=30_000)
    parser.add_argument("--big-events", type=int, nargs="*", default=[12_700_000, 52_000_000])
    parser.add_argument("--layout", choices=["compact", "multiline"], default="compact")
    parser.add_argument("--baseline-below", type=float, default=4e9, help="bytes: json.load only of smaller files")
    parser.add_argument("--big-only", action="store_true", help="skip part 1")
    parser.add_argument("--memory-budget", help="part 2: analyse under this budget (default: the default budget)")
    parser.add_argument("--data", type=Path, default=HERE / "_data", help="where the big traces are generated")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        if not args.big_only:
            folder = ranks_folder(args.ranks, args.events_per_rank)
            size = sum(p.stat().st_size for p in folder.iterdir())
            times = {n: run(analyze(folder, n, cache), env) for n in sorted({1, 2, cores})}
            print(f"{args.ranks} rank traces, {size / 1e6:,.0f} MB in all, {cores} cores")
            for n, m in times.items():
                print(f"  workers={n:<3} {m.wall_s:6.2f} s  {size / 1e6 / m.wall_s:7.1f} MB/s  speed-up "
                      f"{times[1].wall_s / m.wall_s:4.2f}x  peak anonymous memory (tree) "
                      f"{m.peak_tree_anon / 1e6:,.0f} MB")
        for events in args.big_events:
            big = args.data / f"kineto_{events}_{args.layout}.json"
            if not big.exists():
                print(f"generating {big} ...", flush=True)
                generate(big, events, compact=args.layout == "compact")
            size = big.stat().st_size
            cmd = analyze(big, cores, cache, args.memory_budget)
            if size < args.baseline_below:
                load = [sys.executable, "-c", f"import json; json.load(open({str(big)!r}))"]
                pair = paired(cmd, load, env, repeat=1)
                mine, ratio = pair.a, f"{pair.text()} x json.load ({pair.b.wall_s:.1f} s)"
            else:
                mine, ratio = run(cmd, env), "json.load not run (too big for this machine's memory)"
            budget = f"--memory-budget {args.memory_budget}" if args.memory_budget else "the default budget"
            print(f"one {size / 1e9:.2f} GB trace ({args.layout}), {budget}: {mine.wall_s:6.1f} s = {ratio}; peak "
                  f"anonymous memory (Pss_Anon, tree) {mine.peak_tree_anon / 1e9:.3f} GB = "
                  f"{mine.peak_tree_anon / size:.2f}x the file, {mine.peak_at_s:.0f} s in ({where(mine)}); "
                  f"resident {mine.peak_tree_rss / 1e9:.2f} GB", flush=True)


if __name__ == "__main__":
    main()
