"""Map: what each participant did in its step up to each of its arrivals at communication (``windows``).

An arrival is a collective call's start as ``collectives.collective_part`` gives it (its kernel's start; a
CPU collective range's where the participant has no GPU collectives) or a point-to-point operation's start
(``p2p.p2p_part``). Each arrival's step is the participant's profiler step holding it (a ``ProfilerStep#N``
range, or what ``step_regex`` matches); its ``origin`` that step's start (without one, the participant's
first traced instant). For the arrival and the operation's end, the time since the origin in each class
(``CLASSES``; ``a_<class>`` up to the arrival, ``e_<class>`` up to the end), as unions, so the reduce can
take the difference between any two of them (from a sync point it chooses to an arrival):

- GPU (participants with GPU work): ``compute`` (kernels, memcpy, memset), ``comm`` (communication kernels
  not under compute), ``idle`` (the rest); on a CPU-only participant ``comm`` is its CPU communication ranges.
- host (every thread of the participant): ``loader`` (data-loader ranges), ``sync`` (synchronize calls not
  inside one), ``host_ops`` (other operators and runtime calls), ``host_idle`` (the rest).
- the GPU's idle by the idle account's cause (``idle_<cause>``, ``report.idle.CAUSES``: the pieces the
  breakdown sums), so a late rank whose GPU idled more is late for the reason the account gives that idle.

One row per arrival (``SCHEMA``): as many as the file's collective calls and send/recv operations, never
one per kernel. Times the clock offset must shift: ``origin``, ``arrival``, ``end``.
"""

from __future__ import annotations

import polars as pl

from pipebubble.analysis.breakdown.rows import steps_of
from pipebubble.analysis.comm.collectives import participant
from pipebubble.analysis.intervals import ENGINE, merge_each, swept
from pipebubble.report.idle import CAUSES
from pipebubble.spans import GPU_WORK, HOST_WORK

#: torch.utils.data's record_function names for fetching a batch
#: (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``, ``..._MultiProcessingDataLoaderIter...``).
LOADER = r"^enumerate\(DataLoader\)#|DataLoaderIter\.__next__"
GPU_CLASSES = ("compute", "comm", "idle")
HOST_CLASSES = ("loader", "sync", "host_ops", "host_idle")
IDLE_CLASSES = tuple(f"idle_{c}" for c in CAUSES)
CLASSES = GPU_CLASSES + HOST_CLASSES + IDLE_CLASSES
SCHEMA = {"who": pl.Int64, "step": pl.Int64, "kind": pl.String, "seq": pl.Int64, "peer": pl.Int64,
          "origin": pl.Int64, "arrival": pl.Int64, "end": pl.Int64, "gpu": pl.Boolean,
          **{f"{at}_{c}": pl.Int64 for at in ("a", "e") for c in CLASSES}}


def empty() -> pl.DataFrame:
    """The part of a file without arrivals."""
    return pl.DataFrame(schema=SCHEMA)


def windows(spans: pl.DataFrame, calls: pl.DataFrame, p2p: pl.DataFrame | None = None,
            step_regex: str | None = None, pieces: pl.DataFrame | None = None) -> pl.DataFrame:
    """Map: one row per arrival of ``calls`` (``collective_part``'s, window rows included) and ``p2p``
    (``p2p_part``'s) with its window and the time in each class there (``SCHEMA``). ``spans`` may hold
    several ranks (a batch of rank files): everything is per participant. ``pieces``: the table's idle
    account (``idle.idle_account``), whose causes split the GPU's idle."""
    events = arrivals(calls, p2p)
    if events.is_empty() or spans.is_empty():
        return empty()
    first = calls.lazy().filter(pl.col("kind").is_null()).select("who", first=pl.col("start"))
    framed = _framed(events, _steps(spans, step_regex), first)
    unions = pl.concat([_unions(spans), _idle_unions(spans, pieces)], how="vertical_relaxed")
    out = _classified(framed, unions).select(list(SCHEMA)).cast(SCHEMA)  # type: ignore[arg-type]
    return out.collect(engine=ENGINE)


def _idle_unions(spans: pl.DataFrame, pieces: pl.DataFrame | None) -> pl.DataFrame:
    """who, cls, start, end, before: each participant's GPU idle by the account's cause (``idle_<cause>``),
    merged over its GPUs, with the union's length before each interval."""
    schema = {"who": pl.Int64, "cls": pl.String, "start": pl.Int64, "end": pl.Int64, "before": pl.Int64}
    if pieces is None or pieces.is_empty():
        return pl.DataFrame(schema=schema)
    whos = spans.lazy().filter(pl.col("device").is_not_null()).select("lane", who=participant()).unique("lane")
    tagged = pieces.lazy().join(whos, on="lane").select("who", "start", "end", cls="idle_" + pl.col("cause"))
    # One query: the pieces of a participant's GPUs merged per cause, and each interval's union length before it.
    by = ["who", "cls"]
    merged = swept(tagged, by)
    length = pl.col("end") - pl.col("start")
    out = merged.with_columns(before=(length.cum_sum() - length).over(by)).select(list(schema))
    return out.collect(engine=ENGINE).cast(schema)


