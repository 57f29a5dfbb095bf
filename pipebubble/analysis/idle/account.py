"""The idle account: every GPU idle interval attributed once, to what held the GPU's next work back.

A gap on a GPU (between the merged intervals of all its work) ends when an operation starts. Follow that
operation back to the runtime call that launched it (``launches``), on its host thread:

- no launch known: ``unknown``;
- a blocking call (a synchronize, a blocking copy, the allocator; or any call that began at least
  ``BLOCKED_NS`` before the GPU ran dry and returned within ``RETURN_NS`` after: it waited for the GPU,
  whatever its name) that the thread was in when the GPU ran dry, or had returned from shortly before:
  a call that blocked for D had kept the host D ahead of the GPU; once it returns the queue is empty and
  the host refills it, so the gap up to D after its return (at least ``RETURN_NS``) is the call's, the
  refill included, not the host's. A collective or send/recv call (waiting for a peer) or the data loader
  the thread was in when the GPU ran dry: the gap up to the wait's end is the wait's;
- the rest of the gap: from its start to the launch, what the thread was doing (``activity``: an operator,
  Python or untraced time, a collective, the data loader, other runtime calls, a blocking call), split at
  its boundaries; from the launch to its return and ``LATENCY_NS`` after, the launch itself (``launch``);
- the rest, while the operation was queued but did not start (launched before the gap began, or long
  after its call returned): the thread's blocking calls over that time (a blocking copy that holds the
  device), else ``dependency`` (an event or another stream held it).

The pieces tile every gap exactly; the breakdown sums them per step, the timeline strips bin them, and the
findings read their causes and operators (``report.idle``).
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.idle.activity import BLOCKING, LAUNCH_CALLS, WAITS, activity, classes, outermost
from pipebubble.analysis.intervals import ENGINE, merge

#: A call that began this long before the GPU ran dry and returned just after waited for it.
BLOCKED_NS = 100_000
#: How soon after the GPU's work ends a call that waited for it returns (µs clocks round both).
RETURN_NS = 50_000
#: From a launch call's return to its operation's start on an idle GPU: the launch's own latency.
LATENCY_NS = 50_000
#: Launch calls, which block only while the GPU's queue is full (never because it ran dry).
LAUNCHES = LAUNCH_CALLS
PIECE_SCHEMA = {"lane": pl.String, "owner": pl.Int64, "gap": pl.Int64, "start": pl.Int64, "end": pl.Int64,
                "cause": pl.String, "op": pl.String, "call": pl.String}
_KEEP = ["lane", "owner", "gap"]


def empty() -> pl.DataFrame:
    return pl.DataFrame(schema=PIECE_SCHEMA)


def pieces(ended: pl.DataFrame, cpu: pl.DataFrame, held: pl.DataFrame | None = None) -> pl.DataFrame:
    """``PIECE_SCHEMA``: the gaps ``ended`` (lane, owner, start, end and the launch of the op that ended each:
    at_lane, at, at_end, at_call) split into pieces by cause (module docstring). ``cpu``: the host spans of
    the launching threads; ``held``: (lane, start) of calls whose copy ended before they returned."""
    if ended.is_empty():
        return empty()
    # A launch recorded after its op began (a host clock ahead of the GPU's) is taken at the op's start.
    gaps = ended.lazy().with_row_index("gap").with_columns(pl.col("gap").cast(pl.Int64),
                                                           at=pl.min_horizontal("at", "end"))
    lanes = ended.select(pl.col("at_lane").unique().drop_nulls())["at_lane"]
    threads = cpu.filter(pl.col("lane").is_in(lanes.implode()))
    known = pl.col("at").is_not_null() & pl.col("at_lane").is_not_null()
    waits, host = _threads(threads, gaps.filter(known & (pl.col("at") >= pl.col("start"))), held)
    unknown = gaps.filter(~known).select(*_KEEP, "start", "end", cause=pl.lit("unknown"), op=pl.lit(None, pl.String),
                                         call=pl.lit(None, pl.String))
    found = _blocked(gaps.filter(known), waits)
    cut = pl.min_horizontal("end", "b_reach")
    blocked = found.filter(pl.col("b_cause").is_not_null()).select(
        *_KEEP, "start", end=cut, cause="b_cause", op="b_op", call="b_call")
    rest = found.with_columns(start=pl.when(pl.col("b_cause").is_not_null()).then(cut).otherwise("start")).filter(
        pl.col("end") > pl.col("start"))
    behind = rest.filter(pl.col("at") >= pl.col("start"))
    latency_end = pl.min_horizontal("end", pl.max_horizontal("at", "at_end") + LATENCY_NS)
    launch = behind.select(*_KEEP, start="at", end=latency_end, cause=pl.lit("launch"), op=pl.lit(None, pl.String),
                           call="at_call").filter(pl.col("end") > pl.col("start"))
    queued = pl.concat([rest.filter(pl.col("at") < pl.col("start")).select(*_KEEP, "at_lane", "start", "end"),
                        behind.select(*_KEEP, "at_lane", start=latency_end, end="end")])
    out = pl.concat([unknown, blocked, _met(behind.select(*_KEEP, "at_lane", "start", end="at"), host, False),
                     _launch_op(launch, behind, host), _met(queued, waits, True)])
    return out.filter(pl.col("end") > pl.col("start")).sort("lane", "start").collect(engine=ENGINE).cast(
        PIECE_SCHEMA)  # type: ignore[arg-type]


def _threads(cpu: pl.DataFrame, behind: pl.LazyFrame, held: pl.DataFrame | None) -> tuple[pl.LazyFrame, pl.LazyFrame]:
    """The launching threads' segments (``activity``, numbered ``seg`` per thread) the account reads, from two
    subsets of their spans, each classed as the whole would class it: the waits and blocking calls (and the
    long calls of any name that may have waited for the GPU), whatever their time, for the gaps a call owns
    and the time an op waited queued; and every span near a gap whose launch came after it began (``behind``),
    for that host time. A GPU-bound trace's threads are then read only where they block."""
    found = classes(held)
    long_call = (pl.col("kind") == "runtime") & ~pl.col("name").str.contains(LAUNCHES) & (
        pl.col("end") - pl.col("start") >= BLOCKED_NS)
    may_wait = pl.any_horizontal(*(found[c] for c in (*WAITS, *BLOCKING)), long_call)
    windows = behind.select(lane="at_lane", s=pl.col("start") - 1, e=pl.col("at") + 1).collect(engine=ENGINE)
    near = _near(cpu, merge(windows, ["lane"], "s", "e")) if windows.height else cpu.clear()
    number = pl.int_range(pl.len()).over("at_lane").cast(pl.Int64)
    outer, lanes = outermost(cpu), cpu["lane"].unique()
    return tuple(activity(subset, held, outer, lanes).lazy().with_columns(seg=number)
                 for subset in (cpu.filter(may_wait), near))


