"""What each host thread was doing, as one tiling of its time: disjoint segments, each with one class.

A thread's spans nest (an operator holds runtime calls, a synchronize holds its CUPTI record), so each
instant takes the class of the first kind of span that covers it, in ``CLASSES`` order:

- ``peer``: a collective or send/recv call (the thread waits for another rank);
- ``data_loader``: a data-loader range (``DataLoader``, ``_next_data``);
- ``sync_stall``, ``blocking_copy``, ``allocator``: a runtime call that blocks until the GPU is done: a
  synchronize (not ``cudaStreamWaitEvent``/"Stream wait sync", a wait the GPU does), a copy or memset that is
  not ``Async``, or one whose copy ended before it returned (a copy to pageable memory), an allocator call
  (``cudaMalloc``, ``cudaFree``: implicitly synchronizing);
- ``startup``: a call that loads code or initialises the runtime or a library (``cuModuleLoad``,
  ``cublasCreate``, ``ncclCommInit``...), or a launch that took ``FIRST_LAUNCH_NS`` or more (a kernel's first
  launch loads its module: a launch whose GPU went idle meanwhile did not wait for a full queue);
- ``launch``: any other runtime call (the launch API itself);
- ``cpu_ops``: an operator (``aten::...``), with the outermost one named in ``op``;
- ``python``: none of those (Python, or time nothing traced).

Each segment also names the outermost operator around it (``op``) and, for a runtime call, the call
(``call``). Segments tile each thread from ``-FAR`` to ``FAR``, so any stretch of a thread's time is the sum
of the segments it meets.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble.analysis.intervals import ENGINE, merge
from pipebubble.spans import is_comm

CLASSES = ("peer", "data_loader", "sync_stall", "blocking_copy", "allocator", "startup", "launch", "cpu_ops")
#: The classes of a call that returns only once the GPU is done.
BLOCKING = ("sync_stall", "blocking_copy", "allocator")
#: What a thread waits on that is not the GPU: a gap that begins while it waits is the wait's until it ends.
WAITS = ("peer", "data_loader")
#: Times lie within ±2**62 ns (``spans``): the segments reach past every span.
FAR = 2**62
DATA_LOADER = r"(?i)dataloader|_next_data|_MultiProcessingDataLoaderIter|_SingleProcessDataLoaderIter"
#: Runtime calls that return once the GPU has finished (by name; ``Async`` variants do not).
COPY_CALLS = r"(?i)^(cuda|hip|cu)(Memcpy|Memset)[^A]*$|(?i)^hipMemcpyWithStream$"
SYNC_CALLS = r"(?i)synchroni[sz]e"
ALLOCATOR_CALLS = r"(?i)^(cuda|hip|cu)(Mem)?(Malloc|Free|Alloc|HostAlloc|HostRegister|HostUnregister)[^A]*$"
#: A launch this long loaded its code (a launch whose GPU ran dry meanwhile did not wait for a full queue).
FIRST_LAUNCH_NS = 1_000_000
LAUNCH_CALLS = r"(?i)launch"
#: Calls that load code or initialise the runtime or a library.
STARTUP_CALLS = (r"^(cu|cuda|hip)(Init|SetDevice|DeviceReset|DevicePrimaryCtxRetain|CtxCreate\w*|ModuleLoad\w*"
                 r"|LibraryLoad\w*|ModuleGetFunction|LibraryGetKernel|GetDriverEntryPoint\w*)(_v\d+)*$"
                 r"|^(cublas|cublasLt|cudnn|cusparse|cusolver\w*|cufft|curand|rocblas|hipblas|hipblasLt|miopen)"
                 r"Create\w*$|^(nccl|rccl)CommInit\w*$")
#: Host syncs that do not block the thread (a wait the GPU does).
GPU_SIDE = r"(?i)wait"
#: Ranges that are operators (NVTX ranges of PyTorch's emitter: ``aten::to, op_id = 7``).
OPERATOR = r"^[A-Za-z_][\w.]*::\w"
#: What PyTorch's NVTX emitter adds to an operator's name on each call.
CALL_SUFFIX = r",\s*(op_id|seq|sizes|input_op_ids)\s*=.*$"
SCHEMA = {"at_lane": pl.String, "start": pl.Int64, "end": pl.Int64, "cause": pl.String, "op": pl.String,
          "call": pl.String}


def classes(held: pl.DataFrame | None = None) -> dict[str, pl.Expr]:
    """Each class's spans among a thread's (``CLASSES``). ``held``: (lane, start) of runtime calls whose copy
    ended before they returned, which block whatever their name."""
    kind, name = pl.col("kind"), pl.col("name")
    runtime = kind == "runtime"
    copy = runtime & name.str.contains(COPY_CALLS)
    if held is not None and held.height:
        copy = copy | (runtime & pl.struct("lane", "start").is_in(held.select(pl.struct("lane", "start")).to_series()
                                                                  .implode()))
    sync = ((kind == "sync") & ~name.str.contains(GPU_SIDE)) | (runtime & name.str.contains(SYNC_CALLS))
    return {
        "peer": kind.is_in(["cpu_op", "annotation", "comm"]) & is_comm(),
        "data_loader": kind.is_in(["cpu_op", "annotation"]) & name.str.contains(DATA_LOADER),
        "sync_stall": sync,
        "blocking_copy": copy,
        "allocator": runtime & name.str.contains(ALLOCATOR_CALLS),
        "startup": runtime & (name.str.contains(STARTUP_CALLS) | (
            name.str.contains(LAUNCH_CALLS) & (pl.col("end") - pl.col("start") >= FIRST_LAUNCH_NS))),
        "launch": runtime | (kind == "sync"),
        "cpu_ops": operators(),
    }


def host_kind() -> pl.Expr:
    """A host span's kind as the idle account sees it: ``sync`` for every call that blocks until the GPU is
    done (a synchronize, a blocking copy, the allocator), whatever kind its trace gave it; a sync the GPU
    does (``cudaStreamWaitEvent``, Nsight's "Stream wait sync") is a ``runtime`` call. For the analyses that
    keep host spans by kind (a pipeline stage's host activity)."""
    found = classes()
    blocking = pl.any_horizontal(*(found[c] for c in BLOCKING))
    kind = pl.col("kind").cast(pl.String)
    return pl.when(blocking).then(pl.lit("sync")).when(kind == "sync").then(pl.lit("runtime")).otherwise(kind)


def operators() -> pl.Expr:
    """An operator: a ``cpu_op``, or a range named like one (Nsight's NVTX ranges of PyTorch operators)."""
    return (pl.col("kind") == "cpu_op") | ((pl.col("kind") == "annotation") & pl.col("name").str.contains(OPERATOR))


def activity(cpu: pl.DataFrame, held: pl.DataFrame | None = None, outer: Outer | None = None,
             lanes: pl.Series | None = None) -> pl.DataFrame:
    """``SCHEMA`` (thread as ``at_lane``): every thread of ``cpu`` (host spans), or of ``lanes``, as disjoint
    segments tiling its time, each with its class (module docstring), outermost operator and runtime call.
    ``cpu`` may be a subset of the threads' spans (those near the times wanted): each instant is classed
    from the spans over it, and ``outer`` (``outermost`` of all of the threads' spans) names the operators
    and calls around it."""
    spans = cpu.select("lane", "kind", "name", "start", "end").filter(pl.col("end") >= pl.col("start"))
    threads = spans.select("lane").unique() if lanes is None else lanes.rename("lane").to_frame()
    if threads.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    outer = outer or outermost(spans)
    tagged = spans.with_columns(cls=_first_class(classes(held)))
    merged = merge(tagged.filter(pl.col("cls").is_not_null()), ["lane", "cls"])
    pieces = _covering(merged, threads)
    cause = pl.coalesce(*(pl.when(cls).then(pl.lit(cls)) for cls in CLASSES), pl.lit("python"))
    pieces = pieces.select("lane", start="p", end="e", cause=cause)
    pieces = _named(_named(pieces, outer.ops.lazy(), "op"), outer.calls.lazy(), "call").with_columns(
        call=pl.when(pl.col("cause").is_in(["python", "cpu_ops", "peer", "data_loader"])).then(None).otherwise("call"))
    return _coalesced(pieces).collect(engine=ENGINE)


@dataclass(frozen=True)
class Outer:
    """The outermost operators and runtime calls of each thread (lane, s, e, name): what names a segment."""

    ops: pl.DataFrame
    calls: pl.DataFrame


def outermost(cpu: pl.DataFrame) -> Outer:
    """``Outer`` of the host spans ``cpu``: operators without PyTorch's per-call suffixes, and runtime calls
    (a runtime call before the CUPTI record nested in it)."""
    spans = cpu.select("lane", "kind", "name", "start", "end").filter(pl.col("end") >= pl.col("start"))
    ops = spans.filter(operators()).with_columns(pl.col("name").str.replace(CALL_SUFFIX, ""))
    calls = spans.filter(pl.col("kind").is_in(["runtime", "sync"])).sort(pl.col("kind") == "runtime")
    return Outer(*pl.collect_all([_outermost(ops), _outermost(calls)], engine=ENGINE))


def _covering(merged: pl.DataFrame, lanes: pl.DataFrame) -> pl.LazyFrame:
    """lane, p, e and a flag per class: each thread's time cut at every edge of its classes' merged
    intervals (``merged``: lane, cls, start, end; disjoint within a class), each piece [p, e) with whether
    each class covers it. One sort of the edges and a running count per class (an interval's start +1, its
    end -1), not a join per class."""
    edges = pl.concat([
        merged.lazy().select("lane", "cls", p="start", d=pl.lit(1, pl.Int8)),
        merged.lazy().select("lane", "cls", p="end", d=pl.lit(-1, pl.Int8)),
        lanes.lazy().select("lane", cls=pl.lit(None, pl.String), p=pl.lit(-FAR, pl.Int64), d=pl.lit(0, pl.Int8)),
    ])
    # Every interval of a thread closes within it, so each count is back at 0 where the next thread begins:
    # one cumulative sum over all threads, in the edges' order, needs no window per thread.
    counts = {c: pl.when(pl.col("cls") == c).then(pl.col("d")).otherwise(0).cast(pl.Int32).cum_sum()
              for c in CLASSES}
    swept = edges.sort("lane", "p").with_columns(**counts)
    lane, p = pl.col("lane"), pl.col("p")
    same = lane == lane.shift(-1)
    # Edges at one time: the counts after the last of them hold from there on, to the thread's next edge.
    last = ~(same & (p == p.shift(-1))).fill_null(False)
    pieces = swept.filter(last).with_columns(e=pl.when(same).then(p.shift(-1)).otherwise(FAR))
    return pieces.filter(pl.col("e") > p).with_columns(pl.col(c) > 0 for c in CLASSES)


def _first_class(found: dict[str, pl.Expr]) -> pl.Expr:
    """A span's class: the first of ``CLASSES`` it belongs to (null: none, an annotation say)."""
    return pl.coalesce(*(pl.when(expr).then(pl.lit(cls)) for cls, expr in found.items()))


def _outermost(spans: pl.DataFrame) -> pl.LazyFrame:
    """lane, s, e, name: the spans not inside an earlier one of their thread (disjoint, in order)."""
    ordered = spans.lazy().sort("lane", "start", pl.col("end"), descending=[False, False, True])
    inside = pl.col("start") < pl.col("end").cum_max().shift(1).over("lane")
    return ordered.filter(~inside.fill_null(False)).select("lane", "name", s="start", e="end")


def _named(pieces: pl.LazyFrame, outer: pl.LazyFrame, column: str) -> pl.LazyFrame:
    """``pieces`` with the name of the ``outer`` span around each as ``column`` (null where none is)."""
    found = pieces.sort("start").join_asof(outer.sort("s"), left_on="start", right_on="s", by="lane",
                                           strategy="backward", check_sortedness=False)
    return found.with_columns(pl.when(pl.col("e") > pl.col("start")).then("name").alias(column)).drop(
        "name", "s", "e")


def _coalesced(pieces: pl.LazyFrame) -> pl.LazyFrame:
    """Neighbouring pieces of one thread with the same cause, operator and call joined into one: the pieces
    tile each thread, so a run's first piece is kept and ends where the next run begins (the thread's last,
    at ``FAR``). A filter, not a group-by."""
    same = ["cause", "op", "call"]
    ordered = pieces.sort("lane", "start")
    lane = pl.col("lane")
    changed = pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift(1)) for c in same) | lane.ne_missing(
        lane.shift(1))
    firsts = ordered.filter(changed)
    end = pl.when(lane == lane.shift(-1)).then(pl.col("start").shift(-1)).otherwise(FAR)
    return firsts.select(at_lane="lane", start="start", end=end, cause="cause", op="op", call="call")
