"""Start-up: a cold ``analyze`` of a tiny trace, and ``--help``, against the imports they cannot avoid.

    python bench/startup.py [--trace PATH] [--repeat 7]

Each command runs in a fresh process, in turn with its baseline (A B A B ...), with nothing cached
(``--no-cache`` and an empty cache folder):

- ``pipebubble analyze TRACE --no-cache`` against ``python -c "import polars"``, and its wall time;
- ``pipebubble --help`` against ``python -c pass`` (it loads no polars).

Prints the median ratio of each pair (and its range), the median wall seconds, and how many processes were
left in the command's process group when it exited (there should be none). The default trace is the
14 KB toy training sample (`sample_traces/toy_train`); the target is a cold ``analyze`` of it within 0.4 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tree import paired  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "sample_traces" / "toy_train"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    py, n = sys.executable, args.repeat
    command = [py, "-m", "pipebubble"]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": cache}
        cold = paired([*command, "analyze", str(args.trace), "--no-cache"], [py, "-c", "import polars"], env, n)
        helps = paired([*command, "--help"], [py, "-c", "pass"], env, n)
    print(f"cold analyze of {args.trace.name}: {cold.a.wall_s:.3f} s, {cold.text()}x `import polars` "
          f"({cold.b.wall_s:.3f} s); processes left behind: {cold.a.leftover}")
    print(f"--help: {helps.a.wall_s:.3f} s, {helps.text()}x `python -c pass` ({helps.b.wall_s:.3f} s); "
          f"processes left behind: {helps.a.leftover}")


if __name__ == "__main__":
    main()
