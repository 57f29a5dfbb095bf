"""Reading an Nsight Systems SQLite export against a bare SQLite SELECT, measured in the same run.

    python bench/nsys.py [--sqlite EXPORT] [--repeat 5]

The baseline fetches every row of the kernel, memcpy, memset, runtime and NVTX tables (those the export
has) with ``SELECT *``. Timed in this process after imports (median of ``--repeat``, after one warm-up):
that SELECT and ``pipebubble.ingest.read_file(path, use_cache=False)``. Timed in fresh processes (median):
the SELECT, ``pipebubble analyze EXPORT --format json --no-cache -q`` and ``python -c "import polars"``.
Prints the ratios; figures vary with the machine, the ratios are what to compare (target: read and
command <= 3x the bare SELECT).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tree import Measured, run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "traces" / "nsys" / "torchrun_2xh100_nccl.sqlite"
TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
# The bare SELECT in a fresh process (argv: the export, then its tables); ``select_all`` in this one.
SELECT = """\
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1])
for table in sys.argv[2:]:
    conn.execute(f'SELECT * FROM "{table}"').fetchall()
conn.close()
"""


def select_all(path: Path, tables: list[str]) -> None:
    conn = sqlite3.connect(path)
    for table in tables:
        conn.execute(f'SELECT * FROM "{table}"').fetchall()
    conn.close()


def tables_in(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    conn.close()
    return [t for t in TABLES if t in names]


def median_s(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm-up: lazy imports, the file in the page cache
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def median_run(cmd: list[str], env: dict[str, str], repeat: int) -> Measured:
    """The run of median wall time among ``repeat`` runs of ``cmd``."""
    runs = sorted((run(cmd, env) for _ in range(repeat)), key=lambda m: m.wall_s)
    return runs[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqlite", type=Path, default=DEFAULT)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    path, n, py = args.sqlite.resolve(), args.repeat, sys.executable
    tables = tables_in(path)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["PIPEBUBBLE_CACHE_DIR"] = cache  # nothing is cached; scratch stays out of the user's cache
        from pipebubble.ingest import read_file

        select_in = median_s(lambda: select_all(path, tables), n)
        read_in = median_s(lambda: read_file(path, use_cache=False), n)
        env = dict(os.environ)
        select = median_run([py, "-c", SELECT, str(path), *tables], env, n)
        analyze = [py, "-m", "pipebubble", "analyze", str(path), "--format", "json", "--no-cache", "-q"]
        command = median_run(analyze, env, n)
        polars = median_run([py, "-c", "import polars"], env, n)

    print(f"export: {path.name}, {path.stat().st_size / 1e6:.1f} MB; tables: {', '.join(tables)}")
    print(f"median of {n}; {os.cpu_count()} cores")
    print(f"in process:  SELECT {1000 * select_in:8.1f} ms   read_file {1000 * read_in:8.1f} ms")
    for label, m in (("SELECT process", select), ("analyze command", command), ("import polars", polars)):
        rss = m.peak_tree_rss / 1e6
        print(f"{label:16} {1000 * m.wall_s:8.1f} ms  cpu {1000 * m.cpu_s:8.1f} ms  tree RSS {rss:6.0f} MB")
    print(f"ratio read_file / SELECT (in process) = {read_in / select_in:.2f} (target <= 3)")
    print(f"ratio command / SELECT process        = {command.wall_s / select.wall_s:.2f} (target <= 3)")
    print(f"ratio command / import polars         = {command.wall_s / polars.wall_s:.2f}")


if __name__ == "__main__":
    main()