def arrivals(calls: pl.DataFrame, p2p: pl.DataFrame | None) -> pl.DataFrame:
    """who, kind, seq, peer, arrival, end: the collective calls (kind the collective's) and the send/recv
    operations (kind ``send``/``recv``, with their peer), in one table."""
    own = calls.filter(pl.col("kind").is_not_null()).select(
        "who", "kind", "seq", peer=pl.lit(None, pl.Int64), arrival="start", end="end")
    if p2p is None or p2p.is_empty():
        return own
    ops = p2p.select("who", kind="direction", seq="seq", peer="peer", arrival="start", end="end")
    return pl.concat([own, ops.cast(own.schema)])  # type: ignore[arg-type]


def _steps(spans: pl.DataFrame, step_regex: str | None) -> pl.DataFrame:
    """who, step, ws, we: each participant's profiler steps (``breakdown.rows.steps_of``, whose owner is the
    participant once a rankless span's rank is its ``participant`` number)."""
    marked = spans.lazy().filter(pl.col("device").is_null()).with_columns(rank=participant())
    return steps_of(marked, step_regex).rename({"owner": "who"}).with_columns(pl.col("who").cast(pl.Int64))


def _framed(events: pl.DataFrame, steps: pl.DataFrame, first: pl.LazyFrame) -> pl.DataFrame:
    """The arrivals with their step (the last step of the participant started before the arrival, if the
    arrival is before its end) and ``origin`` (the step's start, else the participant's first instant)."""
    probe = events.lazy().sort("who", "arrival", "end").join_asof(  # each participant's in order of arrival
        steps.lazy().sort("ws").cast({"ws": pl.Int64}), left_on="arrival", right_on="ws", by="who",
        strategy="backward", check_sortedness=False)
    inside = pl.col("ws").is_not_null() & (pl.col("arrival") < pl.col("we"))
    probe = probe.join(first, on="who", how="left", maintain_order="left").with_columns(
        step=pl.when(inside).then("step"), origin=pl.when(inside).then("ws").otherwise(pl.col("first")))
    return probe.drop("ws", "we", "first").collect(engine=ENGINE)


def _unions(spans: pl.DataFrame) -> pl.DataFrame:
    """who, cls, start, end, before: each participant's merged intervals per union (``compute``, ``busy``:
    all GPU work; ``loader``, ``blocked``: loader or sync; ``host``: all host work; ``cpu_comm``: CPU
    communication ranges), with ``before`` the union's length before each interval (a cumulative sum)."""
    gpu = pl.col("device").is_not_null() & pl.col("kind").is_in(GPU_WORK)
    host = pl.col("device").is_null()
    loader = host & pl.col("name").str.contains(LOADER)
    sync = host & (pl.col("kind") == "sync")
    work = host & pl.col("kind").is_in(HOST_WORK)
    tags = {
        "compute": gpu & (pl.col("kind") != "comm"), "busy": gpu, "loader": loader, "blocked": loader | sync,
        "host": loader | work, "cpu_comm": host & (pl.col("kind") == "comm"),
    }
    merged = merge_each(_tagged(spans, tags), ["who"], "tags", _holding(list(tags))).rename({"tags": "cls"})
    length = pl.col("end") - pl.col("start")
    return merged.with_columns(before=(length.cum_sum() - length).over("who", "cls"))


def _tagged(spans: pl.DataFrame, tags: dict[str, pl.Expr]) -> pl.DataFrame:
    """who, start, end and ``tags`` of the spans in any union: bit ``j`` of ``tags`` set where the ``j``-th
    union of ``tags`` holds the span. One row per span, however many unions hold it, so the spans are sorted
    once for them all (``intervals.merge_each``)."""
    bits = pl.sum_horizontal(expr.fill_null(False).cast(pl.Int64) * (1 << j) for j, expr in enumerate(tags.values()))
    return spans.lazy().select("start", "end", who=participant(), tags=bits).filter(pl.col("tags") > 0).collect(
        engine=ENGINE)


def _holding(names: list[str]) -> dict[str, list[int]]:
    """Each union's name -> the ``tags`` values (``_tagged``) of the spans it holds."""
    masks = range(1, 1 << len(names))
    return {name: [mask for mask in masks if mask >> j & 1] for j, name in enumerate(names)}


def _covered(points: pl.DataFrame, unions: pl.DataFrame, ats: tuple[str, ...]) -> pl.DataFrame:
    """``points`` (row, who and the times ``ats``) with each union's length before each time (a column
    ``{at}_{union}`` each), a row per point in their order: the intervals before it in full, the one holding
    it up to it. Each (participant, union) is a stretch of one sorted int64 key, so every time of every union
    is found by one binary search (``_searched``); where those keys would not fit in int64, by one as-of
    query (``_joined``)."""
    names = sorted(unions["cls"].unique().to_list())
    whos = pl.concat([unions["who"], points["who"]]).unique().sort()
    every = pl.concat([unions["start"], unions["end"], *(points[at] for at in ats)])
    lo, hi = every.min(), every.max()
    if lo is None or whos.null_count() or (hi - lo + 1) * whos.len() * len(names) >= 2**62:  # type: ignore[operator]
        return _joined(points, unions, ats).sort("row")
    return _searched(points, unions, ats, names, whos, (lo, hi - lo + 1))  # type: ignore[operator]


