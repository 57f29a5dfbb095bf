"""The breakdown rows: per GPU lane and step, the unions of its work by class and its idle time by cause."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.intervals import ENGINE, merge, merge_each
from pipebubble.report import Breakdown
from pipebubble.spans import is_comm, owner

CAUSES = ("host_launch", "sync", "peer", "other")
KEYS = ["lane", "step"]


def rows_in_memory(
    gpu: pl.DataFrame, cpu: pl.DataFrame, launch: pl.DataFrame, step_regex: str | None
) -> list[Breakdown]:
    """The rows of a table in memory: ``gpu`` its operations (``part.gpu_ops``, with ``row``), ``cpu`` the rest,
    ``launch`` the call that launched each operation (row, at_lane, at, start)."""
    steps = steps_of(cpu.lazy(), step_regex)
    owners = gpu.lazy().select("lane", "owner").unique().collect(engine=ENGINE)
    lengths, merged = unions(gpu, owners, steps)
    ops = gpu.lazy().select("lane", "row", "correlation", op_start="start")
    ended = ending_ops(gaps_of(merged), ops, launch)
    causes = idle_causes(ended, blocked_of(cpu.lazy()), steps)
    return rows_of(windows_of(gpu.lazy(), owners, steps), lengths, causes, attrs_of(gpu.lazy()))


def windows_of(gpu: pl.LazyFrame, owners: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """lane, step, ws, we: each GPU's whole window (first to last busy instant; step null) and its steps."""
    windows = gpu.group_by("lane").agg(ws=pl.col("start").min(), we=pl.col("end").max()).select(
        "lane", step=pl.lit(None, pl.Int64), ws="ws", we="we")
    step_windows = owners.lazy().join(steps.lazy(), on="owner").select("lane", "step", "ws", "we")
    both = pl.concat([windows, step_windows.cast(windows.collect_schema())])  # type: ignore[arg-type]
    return both.collect(engine=ENGINE)


def attrs_of(gpu: pl.LazyFrame) -> pl.DataFrame:
    """Each GPU lane's rank, pid and device (the same on all its spans)."""
    return gpu.group_by("lane").agg(pl.col("rank", "pid", "device").first()).collect()


def rows_of(wins: pl.DataFrame, unions: pl.DataFrame, causes: pl.DataFrame, attrs: pl.DataFrame) -> list[Breakdown]:
    """The breakdown rows from the windows, the unions' lengths and the idle causes per (lane, step)."""
    table = wins.lazy().join(unions.lazy(), on=KEYS, how="left", nulls_equal=True).with_columns(
        pl.col(c).fill_null(0) for c in unions.columns if c not in KEYS
    )
    table = table.join(causes.lazy(), on=KEYS, how="left", nulls_equal=True)
    table = table.join(attrs.lazy(), on="lane").sort("lane", pl.col("step").is_not_null(), "step")
    return [_row(r) for r in table.collect(engine=ENGINE).iter_rows(named=True)]


def _row(r: dict) -> Breakdown:
    window = r["we"] - r["ws"]
    busy = r["all"]
    idle = window - busy
    causes = {c: int(r.get(c) or 0) for c in CAUSES}
    causes["other"] += idle - sum(causes.values())  # idle outside every gap (before or after the GPU's work)
    comm = r["comm"]
    return Breakdown(
        lane=r["lane"], rank=r["rank"], pid=r["pid"], device=r["device"], step=r["step"],
        window_start_ns=r["ws"], window_ns=window, compute_ns=r["compute"], comm_ns=comm,
        comm_exposed_ns=r["busy"] - r["compute"], memory_ns=r["memory"], memory_exposed_ns=busy - r["busy"],
        idle_ns=idle, idle_causes=causes, overlap=(comm - (r["busy"] - r["compute"])) / comm if comm else None,
    )