def _near(spans: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """The ``spans`` that meet one of the disjoint ``windows`` (lane, s, e) of their thread: the last window
    that begins by a span's end ends after its start."""
    found = spans.lazy().sort("end").join_asof(windows.lazy().sort("s"), left_on="end", right_on="s", by="lane",
                                               strategy="backward", check_sortedness=False)
    return found.filter(pl.col("e") > pl.col("start")).drop("s", "e").collect(engine=ENGINE)


def _blocked(gaps: pl.LazyFrame, segments: pl.LazyFrame) -> pl.LazyFrame:
    """``gaps`` with ``b_cause``, ``b_op``, ``b_call`` and ``b_reach``: the call the gap's start belongs to,
    and until when (module docstring): the last blocking or waiting segment of its launching thread that began
    before the gap, if the gap began while it ran or, for a blocking call, within the refill after it; or a
    long call of any name that returned just after the gap began."""
    keep = segments.filter(pl.col("cause").is_in([*BLOCKING, *WAITS])).select(
        "at_lane", s="start", e="end", b_cause="cause", b_op="op", b_call="call").sort("s")
    probe = gaps.with_columns(probe=pl.col("start") - 1).sort("probe")
    found = probe.join_asof(keep, left_on="probe", right_on="s", by="at_lane", strategy="backward",
                            check_sortedness=False)
    blocking = pl.col("b_cause").is_in(BLOCKING)
    reach = pl.when(blocking).then(pl.col("e") + pl.max_horizontal(pl.col("e") - pl.col("s"), pl.lit(RETURN_NS)))
    reach = reach.otherwise("e")
    refill = pl.col("s").is_not_null() & (pl.col("start") < reach) & (
        (pl.col("e") <= pl.col("at")) | ~blocking)
    found = found.with_columns(pl.when(refill).then(pl.col(c)).alias(c) for c in ("b_cause", "b_op", "b_call"))
    found = found.with_columns(b_reach=pl.when(refill).then(reach)).drop("s", "e")
    calls = (pl.col("cause") == "launch") & ~pl.col("call").str.contains(LAUNCHES)
    any_call = segments.filter(calls).select("at_lane", s="start", e="end", w_op="op",
                                                                    w_call="call").sort("s")
    found = found.sort("probe").join_asof(any_call, left_on="probe", right_on="s", by="at_lane",
                                          strategy="backward", check_sortedness=False)
    waited = (pl.col("s") <= pl.col("start") - BLOCKED_NS) & (pl.col("e") >= pl.col("start")) & (
        pl.col("e") <= pl.col("start") + RETURN_NS) & pl.col("b_cause").is_null()
    return found.with_columns(
        b_cause=pl.when(waited).then(pl.lit("sync_stall")).otherwise("b_cause"),
        b_op=pl.when(waited).then("w_op").otherwise("b_op"), b_call=pl.when(waited).then("w_call").otherwise("b_call"),
        b_reach=pl.when(waited).then(pl.col("e") + pl.max_horizontal(pl.col("e") - pl.col("s"), pl.lit(RETURN_NS)))
        .otherwise("b_reach"),
    ).drop("probe", "s", "e", "w_op", "w_call")


def _met(spans: pl.LazyFrame, segments: pl.LazyFrame, queued: bool) -> pl.LazyFrame:
    """The pieces of ``spans`` (lane, owner, gap, at_lane, start, end) by the launching thread's segments they
    meet, clipped. ``queued``: time an operation waited on the GPU, whose thread's blocking calls keep their
    class and all else is ``dependency``."""
    first = segments.select("at_lane", s="start", i0="seg").sort("s")
    last = segments.select("at_lane", s="start", i1="seg").sort("s")
    found = spans.filter(pl.col("end") > pl.col("start")).sort("start").join_asof(
        first, left_on="start", right_on="s", by="at_lane", strategy="backward", check_sortedness=False).drop("s")
    found = found.with_columns(stop=pl.col("end") - 1).sort("stop").join_asof(
        last, left_on="stop", right_on="s", by="at_lane", strategy="backward", check_sortedness=False).drop("s")
    met = found.with_columns(seg=pl.int_ranges("i0", pl.col("i1") + 1)).explode("seg")
    met = met.join(segments, on=["at_lane", "seg"], suffix="_seg")
    lo, hi = pl.max_horizontal("start", "start_seg"), pl.min_horizontal("end", "end_seg")
    if queued:
        mine = pl.col("cause").is_in(BLOCKING)
        return met.filter(hi > lo).select(
            *_KEEP, start=lo, end=hi, cause=pl.when(mine).then("cause").otherwise(pl.lit("dependency")),
            op=pl.when(mine).then("op"), call=pl.when(mine).then("call"))
    return met.filter(hi > lo).select(*_KEEP, start=lo, end=hi, cause="cause", op="op", call="call")


def _launch_op(launch: pl.LazyFrame, behind: pl.LazyFrame, segments: pl.LazyFrame) -> pl.LazyFrame:
    """The launch pieces with the operator around each launching call; a launch that loaded its code
    (``activity``'s ``startup``) is start-up, not launch overhead."""
    seg = segments.select("at_lane", s="start", s_op="op", s_cause="cause").sort("s")
    calls = behind.select("gap", "at_lane", "at").sort("at").join_asof(
        seg, left_on="at", right_on="s", by="at_lane", strategy="backward", check_sortedness=False)
    cause = pl.when(pl.col("s_cause") == "startup").then(pl.lit("startup")).otherwise("cause")
    return launch.join(calls.select("gap", "s_op", "s_cause"), on="gap", how="left").select(
        *_KEEP, "start", "end", cause=cause, op="s_op", call="call")


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
