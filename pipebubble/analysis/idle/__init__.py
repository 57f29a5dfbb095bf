"""The idle account and the steps every section shares: why each GPU idle interval happened, attributed
once (``account``, over the host threads' ``activity``), and steps as the GPU lives them (``steps``).

``idle_account`` is built once per file from the GPU inputs the breakdown and the strips share; they, the
findings and the report's ``idle`` table all read it, so they cannot disagree.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.idle.account import PIECE_SCHEMA, RETURN_NS, empty, ending_ops, gaps_of, pieces
from pipebubble.analysis.idle.activity import BLOCKING, WAITS, classes
from pipebubble.analysis.idle.steps import STEP_SCHEMA, cpu_steps, gpu_steps, launched, step_reach
from pipebubble.analysis.intervals import ENGINE, merge
from pipebubble.report.idle import TOP, IdleCause

__all__ = ["PIECE_SCHEMA", "STEP_SCHEMA", "cpu_steps", "gpu_steps", "held_calls", "idle_account", "launched",
           "lookback", "step_reach", "summed", "top", "top_rows"]


def idle_account(gpu: pl.DataFrame, cpu: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """The pieces (``account.PIECE_SCHEMA``) of every gap between the GPU operations ``gpu`` (``row``, lane,
    owner, start, end, correlation), the launching calls ``launch`` (``breakdown.part``'s) and the host spans
    ``cpu``."""
    if gpu.is_empty():
        return empty()
    owners = gpu.lazy().select("lane", "owner").unique()
    merged = merge(gpu.select("lane", "start", "end"), ["lane"]).lazy().join(owners, on="lane",
                                                                             maintain_order="left")
    gaps = gaps_of(merged.collect(engine=ENGINE))
    ended = ending_ops(gaps, gpu.lazy().select("lane", "row", "correlation", op_start="start"), launch)
    return pieces(ended, cpu, held_calls(launch))


def lookback(cpu: pl.LazyFrame) -> int:
    """How far before a gap the host spans that decide its cause can lie: a blocking call's refill reaches
    its own length past its return (``account``), so twice the longest call that can block or wait, and
    ``RETURN_NS``. What a spilled table's windows read of the host before their gaps."""
    found = classes()
    may = pl.any_horizontal(*(found[c] for c in (*BLOCKING, *WAITS)), pl.col("kind") == "runtime")
    longest = cpu.filter(may).select((pl.col("end") - pl.col("start")).max()).collect(engine="streaming").item()
    return 2 * int(longest or 0) + RETURN_NS


def held_calls(launch: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """lane, start: the calls whose copy or memset ended before they returned (``launch``'s ``held``)."""
    return launch.lazy().filter(pl.col("held")).select(lane="at_lane", start="at").unique().collect(engine=ENGINE)


def summed(pieces: pl.DataFrame, ranks: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """lane, rank, cause, op, call, ns, gaps: the account summed per GPU, cause, operator and call; ``ranks``:
    each lane's rank (lane, rank)."""
    return pieces.lazy().join(ranks.lazy(), on="lane", how="left").group_by("lane", "rank", "cause", "op", "call").agg(
        ns=(pl.col("end") - pl.col("start")).sum(), gaps=pl.col("gap").n_unique().cast(pl.Int64)).collect(
        engine=ENGINE)


def top(sums: pl.DataFrame) -> pl.DataFrame:
    """Of ``summed``'s rows (summed again where several windows gave them), each GPU and cause's ``TOP``
    biggest: what the findings name."""
    keys = ["lane", "rank", "cause", "op", "call"]
    sums = sums.lazy().group_by(keys).agg(pl.col("ns", "gaps").sum())
    ranked = pl.col("ns").rank("ordinal", descending=True).over("lane", "cause") <= TOP
    return sums.filter(ranked).sort("lane", "cause", "ns", descending=[False, False, True]).collect(engine=ENGINE)


def top_rows(frames: list[pl.DataFrame]) -> list[IdleCause]:
    """The report's ``idle`` rows from the files' ``summary`` frames."""
    frames = [f for f in frames if f.height]
    if not frames:
        return []
    rows = pl.concat(frames, how="vertical_relaxed").sort("lane", "cause", "ns", descending=[False, False, True])
    return [IdleCause(r["lane"], r["rank"], r["cause"], r["op"], r["call"], r["ns"], r["gaps"])
            for r in rows.iter_rows(named=True)]
