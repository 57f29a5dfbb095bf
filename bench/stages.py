"""A big pipeline job: the stage part and the reduce of a 1F1B job of many stages, against a json.load baseline.

    python bench/stages.py [--stages 64 256] [--microbatches 64] [--kernels 1 4] [--repeat 3]

For each stage count p and each number of kernels a pass runs (``--kernels``), writes a synthetic 1F1B job
(``tests/synth.py``: one Kineto file per rank, every pass labelled, send/recv ranges between neighbours;
stage s's forward takes 1 + (s mod 4)/100 of the first's, so stages are slightly unequal) under bench/_data,
then times in fresh processes, in turn (A B A B ...), ``pipebubble analyze FOLDER --format json --no-cache
-q`` and a bare ``json.load`` of every file. One kernel a pass is the thinnest job of that shape (64 stages:
5 MB; its time is the analysis's fixed costs); four a pass, each launched by its own operator, is the size of
a job whose stages run a few layers (64 stages: 16 MB). Prints the median ratio to json.load pair by pair
(with its range) and the ratio of the biggest job's time to the 64-stage one's. Targets: 64 stages <= 4x
json.load; 256 stages <= 3x the 64-stage time. Figures vary with the machine; compare ratios.

Beside the 64-stage jobs, the command's fixed cost in the same units: ``analyze`` of a 14 KB trace
(``sample_traces/toy_train``: interpreter, imports, a map and a reduce of almost nothing, rendering) against
the 64-stage folder's ``json.load``, in its own A/B pairs. The job's ratio cannot fall below it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from tree import folder_against_json_load  # noqa: E402

FORWARD_NS = 100_000
TINY = HERE.parent / "sample_traces" / "toy_train"


def pipeline_folder(p: int, m: int, kernels: int = 1) -> Path:
    """bench/_data/stages-{p}x{m}[k{kernels}]: a 1F1B job of ``p`` slightly unequal stages and ``m``
    micro-batches, each pass ``kernels`` kernels (written once; reused while its files are there)."""
    from synth import simulate, write_pipeline

    folder = HERE / "_data" / (f"stages-{p}x{m}" + (f"k{kernels}" if kernels > 1 else ""))
    if len(list(folder.glob("rank*.json"))) == p:
        return folder
    forward = [FORWARD_NS * (100 + s % 4) // 100 for s in range(p)]
    backward = [2 * f for f in forward]
    return write_pipeline(folder, simulate("1f1b", p, m, forward, backward), kernels=kernels, context=kernels > 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--microbatches", type=int, default=64)
    parser.add_argument("--kernels", type=int, nargs="+", default=[1, 4], help="kernels a pass runs")
    parser.add_argument("--repeat", type=int, default=3, help="A/B pairs per job (median quoted)")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; 1F1B, {args.microbatches} micro-batches")
    print(f"{'stages':>6} {'kernels':>7} {'MB':>8} {'json.load s':>12} {'analyze s':>10} {'ratio (range)':>16} "
          f"{'cpu s':>7} {'tree anon MB':>12}")
    for kernels in args.kernels:
        walls = {}
        for p in args.stages:
            data = pipeline_folder(p, args.microbatches, kernels)
            pair, mb = folder_against_json_load(data, args.repeat)
            walls[p] = pair.a.wall_s
            print(f"{p:>6} {kernels:>7} {mb:>8.1f} {pair.b.wall_s:>12.2f} {pair.a.wall_s:>10.2f} {pair.text():>16} "
                  f"{pair.a.cpu_s:>7.1f} {pair.a.peak_tree_anon / 1e6:>12.0f}")
            if p == 64:
                floor, _ = folder_against_json_load(data, args.repeat, target=TINY)
                print(f"{'':>6} {'':>7} {'':>8} {floor.b.wall_s:>12.2f} {floor.a.wall_s:>10.2f} {floor.text():>16}   "
                      "fixed cost: analyze of a 14 KB trace against this job's json.load")
        if 64 in walls and len(walls) > 1:
            top = max(walls)
            print(f"  {kernels} kernel(s) a pass: time at {top} stages / at 64 = {walls[top] / walls[64]:.2f} "
                  "(target <= 3)")


if __name__ == "__main__":
    main()
