"""Counting polars queries: ``counting`` patches the two entry points every query runs through
(``LazyFrame.collect`` and each frame of ``pl.collect_all``, and ``LazyFrame._collect_eager``, which every
eager DataFrame operation runs) for the length of a block."""

from __future__ import annotations

from contextlib import contextmanager

import polars as pl


@contextmanager
def counting():
    """Count the polars queries run inside the block (a query run inside a counted one is not counted
    again): ``count[0]``."""
    count, depth = [0], [0]
    originals = {name: getattr(pl.LazyFrame, name) for name in ("collect", "_collect_eager")}
    collect_all = pl.collect_all

    def counted(original, queries=lambda *a, **k: 1):
        def run(*args, **kwargs):
            if not depth[0]:
                count[0] += queries(*args, **kwargs)
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1
        return run

    try:
        for name, original in originals.items():
            setattr(pl.LazyFrame, name, counted(original))
        pl.collect_all = counted(collect_all, lambda frames, *a, **k: len(frames))
        yield count
    finally:
        for name, original in originals.items():
            setattr(pl.LazyFrame, name, original)
        pl.collect_all = collect_all
