"""The breakdown rows: per GPU lane and step, the unions of its work by class and its idle time by cause
(the idle account's pieces, ``analysis/idle``, summed)."""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.idle.steps import cpu_steps
from pipebubble.analysis.intervals import ENGINE, merge_each
from pipebubble.report import Breakdown
from pipebubble.report.idle import CAUSES

KEYS = ["lane", "step"]
#: The host's step ranges (``idle.steps.cpu_steps``), for the analyses that want them as the host ran them.
steps_of = cpu_steps


def rows_in_memory(gpu: pl.DataFrame, steps: pl.DataFrame, pieces: pl.DataFrame) -> list[Breakdown]:
    """The rows of a table in memory: ``gpu`` its operations (``part.gpu_ops``, with ``row``), ``steps`` its
    steps as the GPU lives them (``idle.steps.gpu_steps``), ``pieces`` its idle account."""
    owners = gpu.lazy().select("lane", "owner").unique().collect(engine=ENGINE)
    lengths, _ = unions(gpu, owners, steps)
    return rows_of(windows_of(gpu.lazy(), owners, steps), lengths, caused(pieces, steps), attrs_of(gpu.lazy()))


def windows_of(gpu: pl.LazyFrame, owners: pl.DataFrame, steps: pl.DataFrame, engine: str = ENGINE) -> pl.DataFrame:
    """lane, step, ws, we: each GPU's whole window (first to last busy instant; step null) and its steps
    (``engine``: streaming, where ``gpu`` is a scan)."""
    windows = gpu.group_by("lane").agg(ws=pl.col("start").min(), we=pl.col("end").max()).select(
        "lane", step=pl.lit(None, pl.Int64), ws="ws", we="we")
    step_windows = owners.lazy().join(steps.lazy(), on="owner").select("lane", "step", "ws", "we")
    both = pl.concat([windows, step_windows.cast(windows.collect_schema())])  # type: ignore[arg-type]
    return both.collect(engine=engine)


def attrs_of(gpu: pl.LazyFrame, engine: str = "auto") -> pl.DataFrame:
    """Each GPU lane's rank, pid and device (the same on all its spans)."""
    return gpu.group_by("lane").agg(pl.col("rank", "pid", "device").first()).collect(engine=engine)


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
    causes["unknown"] += idle - sum(causes.values())  # idle outside every gap (before or after the GPU's work)
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


def _by_step(frame: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """``frame``'s intervals (with ``owner``) cut to the steps they overlap, with ``step``: most lie in one
    step (found by an as-of join on their start); the few that cross a step's edge are cut by a join with
    their owner's steps."""
    if frame.is_empty() or steps.is_empty():
        return frame.with_columns(step=pl.lit(None, pl.Int64)).clear()
    steps = steps.select("owner", "step", "ws", "we").sort("owner", "ws")
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


def caused(pieces: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Idle ns per (lane, step) and cause (``CAUSES`` as columns; step null: the whole window) from the idle
    account's ``pieces`` (lane, owner, start, end, cause), each cut to the steps it overlaps."""
    empty = pl.DataFrame(schema={"lane": pl.String, "step": pl.Int64, **{c: pl.Int64 for c in CAUSES}})
    if pieces.is_empty():
        return empty
    both = pieces.lazy().select("lane", step=pl.lit(None, pl.Int64), cause="cause", start="start", end="end")
    if steps.height:
        stepped = _by_step(pieces.filter(pl.col("owner").is_not_null()).select("lane", "owner", "cause", "start",
                                                                               "end"), steps)
        both = pl.concat([both, stepped.lazy().select(*KEYS, "cause", "start", "end")])
    ns = pl.col("end") - pl.col("start")
    wide = both.group_by(KEYS).agg(ns.filter(pl.col("cause") == c).sum().alias(c) for c in CAUSES)
    return wide.cast(empty.schema).collect(engine=ENGINE)  # type: ignore[arg-type]
