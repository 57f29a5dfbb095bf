"""Map: one file's graph for the critical path (``CriticalPart``): its GPU runs, its host threads' waits on
the GPU, when each host thread was busy, and its steps as the GPU lives them, all small enough to cross to
the reduce.

A run is a stretch of one stream's work that stream order alone explains: each next operation of the same
class (compute or memory) was launched before the stream went idle (its launch call began before the
previous operation ended) and started within ``MERGE_GAP_NS`` of it. Every communication kernel is a run of
its own, so the reduce can find it among the matched collectives and send/recv pairs by its times. A run
keeps its first operation's launch (``at_lane``, ``at``) and what its span holds: memory time, gaps the host
caused (``host_ns``), other gaps (``wait_ns``); the rest is compute.

Bound: at most ``RUNS_PER_STEP`` runs of compute and memory per profiler step of the file (one step for a
file without steps), plus its communication kernels (one per collective call, as the collective part holds).
A file over that merges its shortest gaps first (host-caused ones too, whose time the runs keep as
``host_ns``) until it fits. The bound is each file's own: spans of a batch of rank files (``source``) are
bounded file by file, as each alone.

A host call waited for the GPU when its class is a blocking one (``idle.activity``: a synchronize, a blocking
copy, the allocator) or when it is any other runtime call that began at least ``idle.account.BLOCKED_NS``
before and returned within ``RETURN_NS`` after its participant's GPU work ended (the idle account's rule).
Each host thread's time is busy where one of its spans has a class (an operator, a runtime call, a
collective or data-loader range) and idle elsewhere (Python or nothing traced); busy stretches closer than
``THREAD_GAP_NS`` are one, each marked with whether it launched GPU work. Bounded like the runs: at most the
file's limit of stretches per thread, the shortest pauses joined first.

Steps are ``idle.steps.gpu_steps``: each host step range extended to the end of the GPU work launched inside
it (``cpu_end`` keeps the range's own end), so the breakdown, the strips and the path share one step.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.comm.collectives import participant
from pipebubble.analysis.idle.account import BLOCKED_NS, RETURN_NS
from pipebubble.analysis.idle.activity import BLOCKING, CLASSES, classes
from pipebubble.analysis.idle.steps import cpu_steps, gpu_steps, launched
from pipebubble.analysis.intervals import ENGINE, merge
from pipebubble.analysis.launches import OP_KEY, with_launch
from pipebubble.spans import GPU_WORK, owner

#: Two operations of one stream, the second launched before the first ended and starting at most this long
#: after it, are one run (the GPU's own scheduling latency, a few µs, is not a dependency worth a node).
MERGE_GAP_NS = 5_000
#: Runs of compute and memory kept per profiler step of a file (module docstring).
RUNS_PER_STEP = 2_000
#: A synchronize returns a little after the work it waited for ended (µs clocks round both).
SYNC_SLACK_NS = 2_000
#: A host thread's busy spans closer than this are one busy stretch (Python between operators); a longer
#: pause is one the thread may spend waiting for another thread of its process.
THREAD_GAP_NS = 50_000

NODE_SCHEMA = {"node": pl.Int64, "who": pl.Int64, "rank": pl.Int32, "pid": pl.Int64, "lane": pl.String,
               "stream": pl.Int64, "cls": pl.String, "start": pl.Int64, "end": pl.Int64, "at_lane": pl.String,
               "at": pl.Int64, "memory_ns": pl.Int64, "host_ns": pl.Int64, "wait_ns": pl.Int64}
BLOCK_SCHEMA = {"who": pl.Int64, "lane": pl.String, "start": pl.Int64, "end": pl.Int64, "release": pl.Int64,
                "release_end": pl.Int64}
STEP_SCHEMA = {"who": pl.Int64, "step": pl.Int64, "lane": pl.String, "start": pl.Int64, "end": pl.Int64,
               "cpu_end": pl.Int64}
THREAD_SCHEMA = {"who": pl.Int64, "pid": pl.Int64, "lane": pl.String, "start": pl.Int64, "end": pl.Int64,
                 "launches": pl.Boolean}
#: The times each frame holds: what ``shifted`` moves onto the job's clock.
TIMES = {"nodes": ("start", "end", "at"), "blocks": ("start", "end", "release_end"),
         "steps": ("start", "end", "cpu_end"), "threads": ("start", "end")}


@dataclass(frozen=True)
class CriticalPart:
    """One file's critical-path graph. ``nodes``: GPU runs (``NODE_SCHEMA``; ``node`` numbers them within
    the file); ``blocks``: host calls blocked on the GPU and the run that released each (``release``, at
    ``release_end``); ``steps``: each participant's steps as the GPU lives them, the thread that ran them
    and the end of their host range (``cpu_end``); ``threads``: each host thread's busy stretches
    (``THREAD_SCHEMA``)."""

    nodes: pl.DataFrame
    blocks: pl.DataFrame
    steps: pl.DataFrame
    threads: pl.DataFrame

    FRAMES = ("nodes", "blocks", "steps", "threads")

    def shifted(self, offset: int) -> CriticalPart:
        """The part with ``offset`` taken off every time it holds (its file's clock moved onto the job's)."""
        frames = {name: getattr(self, name) for name in TIMES}
        return CriticalPart(**{k: f.with_columns(pl.col(c) - offset for c in TIMES[k]) for k, f in frames.items()})

    def by_participant(self) -> dict[int, CriticalPart]:
        """The part of each participant (``who``) it holds: a batch's part split as each file's alone (node
        numbers kept)."""
        split = {name: _by_who(getattr(self, name)) for name in self.FRAMES}
        whos = dict.fromkeys(who for name in self.FRAMES for who in split[name])
        return {who: CriticalPart(**{name: split[name].get(who, getattr(self, name).clear()) for name in self.FRAMES})
                for who in whos}

    def cleared(self) -> CriticalPart:
        """The part without rows (a participant of a batch with no GPU work)."""
        return CriticalPart(**{name: getattr(self, name).clear() for name in self.FRAMES})


def _by_who(frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
    return {rows["who"][0]: rows for rows in frame.partition_by("who", maintain_order=True)}


def empty_part() -> CriticalPart:
    return CriticalPart(*(pl.DataFrame(schema=s) for s in (NODE_SCHEMA, BLOCK_SCHEMA, STEP_SCHEMA, THREAD_SCHEMA)))


def critical_part(spans: pl.DataFrame, step_regex: str | None = None, lived: pl.DataFrame | None = None
                  ) -> CriticalPart:
    """Map: the file's runs, blocked host calls, steps and host threads' busy stretches (``CriticalPart``;
    empty without GPU work). ``lived``: the table's steps as the GPU lives them (``idle.steps.STEP_SCHEMA``),
    where the caller has them (the breakdown's inputs), so that both read one step table."""
    ops = _ops(spans)
    if ops.is_empty():
        return empty_part()
    calls = _calls(spans, ops)
    steps = _steps(calls, ops, step_regex, lived)
    limits = _limits(ops, steps)
    ops = _runs(ops, limits)
    nodes = _nodes(ops)
    return CriticalPart(nodes, _blocks(calls, nodes), steps, _threads(calls, ops, limits))


def _ops(spans: pl.DataFrame) -> pl.DataFrame:
    """The file's GPU operations, each with its class, participant and launch (``at_lane``, ``at``), sorted
    by stream and start."""
    gpu = spans.lazy().filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK))
    cls = (pl.when(pl.col("kind") == "comm").then(pl.lit("comm"))
           .when(pl.col("kind").is_in(["memcpy", "memset"])).then(pl.lit("memory")).otherwise(pl.lit("compute")))
    launched = with_launch(gpu, spans.lazy(), key=OP_KEY)
    ops = launched.select(*OP_KEY, "rank", "pid", "at_lane", "at", "at_end", who=participant(), cls=cls)
    return ops.sort("lane", "stream", "start", "end").collect(engine=ENGINE)