def _searched(points: pl.DataFrame, unions: pl.DataFrame, ats: tuple[str, ...], names: list[str],
              whos: pl.Series, frame: tuple[int, int]) -> pl.DataFrame:
    """``_covered`` by binary search: an interval's key is ``group * width + start - lo`` (``group``: its
    participant's and union's number), a time's the same with its own group, so the last interval of the
    group starting at or before the time is the last key at or below it, when that key is of its group."""
    lo, width = frame
    code = pl.col("cls").replace_strict(names, list(range(len(names))), return_dtype=pl.Int64)
    group = pl.lit(whos).search_sorted(pl.col("who")).cast(pl.Int64) * len(names) + code
    marks = unions.select("before", "start", "end", key=group * width + pl.col("start") - lo).sort("key")
    base = whos.search_sorted(points["who"]).cast(pl.Int64) * len(names)
    groups = pl.concat([base + j for _ in ats for j in range(len(names))])
    times = pl.concat([points[at] for at in ats for _ in names])
    found = marks["key"].search_sorted(groups * width + times - lo, side="right").cast(pl.Int64) - 1
    hit = marks.select(pl.all().gather(found.clip(0)))
    mine = (found >= 0) & times.is_not_null() & (hit["key"] // width == groups)
    length = hit["before"] + pl.min_horizontal(times, hit["end"]) - hit["start"]
    ns = pl.select(ns=pl.when(mine).then(length).otherwise(0).fill_null(0))["ns"]
    n = points.height
    return pl.DataFrame({"row": points["row"], **{
        f"{at}_{cls}": ns.slice((k * len(names) + j) * n, n) for k, at in enumerate(ats) for j, cls in enumerate(names)
    }})


def _joined(points: pl.DataFrame, unions: pl.DataFrame, ats: tuple[str, ...]) -> pl.DataFrame:
    """``_covered`` in one as-of query for every time and union."""
    times = points.lazy().unpivot(list(ats), index=["row", "who"], variable_name="at", value_name="t")
    probe = times.join(unions.lazy().select("cls").unique(), how="cross").sort("t")
    hit = probe.join_asof(unions.lazy().sort("start"), left_on="t", right_on="start", by=["who", "cls"],
                          strategy="backward", check_sortedness=False)
    ns = (pl.col("before") + pl.min_horizontal(pl.col("t"), "end") - pl.col("start")).fill_null(0)
    named = hit.select("row", pl.format("{}_{}", "at", "cls").alias("name"), ns=ns)
    return named.collect(engine=ENGINE).pivot("name", index="row", values="ns")


def _classified(framed: pl.DataFrame, unions: pl.DataFrame) -> pl.LazyFrame:
    """The arrivals with the ns of each class (``CLASSES``) from their origin to their arrival (``a_``) and
    to their end (``e_``), as a query."""
    rows = framed.with_row_index("row")
    gpus = unions.filter(pl.col("cls") == "busy")["who"].unique() if unions.height else pl.Series([], dtype=pl.Int64)
    gpu = pl.col("who").is_in(gpus.implode())
    out = rows.lazy().with_columns(gpu=gpu)
    columns = rows.columns
    if unions.height:
        covered = _covered(rows, unions, ("origin", "arrival", "end")).drop("row")
        out, columns = pl.concat([out, covered.lazy()], how="horizontal"), [*columns, *covered.columns]
    return out.with_columns(**_classes(columns, "arrival", "a")).with_columns(**_classes(columns, "end", "e"))


def _classes(columns: list[str], to: str, prefix: str) -> dict[str, pl.Expr]:
    """The classes from ``origin`` to ``to``, from the unions' lengths before each (``_covered``)."""
    def union(cls: str) -> pl.Expr:
        have = f"{to}_{cls}" in columns
        return (pl.col(f"{to}_{cls}") - pl.col(f"origin_{cls}")).fill_null(0) if have else pl.lit(0, pl.Int64)

    window = pl.col(to) - pl.col("origin")
    comm = pl.when("gpu").then(union("busy") - union("compute")).otherwise(union("cpu_comm"))
    classes = {
        "compute": union("compute"), "comm": comm, "idle": pl.when("gpu").then(window - union("busy")).otherwise(0),
        "loader": union("loader"), "sync": union("blocked") - union("loader"),
        "host_ops": union("host") - union("blocked"), "host_idle": window - union("host"),
        **{c: union(c) for c in IDLE_CLASSES},
    }
    return {f"{prefix}_{c}": e for c, e in classes.items()}
