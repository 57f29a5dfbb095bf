"""Which runtime call launched each GPU operation: the one join every analysis that follows GPU work back to
its host thread makes.

A GPU span and the ``cudaLaunchKernel`` (``cudaMemcpyAsync``, ``cudaGraphLaunch`` ...) that issued it share a
correlation id within one source file. Kineto's ids are unique per file (a GPU span has no pid); Nsight's
are unique per process only, so a call in another process is no match (``same_process``).
"""

from __future__ import annotations

import polars as pl

#: One GPU operation, once: the same event recorded twice, or matched to two launches, is one row.
EVENT_KEY = ["source", "lane", "stream", "start", "end", "name"]
#: The same with its correlation id: two operations alike but for their ids stay two.
OP_KEY = [*EVENT_KEY, "correlation"]


def launch_calls(spans: pl.DataFrame, name: str | None = None) -> pl.DataFrame:
    """Runtime calls that carry a correlation id: source, correlation, ``at_pid``, ``at_lane``, ``at`` (the
    call's start), ``at_end`` (its return) and, given ``name``, the call's name under that column."""
    extra = {name: pl.col("name")} if name else {}
    return spans.filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null()).select(
        "source", "correlation", at_pid="pid", at_lane="lane", at="start", at_end="end", **extra
    )


def same_process() -> pl.Expr:
    """A GPU span and a call with its correlation id are one launch unless both name different processes."""
    return pl.col("pid").is_null() | pl.col("at_pid").is_null() | (pl.col("pid") == pl.col("at_pid"))


def with_launch(
    ops: pl.DataFrame, spans: pl.DataFrame, how: str = "left", key: list[str] = OP_KEY, name: str | None = None
) -> pl.DataFrame:
    """``ops`` (GPU spans) with the ``launch_calls`` columns of the call that launched each, one row per
    operation by ``key`` (the first launch); ``how="inner"`` leaves out operations without their call. The
    join keeps ``ops``' order, so the first is well defined; and the first of each key is kept by a filter,
    which costs a third of a ``unique`` planned over the join."""
    joined = ops.join(launch_calls(spans, name), on=["source", "correlation"], how=how,  # type: ignore[arg-type]
                      maintain_order="left")
    return joined.filter(same_process()).filter(pl.struct(key).is_first_distinct())