def unions(gpu: pl.DataFrame, owners: pl.DataFrame, steps: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """|∪| per (lane, step) of compute, comm, memory, compute ∪ comm (``busy``) and all work (``all``), and
    the merged intervals of all work (lane, owner, start, end). All five are merged from one sort of the
    operations (``intervals.merge_each``), each then cut to the steps: a union inside a step is the whole
    union's part in it."""
    classes = gpu.select("lane", "start", "end", union=pl.col("cls").cast(pl.String))
    tagged = merge_each(classes, ["lane"], "union", _OF_CLASSES)  # each op's class in, each piece's union out
    ns = (pl.col("end") - pl.col("start")).sum()
    long = tagged.lazy().group_by("lane", "union").agg(ns=ns).with_columns(step=pl.lit(None, pl.Int64))
    if steps.height:
        stepped = _by_step(tagged.join(owners, on="lane"), steps).lazy().group_by(*KEYS, "union").agg(ns=ns)
        long = pl.concat([long, stepped.select(long.collect_schema().names())])
    wide = long.group_by(KEYS).agg(pl.col("ns").filter(pl.col("union") == name).sum().alias(name) for name in UNIONS)
    every = tagged.lazy().filter(pl.col("union") == "all").select("lane", "start", "end")
    wide, every = pl.collect_all([wide, every.join(owners.lazy(), on="lane", maintain_order="left")], engine=ENGINE)
    return wide, every


#: The unions ``unions`` measures: by class, compute ∪ comm, and all work.
UNIONS = ("compute", "comm", "memory", "busy", "all")
#: The classes (``part.gpu_ops``'s ``cls``) each union holds.
_OF_CLASSES = {
    "compute": ["compute"], "comm": ["comm"], "memory": ["memcpy", "memset"], "busy": ["compute", "comm"],
    "all": ["compute", "comm", "memcpy", "memset"],
}


STEP_NUMBER = r"#(\d+)$"


def steps_of(cpu: pl.LazyFrame, step_regex: str | None) -> pl.DataFrame:
    """owner, step, ws, we: the profiler steps (``ProfilerStep#N``: step N) or the ranges ``step_regex``
    matches (numbered in order), per owner."""
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


def _by_step(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s intervals (with ``owner``) cut to the steps they overlap, with ``step``: most lie in one
    step (found by an as-of join on their start); the few that cross a step's edge are cut by a join with
    their owner's steps."""
    if frame.is_empty() or steps.is_empty():
        return frame.with_columns(step=pl.lit(None, pl.Int64)).clear()
    steps = steps.sort("owner", "ws")
    # Owners whose steps overlap (nested ranges a --step-regex matched): every span joins each step it meets.
    overlapping = steps.filter(pl.col("ws") < pl.col("we").shift(1).over("owner"))["owner"].unique()
    if overlapping.len():
        mine = pl.col("owner").is_in(overlapping.implode())
        nested = _cut(frame.filter(mine), steps.filter(mine))
        rest = _by_step(frame.filter(~mine), steps.filter(~mine))
        return pl.concat([rest.select(*frame.columns, "step"), nested.select(*frame.columns, "step")])
    steps = steps.sort("ws")
    probe = frame.sort("start").join_asof(
        steps, left_on="start", right_on="ws", by="owner", strategy="backward", check_sortedness=False
    )
    inside = pl.col("we").is_not_null() & (pl.col("end") <= pl.col("we"))
    simple = probe.filter(inside).drop("ws", "we")
    rest = probe.filter(~inside).drop("step", "ws", "we")
    after = steps.select("owner", next_ws="ws")
    rest = rest.sort("start").join_asof(after, left_on="start", right_on="next_ws", by="owner",
                                        strategy="forward", check_sortedness=False)
    # Only what reaches past a step's edge or into the next step is cut; the rest lies outside every step.
    prev_end = rest.join_asof(steps.select("owner", prev_ws="ws", prev_we="we"), left_on="start",
                              right_on="prev_ws", by="owner", strategy="backward", check_sortedness=False)
    crossing = prev_end.filter(
        (pl.col("prev_we").is_not_null() & (pl.col("end") > pl.col("prev_we")) & (pl.col("start") < pl.col("prev_we")))
        | (pl.col("next_ws").is_not_null() & (pl.col("end") > pl.col("next_ws")))
    ).drop("next_ws", "prev_ws", "prev_we")
    return pl.concat([simple, _cut(crossing, steps).select(simple.columns)])


def _cut(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Each span of ``frame`` cut to every step of its owner it overlaps."""
    cut = frame.join(steps, on="owner").filter((pl.col("start") < pl.col("we")) & (pl.col("end") > pl.col("ws")))
    return cut.with_columns(start=pl.max_horizontal("start", "ws"), end=pl.min_horizontal("end", "we")).drop("ws", "we")


def gaps_of(merged: pl.DataFrame) -> pl.DataFrame:
    """lane, owner, start, end: the gaps between each GPU's ``merged`` work (lane, owner, start, end)."""
    return (
        merged.lazy().with_columns(gap_start=pl.col("end").shift(1).over("lane"))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select("lane", "owner", start="gap_start", end="start")
        .collect(engine=ENGINE)
    )


def ending_ops(gaps: pl.DataFrame, ops: pl.DataFrame | pl.LazyFrame, launch: pl.DataFrame | None = None
               ) -> pl.DataFrame:
    """Each gap with the ``row`` of the op that ended it: the one that starts at its end (``op_start``; among
    equals the lowest correlation id, then row, whatever order the table holds them in); given ``launch``
    (row, at_lane, at, start), with the call that launched it (``at_lane``, ``at``; null where none is known)."""
    ops = ops.lazy().select("lane", "op_start", "row", "correlation").sort("op_start", "correlation", "row")
    nxt = gaps.lazy().sort("end").join_asof(ops, left_on="end", right_on="op_start", by="lane", strategy="forward",
                                            check_sortedness=False).select("lane", "owner", "start", "end", "row")
    if launch is not None:
        nxt = nxt.join(launch.lazy().drop("start"), on="row", how="left")
    return nxt.collect(engine=ENGINE)


def blocked_of(cpu: pl.LazyFrame) -> dict[str, pl.DataFrame]:
    """Per thread, the merged intervals in which it was in a synchronize (``in_sync``) or in a collective or
    point-to-point call (``in_peer``): a GPU gap that began there was the host's wait, not its lateness."""
    sync = pl.col("kind") == "sync"
    ranges = pl.col("kind").is_in(["cpu_op", "annotation", "comm"]) & is_comm()
    flag = pl.when(sync).then(pl.lit("in_sync")).otherwise(pl.lit("in_peer"))
    found = cpu.filter(sync | ranges).select("lane", "start", "end", flag=flag).collect(engine=ENGINE)
    merged = merge(found, ["flag", "lane"])
    parts = merged.partition_by("flag", as_dict=True, include_key=False, maintain_order=True)
    empty = pl.DataFrame(schema={c: t for c, t in merged.schema.items() if c != "flag"})
    return {name: parts.get((name,), empty) for name in ("in_sync", "in_peer")}


def idle_causes(ended: pl.DataFrame, blocked: dict[str, pl.DataFrame], steps: pl.DataFrame) -> pl.DataFrame:
    """Idle ns per (lane, step) and cause, from the gaps (lane, owner, start, end) with the launch of the op
    that ended each (``at_lane``, ``at``; null where none is known)."""
    empty = pl.DataFrame(schema={"lane": pl.String, "step": pl.Int64, **{c: pl.Int64 for c in CAUSES}})
    if ended.is_empty():
        return empty
    nxt = ended.lazy()
    for flag, intervals in blocked.items():
        marks = intervals.lazy().select(at_lane="lane", b_start="start", b_end="end").sort("b_start")
        nxt = nxt.sort("start").join_asof(marks, left_on="start", right_on="b_start", by="at_lane",
                                          strategy="backward", check_sortedness=False)
        nxt = nxt.with_columns((pl.col("start") < pl.col("b_end")).fill_null(False).alias(flag)).drop(
            "b_start", "b_end"
        )
    cause = (
        pl.when(pl.col("in_sync")).then(pl.lit("sync"))
        .when(pl.col("in_peer")).then(pl.lit("peer"))
        .when(pl.col("at") > pl.col("start")).then(pl.lit("host_launch"))
        .otherwise(pl.lit("other"))
    )
    gaps = nxt.select("lane", "owner", "start", "end", cause=cause)
    both = gaps.select("lane", step=pl.lit(None, pl.Int64), cause="cause", start="start", end="end")
    if steps.height:
        stepped = _by_step(gaps.filter(pl.col("owner").is_not_null()).collect(engine=ENGINE), steps)
        both = pl.concat([both, stepped.lazy().select(*KEYS, "cause", "start", "end")])
    ns = pl.col("end") - pl.col("start")
    wide = both.group_by(KEYS).agg(ns.filter(pl.col("cause") == c).sum().alias(c) for c in CAUSES)
    return wide.cast(empty.schema).collect(engine=ENGINE)  # type: ignore[arg-type]


