"""Which runtime call launched each GPU operation: the one join every analysis that follows GPU work back to
its host thread makes.

A GPU span and the ``cudaLaunchKernel`` (``cudaMemcpyAsync``, ``cudaGraphLaunch`` ...) that issued it share a
correlation id within one source file. Kineto's ids are unique per file (a GPU span has no pid); Nsight's
are unique per process only, so a call in another process is no match (``same_process``).

The operator a launching call belongs to (``innermost``) is found by depth, not by testing every operator of
the thread: a thread's operators nest, so the one open at depth k at an instant is the last one of depth k to
start before it. A sweep over the operators' starts (+1) and ends (−1) gives each operator its depth and each
call the number of operators open at its start (n); the call's operator is the last of depth n − 1 to start at
or before it.
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


def innermost(calls: pl.LazyFrame, cpu: pl.LazyFrame) -> pl.LazyFrame:
    """``calls`` (at_lane, at, and any other columns, in no set order) with ``operator``: the name of the
    innermost CPU operator open at each call's start (``at``) on its thread (``at_lane``); null where none is."""
    lanes = calls.select(lane="at_lane").unique()
    ops = cpu.filter(pl.col("kind") == "cpu_op").join(lanes, on="lane", how="semi").select("lane", "name", "start",
                                                                                            "end")
    # ends before starts at one instant (an operator that ends as another begins does not hold it), an outer
    # operator's start before an inner one's that begins with it
    events = pl.concat([
        ops.select("lane", t="start", delta=pl.lit(1, pl.Int64), tie=-pl.col("end")),
        ops.select("lane", t="end", delta=pl.lit(-1, pl.Int64), tie=pl.lit(None, pl.Int64)),
    ]).sort("lane", "t", "delta", "tie").with_columns(open=pl.col("delta").cum_sum().over("lane"))
    depths = events.filter(pl.col("delta") == 1).select("lane", start="t", depth=pl.col("open") - 1, end=-pl.col("tie"))
    named = depths.join(ops.unique(["lane", "start", "end"], keep="first"), on=["lane", "start", "end"], how="left")
    probe = calls.rename({"at_lane": "lane"}).sort("at")
    opened = probe.join_asof(events.select("lane", "t", "open").sort("t"), left_on="at", right_on="t", by="lane",
                             strategy="backward", check_sortedness=False)
    opened = opened.with_columns(depth=(pl.col("open") - 1).fill_null(-1))  # -1: no operator open (no match)
    found = opened.join_asof(named.select("lane", "depth", "name", op_start="start", op_end="end").sort("op_start"),
                             left_on="at", right_on="op_start", by=["lane", "depth"], strategy="backward",
                             check_sortedness=False)
    held = pl.when(pl.col("op_end") > pl.col("at")).then(pl.col("name"))
    return found.with_columns(operator=held).drop("open", "depth", "name", "op_start", "op_end", "t", strict=False)
