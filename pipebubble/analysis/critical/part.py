"""Map: one file's graph for the critical path (``CriticalPart``): its GPU runs, its host threads' waits on
the GPU and its profiler steps, all small enough to cross to the reduce.

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
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.breakdown.rows import steps_of
from pipebubble.analysis.comm.collectives import participant
from pipebubble.analysis.intervals import ENGINE
from pipebubble.analysis.launches import OP_KEY, same_process, with_launch
from pipebubble.spans import GPU_WORK, owner

#: Two operations of one stream, the second launched before the first ended and starting at most this long
#: after it, are one run (the GPU's own scheduling latency, a few µs, is not a dependency worth a node).
MERGE_GAP_NS = 5_000
#: Runs of compute and memory kept per profiler step of a file (module docstring).
RUNS_PER_STEP = 2_000
#: A synchronize returns a little after the work it waited for ended (µs clocks round both).
SYNC_SLACK_NS = 2_000
#: Host syncs that block the thread (not ``cudaStreamWaitEvent``/"Stream wait sync": a GPU-side wait).
NOT_BLOCKING = r"(?i)wait"

NODE_SCHEMA = {"node": pl.Int64, "who": pl.Int64, "rank": pl.Int32, "pid": pl.Int64, "lane": pl.String,
               "stream": pl.Int64, "cls": pl.String, "start": pl.Int64, "end": pl.Int64, "at_lane": pl.String,
               "at": pl.Int64, "memory_ns": pl.Int64, "host_ns": pl.Int64, "wait_ns": pl.Int64}
BLOCK_SCHEMA = {"who": pl.Int64, "lane": pl.String, "start": pl.Int64, "end": pl.Int64, "release": pl.Int64,
                "release_end": pl.Int64}
STEP_SCHEMA = {"who": pl.Int64, "step": pl.Int64, "lane": pl.String, "start": pl.Int64, "end": pl.Int64}
#: The times each frame holds: what ``shifted`` moves onto the job's clock.
TIMES = {"nodes": ("start", "end", "at"), "blocks": ("start", "end", "release_end"), "steps": ("start", "end")}


@dataclass(frozen=True)
class CriticalPart:
    """One file's critical-path graph. ``nodes``: GPU runs (``NODE_SCHEMA``; ``node`` numbers them within
    the file); ``blocks``: host calls blocked on the GPU and the run that released each (``release``, at
    ``release_end``); ``steps``: each participant's profiler steps and the thread that ran them."""

    nodes: pl.DataFrame
    blocks: pl.DataFrame
    steps: pl.DataFrame

    FRAMES = ("nodes", "blocks", "steps")

    def shifted(self, offset: int) -> CriticalPart:
        """The part with ``offset`` taken off every time it holds (its file's clock moved onto the job's)."""
        frames = {name: getattr(self, name) for name in TIMES}
        return CriticalPart(**{k: f.with_columns(pl.col(c) - offset for c in TIMES[k]) for k, f in frames.items()})


def empty_part() -> CriticalPart:
    return CriticalPart(*(pl.DataFrame(schema=s) for s in (NODE_SCHEMA, BLOCK_SCHEMA, STEP_SCHEMA)))


def critical_part(spans: pl.DataFrame, step_regex: str | None = None) -> CriticalPart:
    """Map: the file's runs, blocked host calls and steps (``CriticalPart``; empty without GPU work)."""
    ops = _ops(spans)
    if ops.is_empty():
        return empty_part()
    cpu = spans.filter(pl.col("device").is_null())
    steps = _steps(cpu, step_regex)
    ops = _runs(ops, _limits(ops, steps))
    nodes = _nodes(ops)
    return CriticalPart(nodes, _blocks(cpu, ops, nodes), steps)


def _ops(spans: pl.DataFrame) -> pl.DataFrame:
    """The file's GPU operations, each with its class, participant and launch (``at_lane``, ``at``), sorted
    by stream and start."""
    gpu = spans.lazy().filter(pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK))
    cls = (pl.when(pl.col("kind") == "comm").then(pl.lit("comm"))
           .when(pl.col("kind").is_in(["memcpy", "memset"])).then(pl.lit("memory")).otherwise(pl.lit("compute")))
    launched = with_launch(gpu, spans.lazy(), key=OP_KEY)
    ops = launched.select(*OP_KEY, "rank", "pid", "at_lane", "at", who=participant(), cls=cls)
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


def _blocks(cpu: pl.DataFrame, ops: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Host calls that waited for the GPU (``BLOCK_SCHEMA``): synchronizes, and copy or memset calls whose
    operation ended before they returned (a copy to pageable memory, ``cudaMemcpy``); each released by the
    participant's run that ended last before it returned, if that was after the call began."""
    syncs = cpu.lazy().filter((pl.col("kind") == "sync") & ~pl.col("name").str.contains(NOT_BLOCKING))
    syncs = syncs.select(who=participant(), lane="lane", start="start", end="end")
    calls = cpu.lazy().filter((pl.col("kind") == "runtime") & pl.col("correlation").is_not_null()).select(
        "source", "correlation", "lane", "start", "end", at_pid="pid")
    copies = ops.lazy().filter(pl.col("cls") == "memory").select("source", "correlation", "who", "pid", op_end="end")
    held = calls.join(copies, on=["source", "correlation"]).filter(
        same_process() & (pl.col("op_end") > pl.col("start")) & (pl.col("op_end") <= pl.col("end")))
    found = pl.concat([syncs, held.select("who", "lane", "start", "end")]).with_columns(
        probe=pl.col("end") + SYNC_SLACK_NS).sort("probe")
    ends = nodes.lazy().select("who", "node", node_end="end").sort("node_end")
    hit = found.join_asof(ends, left_on="probe", right_on="node_end", by="who", strategy="backward",
                          check_sortedness=False).filter(pl.col("node_end") > pl.col("start"))
    out = hit.select("who", "lane", "start", "end", release="node",
                     release_end=pl.min_horizontal("node_end", "end")).unique().sort("lane", "end", "start")
    return out.cast(BLOCK_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]


def _steps(cpu: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """Each participant's profiler steps (``breakdown.rows.steps_of``) with the thread that ran each."""
    found = steps_of(cpu.lazy(), step_regex)
    if found.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    ranges = cpu.lazy().filter(pl.col("kind").is_in(["annotation", "step"])).select(
        "lane", owner=owner(), ws="start", we="end", who=participant())
    joined = found.lazy().join(ranges, on=["owner", "ws", "we"]).unique(["owner", "step", "ws", "we"], keep="first")
    out = joined.select("who", "step", "lane", start="ws", end="we").sort("who", "start")
    return out.cast(STEP_SCHEMA).collect(engine=ENGINE)  # type: ignore[arg-type]