def _limits(ops: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """source, limit: the runs of compute and memory each file may keep (``RUNS_PER_STEP`` per profiler step
    of its participants, one step for a file without steps)."""
    per_who = steps.group_by("who").len("steps")
    files = ops.lazy().select("source", "who").unique().join(per_who.lazy(), on="who", how="left")
    steps_of_file = files.group_by("source").agg(pl.col("steps").fill_null(0).sum())
    limit = pl.max_horizontal(pl.col("steps"), 1) * RUNS_PER_STEP
    return steps_of_file.select("source", limit=limit.cast(pl.Int64)).collect(engine=ENGINE)


def _runs(ops: pl.DataFrame, limits: pl.DataFrame) -> pl.DataFrame:
    """``ops`` with their ``run`` (module docstring), ``gap`` (idle since the stream's previous work) and
    whether the host caused it (``late``: launched after the stream went idle). A file with more runs than
    its limit (``limits``) joins every soft break but its ``keep`` longest gaps (the first among equal
    ones), where a stream's first operation and those beside communication always break."""
    by = ["lane", "stream"]
    reach = pl.col("end").cum_max().shift(1).over(by)
    prev = pl.col("cls").shift(1).over(by)
    ops = ops.with_columns(gap=(pl.col("start") - reach).clip(lower_bound=0), late=pl.col("at") > reach,
                           soft=reach.is_not_null() & (pl.col("cls") != "comm") & (prev != "comm"))
    joins = pl.col("soft") & (pl.col("cls") == prev) & ~pl.col("late").fill_null(False) & (
        pl.col("gap") <= MERGE_GAP_NS)
    counted = pl.col("cls") != "comm"
    runs = (counted.sum() - (pl.col("join") & counted).sum()).over("source")
    keep = pl.max_horizontal(pl.col("limit") - (counted & ~pl.col("soft")).sum().over("source"), 0)
    longest = pl.when("soft").then("gap").rank("ordinal", descending=True).over("source") <= keep
    capped = pl.col("soft") & ~longest.fill_null(False)
    ops = ops.with_columns(join=joins).join(limits, on="source", how="left", maintain_order="left")
    ops = ops.with_columns(join=pl.when(runs > pl.col("limit")).then(capped).otherwise("join")).drop("limit")
    return ops.with_columns(run=(~pl.col("join")).cum_sum())


def _nodes(ops: pl.DataFrame) -> pl.DataFrame:
    """One row per run (``NODE_SCHEMA``): its span, first launch and what its span holds."""
    dur = pl.col("end") - pl.col("start")
    joined, late = pl.col("join"), pl.col("late").fill_null(False)
    runs = ops.lazy().group_by("run").agg(
        pl.col("who", "rank", "pid", "lane", "stream", "at_lane", "at").first(),
        start=pl.col("start").min(), end=pl.col("end").max(),
        memory_ns=dur.filter(pl.col("cls") == "memory").sum(), compute_ns=dur.filter(pl.col("cls") == "compute").sum(),
        host_ns=pl.col("gap").filter(joined & late).sum(), wait_ns=pl.col("gap").filter(joined & ~late).sum(),
        comm=(pl.col("cls") == "comm").any(),
    )
    cls = pl.when("comm").then(pl.lit("comm")).when(pl.col("memory_ns") > pl.col("compute_ns")).then(
        pl.lit("memory")).otherwise(pl.lit("compute"))
    runs = runs.sort("run").with_columns(node=pl.col("run").cast(pl.Int64) - 1, cls=cls)
    return runs.select(list(NODE_SCHEMA)).cast(NODE_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]


def _calls(spans: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """The host spans of the participants whose GPU work ``ops`` holds, with ``who`` and their class
    (``cls``: the first of ``idle.activity.CLASSES`` they belong to, a copy call whose copy ended before it
    returned a blocking one; null for ranges that only label time)."""
    held = ops.filter((pl.col("cls") == "memory") & (pl.col("end") > pl.col("at")) & (pl.col("end") <= pl.col(
        "at_end"))).select(lane="at_lane", start="at")
    found = classes(held)
    cls = pl.coalesce(*(pl.when(found[c]).then(pl.lit(c)) for c in CLASSES))
    mine = ops.select("who").unique().drop_nulls()
    cpu = spans.lazy().filter(pl.col("device").is_null()).with_columns(who=participant())
    return cpu.join(mine.lazy(), on="who").with_columns(cls=cls).collect(engine=ENGINE)


def _blocks(calls: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Host calls that waited for the GPU (``BLOCK_SCHEMA``; module docstring), each released by the
    participant's run that ended last before it returned, if that was after the call began (and, for a call
    blocking by its times alone, at least ``BLOCKED_NS`` after it began and within ``RETURN_NS`` of its
    return)."""
    timed = (pl.col("cls") == "launch") & (pl.col("end") + SYNC_SLACK_NS - pl.col("start") >= BLOCKED_NS)
    found = calls.lazy().filter(pl.col("cls").is_in(BLOCKING) | timed).select(
        "who", "lane", "start", "end", timed=timed).with_columns(probe=pl.col("end") + SYNC_SLACK_NS).sort("probe")
    ends = nodes.lazy().select("who", "node", node_end="end").sort("node_end")
    waited = (pl.col("node_end") - pl.col("start") >= BLOCKED_NS) & (pl.col("node_end") >= pl.col("end") - RETURN_NS)
    hit = found.join_asof(ends, left_on="probe", right_on="node_end", by="who", strategy="backward",
                          check_sortedness=False)
    hit = hit.filter((pl.col("node_end") > pl.col("start")) & (~pl.col("timed") | waited))
    out = hit.select("who", "lane", "start", "end", release="node",
                     release_end=pl.min_horizontal("node_end", "end")).unique().sort("lane", "end", "start")
    return out.cast(BLOCK_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]


def _threads(calls: pl.DataFrame, ops: pl.DataFrame, limits: pl.DataFrame) -> pl.DataFrame:
    """Each host thread's busy stretches (``THREAD_SCHEMA``; module docstring): the union of its classed
    spans, pauses shorter than ``THREAD_GAP_NS`` joined, and over the file's limit the shortest pauses
    joined too."""
    busy = calls.filter(pl.col("cls").is_not_null() & (pl.col("end") >= pl.col("start")))
    if busy.is_empty():
        return pl.DataFrame(schema=THREAD_SCHEMA)
    keys = ["source", "who", "pid", "lane"]
    union = merge(busy, keys).lazy().join(limits.lazy(), on="source", how="left")
    pause = pl.col("start") - pl.col("end").shift(1).over(keys)
    long = pause.fill_null(0) >= THREAD_GAP_NS
    kept = pl.when(long).then(pause).rank("ordinal", descending=True).over(keys) < pl.col("limit").fill_null(
        RUNS_PER_STEP)
    opens = pause.is_null() | (long & kept.fill_null(False))
    stretch = union.sort(*keys, "start").with_columns(k=opens.cum_sum().over(keys))
    stretches = stretch.group_by(*keys, "k").agg(start=pl.col("start").min(), end=pl.col("end").max())
    launched = ops.lazy().filter(pl.col("at").is_not_null()).select(lane="at_lane", at="at").sort("at")
    marked = stretches.sort("start").join_asof(launched, left_on="start", right_on="at", by="lane",
                                               strategy="forward", check_sortedness=False)
    out = marked.select("who", "pid", "lane", "start", "end", launches=(pl.col("at") <= pl.col("end")).fill_null(
        False)).sort("lane", "start")
    return out.cast(THREAD_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]


def _steps(calls: pl.DataFrame, ops: pl.DataFrame, step_regex: str | None, lived: pl.DataFrame | None
           ) -> pl.DataFrame:
    """Each participant's steps as the GPU lives them (``lived``, else ``idle.steps.gpu_steps`` of its host
    ranges) with the thread that ran each and the end of its host range (``cpu_end``)."""
    found = cpu_steps(calls.lazy(), step_regex)
    if found.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    if lived is None:
        rows = ops.with_row_index("row")
        launch = rows.filter(pl.col("at").is_not_null()).select("row", "at")
        lived = gpu_steps(found, launched(rows.select("row", "end", owner=owner()), launch))
    ranges = calls.lazy().filter(pl.col("kind").is_in(["annotation", "step"])).select(
        "lane", owner=owner(), ws="start", we="end", who=participant())
    host = found.lazy().join(ranges, on=["owner", "ws", "we"]).unique(["owner", "step", "ws", "we"], keep="first")
    host = host.select("owner", "step", "lane", "who", cpu_end="we")
    joined = lived.lazy().join(host, on=["owner", "step", "cpu_end"])
    out = joined.select("who", "step", "lane", start="ws", end="we", cpu_end="cpu_end").sort("who", "start")
    return out.cast(STEP_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]
