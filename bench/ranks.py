"""Many rank files: wall time, cost per rank and whole-tree peak RSS against a json.load baseline, measured
in the same run.

    python bench/ranks.py [--ranks 8 64 256 1024] [--events 4000] [--repeat 3]

For each count N, generates N Kineto-like rank traces of about ``--events`` events (bench/gen.py), then
times in fresh processes, in turn (A B A B ...), ``pipebubble analyze FOLDER --format json --no-cache``
and a bare ``json.load`` of every file (one process, one file after another). Prints the median ratio to
json.load pair by pair (with its range), the cost per rank and the peak resident memory of the whole
process tree (pool workers included). Targets: 64 ranks <= 4x json.load; per-rank cost at 1,024 ranks
within 1.5x of 64. Figures vary with the machine; compare ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale import ranks_folder  # noqa: E402
from tree import folder_against_json_load  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256, 1024])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=3, help="A/B pairs per count (median quoted)")
    args = parser.parse_args()
    per_rank = {}
    print(f"{os.cpu_count()} cores; {args.events:,} events per rank")
    print(f"{'ranks':>6} {'MB':>8} {'json.load s':>12} {'analyze s':>10} {'ratio (range)':>16} {'ms/rank':>8} "
          f"{'cpu s':>7} {'tree anon MB':>12} {'left':>5}")
    for n in args.ranks:
        data = ranks_folder(n, args.events)
        pair, mb = folder_against_json_load(data, args.repeat)
        mine, base = pair.a, pair.b
        per_rank[n] = mine.wall_s / n
        print(f"{n:>6} {mb:>8.1f} {base.wall_s:>12.2f} {mine.wall_s:>10.2f} {pair.text():>16} "
              f"{1000 * per_rank[n]:>8.1f} {mine.cpu_s:>7.1f} {mine.peak_tree_anon / 1e6:>12.0f} {mine.leftover:>5}")
    if 64 in per_rank and len(per_rank) > 1:
        top = max(per_rank)
        print(f"cost per rank at {top} ranks / at 64 = {per_rank[top] / per_rank[64]:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
