"""Start-up of decode worker processes. Imports nothing heavy, so it runs before polars is loaded."""

import os


def init() -> None:
    # Workers already run one per core; polars' own thread pool on top of that only adds contention.
    os.environ["POLARS_MAX_THREADS"] = "1"
