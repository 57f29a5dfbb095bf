"""Steps as the GPU lives them: a step spans its CPU range and all GPU work launched from inside it.

A profiler step (``ProfilerStep#N``, or the ranges ``--step-regex`` matches) is a range on the host thread
that ran it. A host that runs ahead of its GPU leaves the range while kernels it launched still run: cut
at the CPU's end, the step would lose that work and put it in the next. So each step ends at the later of
its range's end and the end of the last GPU operation launched from inside the range (by the same owner,
through the launch join); and, so that steps tile the owner's time, the next step begins at the later of
its own range's start and the end of the one before. The CPU range's end is kept (``cpu_end``).

Owners whose ranges nest or overlap (a ``--step-regex`` matching nested ranges) keep their ranges' starts;
only their ends are extended.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE

#: owner, step, ws, we, cpu_end: the columns of a step table.
STEP_SCHEMA = {"owner": pl.Int64, "step": pl.Int64, "ws": pl.Int64, "we": pl.Int64, "cpu_end": pl.Int64}
STEP_NUMBER = r"#(\d+)$"


def cpu_steps(cpu: pl.LazyFrame, step_regex: str | None) -> pl.DataFrame:
    """owner, step, ws, we: the profiler steps (``ProfilerStep#N``: step N) or the ranges ``step_regex``
    matches (numbered in order), per owner, as the host thread recorded them."""
    from pipebubble.spans import owner

    if step_regex:
        found = cpu.filter(pl.col("kind").is_in(["annotation", "step"]) & pl.col("name").str.contains(step_regex))
    else:
        named = pl.col("name").str.contains(r"^ProfilerStep#\d+$")
        found = cpu.filter((pl.col("kind") == "step") | ((pl.col("kind") == "annotation") & named))
    found = found.with_columns(owner=owner()).unique(["owner", "name", "start", "end"]).sort("owner", "start")
    number = pl.col("name").str.extract(STEP_NUMBER).cast(pl.Int64, strict=False)
    order = pl.int_range(pl.len()).over("owner").cast(pl.Int64)
    step = order if step_regex else number.fill_null(order)
    return found.select("owner", step=step, ws="start", we="end").collect(engine=ENGINE)


def step_reach(steps: pl.DataFrame, launched: pl.LazyFrame) -> pl.LazyFrame:
    """owner, step, ws, gpu_end: per host step (``cpu_steps``) that launched any, where the GPU work launched
    inside it ends. ``launched``: owner, at (the launching call's start) and end of each GPU operation whose
    launch is known (``launched``); a maximum, so the reach of a table's parts is the maximum of theirs."""
    found = launched.select("owner", "at", "end").sort("at").join_asof(
        steps.lazy().select("owner", "step", "ws", cpu="we").sort("ws"), left_on="at", right_on="ws", by="owner",
        strategy="backward", check_sortedness=False,
    ).filter(pl.col("at") < pl.col("cpu"))
    return found.group_by("owner", "step", "ws").agg(gpu_end=pl.col("end").max())


def gpu_steps(steps: pl.DataFrame, launched: pl.LazyFrame | None = None,
              reach: pl.DataFrame | None = None) -> pl.DataFrame:
    """``STEP_SCHEMA``: the host's ``steps`` (``cpu_steps``) extended to the GPU work launched inside them
    (module docstring). ``launched``: owner, at (the launching call's start) and end of each GPU operation
    whose launch is known (``launched``); or ``reach``, ``step_reach``'s of them, where it is taken already
    (a spilled table's, window by window)."""
    if steps.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    steps = steps.sort("owner", "ws")
    reached = step_reach(steps, launched) if reach is None else reach.lazy()
    table = steps.lazy().join(reached, on=["owner", "step", "ws"], how="left", nulls_equal=True).sort("owner", "ws")
    end = pl.max_horizontal("we", pl.col("gpu_end").fill_null(pl.col("we")))
    nested = (pl.col("ws") < pl.col("we").shift(1).over("owner")).any().over("owner")
    before = pl.col("_end").cum_max().shift(1).over("owner")
    start = pl.when(nested).then("ws").otherwise(pl.max_horizontal("ws", before.fill_null(pl.col("ws"))))
    table = table.with_columns(_end=end).with_columns(ws=start).with_columns(
        we=pl.max_horizontal("_end", "ws"), cpu_end="we")
    out = table.select(list(STEP_SCHEMA)).collect(engine=ENGINE)
    return out.cast(STEP_SCHEMA)  # type: ignore[arg-type]


def launched(gpu: pl.DataFrame, launch: pl.DataFrame) -> pl.LazyFrame:
    """owner, at, end: each GPU operation of ``gpu`` (``row``, owner, end) whose launch ``launch`` knows."""
    return launch.lazy().select("row", "at").join(gpu.lazy().select("row", "owner", "end"), on="row")
