"""The job's timeline per GPU ("strips"): one step drawn per GPU lane as ``BINS`` equal bins, each bin's time
split by class the way the breakdown splits a window, so every job gets a timeline (DP, EP, a single GPU, a
serving trace), not only a pipeline.

Map (``strip_bins``, one file or a batch of rank files): per GPU lane and step (its owner's steps as the GPU lives
them, ``idle.steps``: a ``ProfilerStep#N`` or ``--step-regex`` range and the GPU work launched in it; a lane
without steps: its whole window, first to last busy instant,
step null), ``BINS`` bins, and in each the ns of

- ``compute``: |∪ compute| in the bin; ``comm``: exposed communication, |∪(compute ∪ comm)| − compute;
  ``memory``: exposed memcpy/memset, |∪ all| − |∪(compute ∪ comm)|;
- idle by cause (``report.idle.CAUSES``): the idle account's pieces (``analysis/idle``), the same the
  breakdown rows sum; idle before the GPU's first or after its last op is ``unknown``, as in the rows.

They add up to the bin's width. Bin ``i`` of a step [s, e) is [s + ⌈(e−s)·i/BINS⌉, s + ⌈(e−s)·(i+1)/BINS⌉)
(``bin_edges``). The part holds at most ``MAX_STEPS`` steps per lane (those nearest its median length; a
step that starts before an earlier one ends is left out) and marks the lane's median-length step
(``median``): lanes × steps × ``BINS`` rows whatever the trace's size.

Reduce (``job_strips``): the step drawn is the one on the most GPUs whose length is the median of those
steps' (each step's length the median over its GPUs); every GPU's bins of it.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.breakdown import part
from pipebubble.analysis.breakdown import rows as by_lane
from pipebubble.analysis.intervals import ENGINE, merge_each
from pipebubble.report.idle import CAUSES
from pipebubble.report.strips import CLASSES, Strip, Strips, bin_edges

BINS = 240
MAX_STEPS = 32
assert CLASSES == ("compute", "comm", "memory", *CAUSES)  # the report's names for the breakdown's
#: The map's columns; ``step_start`` and ``step_end`` are the times a file's clock offset moves.
SCHEMA = {"lane": pl.String, "rank": pl.Int32, "step": pl.Int64, "step_start": pl.Int64, "step_end": pl.Int64,
          "median": pl.Boolean, "bin": pl.Int32, **{c: pl.Int64 for c in CLASSES}}
#: The merged unions binned: compute, compute ∪ comm, all work.
UNIONS = ("compute", "busy", "all")


def empty_bins() -> pl.DataFrame:
    return pl.DataFrame(schema=SCHEMA)


def strip_bins(spans: pl.DataFrame, step_regex: str | None = None, bins: int = BINS,
               given: part.GpuInputs | None = None) -> pl.DataFrame:
    """Map: ``bins`` bins per GPU lane and step of ``spans`` (one file's, or a batch's: rows by GPU lane),
    each bin's ns per class (``SCHEMA``). ``given``: the table's ``part.inputs``, which the breakdown reads
    too, where the caller has them."""
    given = given or part.inputs(spans, step_regex)
    gpu = given.gpu
    if gpu.is_empty():
        return empty_bins()
    owners = gpu.select("lane", "owner").unique()
    edges = _edges(_windows(gpu, given.steps, owners), bins)
    merged = merge_each(gpu.select("lane", "start", "end", union="cls"), ["lane"], "union", _OF_UNIONS)
    work = merged.lazy().select("lane", cls=pl.col("union").cast(pl.String), start="start", end="end")
    idle = given.pieces.lazy().select("lane", cls="cause", start="start", end="end")
    return _table(edges, _binned(pl.concat([work, idle]), edges))


#: The classes (``part.gpu_ops``'s ``cls``) each of ``UNIONS`` holds.
_OF_UNIONS = {"compute": ["compute"], "busy": ["compute", "comm"], "all": ["compute", "comm", "memcpy", "memset"]}


def _windows(gpu: pl.DataFrame, steps: pl.DataFrame, owners: pl.DataFrame) -> pl.LazyFrame:
    """lane, rank, step, ws, we, median, sorted by lane and ws: each lane's ``steps`` (else its whole window)
    but those that start inside an earlier one, at most MAX_STEPS, and which is its median-length one."""
    wins = by_lane.windows_of(gpu.lazy(), owners, steps).lazy().filter(pl.col("we") > pl.col("ws"))
    stepped = pl.col("step").is_not_null()
    wins = wins.filter(stepped | ~stepped.any().over("lane")).sort("lane", "ws", "we")
    nested = pl.col("ws") < pl.col("we").cum_max().shift(1).over("lane")
    wins = wins.filter(~nested.fill_null(False)).with_columns(length=pl.col("we") - pl.col("ws"))
    wins = wins.sort("lane", "length", "step").with_columns(median=_middle())
    middle = pl.col("length").filter(pl.col("median")).first().over("lane")
    near = (pl.col("length") - middle).abs().rank("ordinal").over("lane") <= MAX_STEPS
    ranks = gpu.lazy().group_by("lane").agg(pl.col("rank").first())
    return wins.filter(near).join(ranks, on="lane").select("lane", "rank", "step", "ws", "we", "median").sort(
        "lane", "ws")


def _middle() -> pl.Expr:
    """True on the (lower) median row of each lane, its rows sorted by length."""
    return pl.int_range(pl.len()).over("lane") == (pl.len().over("lane") - 1) // 2


def _edges(windows: pl.LazyFrame, bins: int) -> pl.DataFrame:
    """Every bin of every window, in the windows' order (by lane and ws): lane, rank, step, ws, we, median,
    bin, bs, be and ``gid`` (the bins numbered in that order: each lane's in time order, one after another)."""
    every = windows.with_columns(bin=pl.int_ranges(0, bins, dtype=pl.Int32)).explode("bin")
    ws, we, i = pl.col("ws"), pl.col("we"), pl.col("bin").cast(pl.Int64)
    every = every.with_columns(bs=bin_edges(ws, we, i, bins), be=bin_edges(ws, we, i + 1, bins))
    return every.with_columns(gid=pl.int_range(pl.len())).collect(engine=ENGINE)


def _binned(pieces: pl.LazyFrame, edges: pl.DataFrame) -> pl.LazyFrame:
    """lane, gid and the ns of each kind of piece (lane, cls, start, end) in each bin. Each piece joins the
    first bin that ends after its start; most end in it, the rest join the last bin that begins before their
    end and are spread over the bins between. The pieces of one kind are disjoint, so the rows spread stay
    under pieces + bins per kind."""
    bins = edges.lazy().select("lane", "gid", "bs", "be")
    first = bins.with_columns(key=pl.col("be") - 1).sort("key")
    found = pieces.sort("start").join_asof(first, left_on="start", right_on="key", by="lane", strategy="forward",
                                           check_sortedness=False)
    inside = found.filter(pl.col("end") <= pl.col("be"))
    last = bins.select("lane", last="gid", last_bs="bs").sort("last_bs")
    crossing = found.filter(pl.col("end") > pl.col("be")).with_columns(stop=pl.col("end") - 1).sort("stop").join_asof(
        last, left_on="stop", right_on="last_bs", by="lane", strategy="backward", check_sortedness=False)
    spread = crossing.with_columns(gid=pl.int_ranges("gid", pl.col("last") + 1)).explode("gid")
    spread = spread.select("lane", "cls", "gid", "start", "end").join(bins, on=["lane", "gid"])
    cut = pl.concat([inside.select(spread.collect_schema().names()), spread])
    ns = (pl.min_horizontal("end", "be") - pl.max_horizontal("start", "bs")).clip(lower_bound=0)
    kinds = (*UNIONS, *CAUSES)
    each = {k: pl.when(pl.col("cls") == k).then(ns).otherwise(0) for k in kinds}
    return cut.select("lane", "gid", **each).group_by("lane", "gid").sum()


def _table(edges: pl.DataFrame, ns: pl.LazyFrame) -> pl.DataFrame:
    """The part: each bin (``edges``, sorted by lane, ws and bin) with its ns per class (``ns``); the idle
    outside every gap goes to ``other``."""
    table = edges.lazy().join(ns, on=["lane", "gid"], how="left", maintain_order="left").with_columns(
        pl.col(*UNIONS, *CAUSES).fill_null(0))
    c = pl.col
    outside = c("be") - c("bs") - c("all") - pl.sum_horizontal(CAUSES)
    table = table.with_columns(comm=c("busy") - c("compute"), memory=c("all") - c("busy"),
                               unknown=c("unknown") + outside)
    table = table.rename({"ws": "step_start", "we": "step_end"})
    return table.select(pl.col(k).cast(t) for k, t in SCHEMA.items()).collect(engine=ENGINE)


def job_strips(bins: pl.DataFrame) -> Strips:
    """Reduce: the parts' bins (``strip_bins``, concatenated, each file's ``step_start``/``step_end`` on the
    job's clock) to the job's timeline: the step on the most GPUs whose length is the median of those steps'
    lengths (each the median over its GPUs; ties: the lower step), a row per GPU that ran it."""
    if bins.is_empty():
        return Strips(None, [])
    step = _chosen(bins)
    picked = bins.filter(pl.col("step").eq_missing(step)).sort("rank", "lane", "bin", nulls_last=True)
    lanes = picked.group_by("lane", maintain_order=True).agg(
        pl.col("rank", "step_start", "step_end").first(), bins=pl.concat_list(CLASSES))
    rows = [Strip(r["lane"], r["rank"], r["step_start"], r["step_end"], r["bins"])
            for r in lanes.iter_rows(named=True)]
    missing = sorted(set(bins["lane"].unique()) - set(lanes["lane"]))
    return Strips(step, rows, missing=missing)


def _chosen(bins: pl.DataFrame) -> int | None:
    """The step drawn: among the steps on the most GPUs, the one whose length (the median over its GPUs) is
    the lower median of theirs."""
    steps = bins.lazy().select("lane", "step", length=pl.col("step_end") - pl.col("step_start")).unique()
    per = steps.group_by("step").agg(gpus=pl.len(), length=pl.col("length").median())
    most = per.filter(pl.col("gpus") == pl.col("gpus").max()).sort("length", "step", nulls_last=True)
    steps = most.select("step").collect(engine=ENGINE)["step"]
    return steps[(steps.len() - 1) // 2]
