"""Interval arithmetic over span tables, vectorised: union per group, gaps between merged intervals.

The sweep is the classic one (sort by start; a new merged interval begins where a start passes the running
maximum of the ends before it), written as polars expressions so it runs over millions of spans.
"""

from __future__ import annotations

import polars as pl


def merge(frame: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Merged (union) intervals per group: columns ``by`` + ``start``, ``end``, sorted. Pieces are contiguous
    after the sort, so among the rows that open or close a piece, one that opens is followed by the one that
    closes it (or closes it itself): one query, no group-by (three or four for a big frame).

    The running maximum of the ends is a window per group; in a big frame, one cumulative pass over the
    whole frame instead, sorted by one number per row (``_flat``)."""
    if frame.is_empty():
        return pl.DataFrame(schema={c: frame.schema[c] for c in (*by, start, end)})
    flat = _flat(frame, by, start, end) if frame.height >= _FLAT_ROWS else None
    if flat is not None:
        return flat
    return swept(frame.lazy(), by, start, end).collect(engine=ENGINE)


def swept(frame: pl.LazyFrame, by: list[str], start: str = "start", end: str = "end") -> pl.LazyFrame:
    """``merge``'s sweep as a query, for a caller that goes on with the merged intervals in the same plan
    (a window per group: for small and middling frames)."""
    ordered = frame.select(*by, start, end).sort(*by, start)
    reach = pl.col(end).cum_max().over(by) if by else pl.col(end).cum_max()
    opens = (pl.col(start) > (reach.shift(1).over(by) if by else reach.shift(1))).fill_null(True)
    return _pieces(ordered.with_columns(reach=reach, opens=opens), by, start, end)


def _pieces(swept: pl.LazyFrame, keep: list[str], start: str, end: str) -> pl.LazyFrame:
    """The merged intervals of ``swept`` (sorted rows with their running maximum of the ends, ``reach``, and
    whether each opens a piece, ``opens``): ``keep`` + ``start``, ``end``."""
    closes = pl.col("opens").shift(-1).fill_null(True)
    # The rows that open or close a piece, in order: a piece's opening row is its closing row, or the next.
    edges = swept.with_columns(closes=closes).filter(pl.col("opens") | pl.col("closes"))
    piece_end = pl.when(pl.col("closes")).then(pl.col("reach")).otherwise(pl.col("reach").shift(-1))
    return edges.select(*keep, start, piece_end.alias(end), "opens").filter("opens").drop("opens")


#: The engine an analysis's lazy queries run on: their frames are small to middling, and polars' default
#: engine takes about twice as long as the in-memory one to start a query on them.
ENGINE = "in-memory"


#: How queries over a spilled table's scan are optimised: without common-subplan elimination, which would
#: hold a subplan that two queries of one ``collect_all`` share (a scan's GPU operations, say) whole in
#: memory to read it once (measured: 120-200 MB of a 2.4 GB trace's, where reading it twice costs a second).
SCAN_OPTIMIZATIONS = pl.QueryOptFlags(comm_subplan_elim=False)


def engine_for(frame: pl.DataFrame | pl.LazyFrame) -> str:
    """``ENGINE`` for a table in memory; the streaming engine for a query over a lazy scan (a spilled
    table's Parquet parts), which the in-memory engine would read whole to answer."""
    return "streaming" if isinstance(frame, pl.LazyFrame) else ENGINE


#: Bins per window of the histogram ``time_edges`` cuts windows from (and at most ``_EDGE_BINS_MAX`` in all).
_EDGE_BINS, _EDGE_BINS_MAX = 64, 1 << 16


def time_edges(frame: pl.LazyFrame, rows_per_window: int) -> tuple[int, list[int]]:
    """The rows of ``frame`` (start, end: a scan) and the edges, in integer ns, of time windows that about
    ``rows_per_window`` of its rows each start in: the first start, cuts between, and past every start and
    end last. The cuts are read off a histogram of the starts (``_EDGE_BINS`` bins a window), counted in a
    streaming pass: what it holds is bounded by the number of bins, whatever the rows (a bin never splits,
    so a window holds at most a bin more than its share)."""
    n, first, last, end = frame.select(
        pl.len(), pl.col("start").min().alias("first"), pl.col("start").max().alias("last"),
        (pl.max_horizontal(pl.col("start").max(), pl.col("end").max()) + 1).alias("end"),
    ).collect(engine="streaming").row(0)
    if not n:
        return 0, []
    k = max(1, -(-n // max(1, rows_per_window)))
    if k == 1 or last == first:
        return n, [first, end]
    width = -(-(last - first + 1) // min(_EDGE_BINS_MAX, _EDGE_BINS * k))
    counts = frame.group_by(b=(pl.col("start") - first) // width).agg(n=pl.len()).collect(engine="streaming")
    counts = counts.sort("b").with_columns(pl.col("n").cum_sum())
    cuts = _cuts(counts, n, k, first, width)
    return n, sorted({first, *(c for c in cuts if first < c < end), end})


def _cuts(counts: pl.DataFrame, n: int, k: int, first: int, width: int) -> list[int]:
    """Where the running counts (``b``, ``n``: each bin's running count of starts) pass each i/k of ``n``:
    the end of the first bin that does."""
    targets = pl.DataFrame({"target": [-(-n * i // k) for i in range(1, k)]}, schema={"target": pl.Int64})
    running = counts.select(pl.col("n").cast(pl.Int64).alias("target"), "b")
    found = targets.join_asof(running, on="target", strategy="forward")
    return [first + (b + 1) * width for b in found["b"].drop_nulls().unique().to_list()]


#: From this many rows, ``merge`` and ``merge_each`` number a frame's groups and sweep it in one cumulative
#: pass (``_flat``, ``_moved``): a window per group costs per group, and passes of a few spans come by the
#: thousand (2.5× faster at 8,192 rows in 2,048 groups, even at about 1,500).
_FLAT_ROWS = 1_500
#: From this many rows, ``unions`` numbers the groups before its sort (sorting by keys, with no window, is
#: the faster below).
_KEYED_ROWS = 10_000
#: Moved times stay below this (int64 holds 2**63).
_FLAT_LIMIT = 2**62
_GROUP = "_group"


def _flat(frame: pl.DataFrame, by: list[str], start: str, end: str) -> pl.DataFrame | None:
    """``merge`` in one cumulative pass: each group gets a number in the groups' own sort order (keys
    compared null-safely), and its times are moved into a range of their own above every earlier group's
    (number × the frame's time width). The moved start is then the one sort key, a single integer instead
    of strings and times compared row by row (3× faster to sort), and no group sees another's ends. Only the
    numbers and moved times are sorted and swept; the groups' keys join the (fewer) pieces after.
    None where the moved times could overflow, or a time is missing."""
    moved = _moved(frame, by, start, end, [])
    if moved is None:
        return None
    groups, rows, offset = moved
    return _keyed(_swept(rows, start, end, offset), groups, by, [start, end]).collect(engine=ENGINE)


def _moved(frame: pl.DataFrame, by: list[str], start: str, end: str, keep: list[str]
           ) -> tuple[pl.DataFrame, pl.LazyFrame, pl.Expr] | None:
    """The groups (``_numbered``), ``frame``'s rows sorted by their moved start (``_GROUP``, ``keep``, moved
    ``start`` and end as ``reach``) and the offset that moved them; None where the moved times could
    overflow, or a time is missing."""
    starts, ends = frame.get_column(start), frame.get_column(end)
    if starts.null_count() or ends.null_count():
        return None
    lo, hi = starts.min(), ends.max()
    groups, numbered = _numbered(frame, by, start, end, keep)
    if (groups.height + 1) * (hi - lo + 1) >= _FLAT_LIMIT:
        return None
    offset = pl.col(_GROUP).cast(pl.Int64) * (hi - lo + 1) - lo  # group g's times land in [g·width, (g+1)·width)
    moved = numbered.select(_GROUP, *keep, pl.col(start) + offset, reach=pl.col(end) + offset).sort(start)
    return groups, moved, offset


def _swept(moved: pl.LazyFrame, start: str, end: str, offset: pl.Expr) -> pl.LazyFrame:
    """The merged intervals (``_GROUP``, ``start``, ``end``, back on their own times) of rows sorted by their
    moved start (``_moved``): one running maximum over them all, as no group's times reach another's."""
    swept = moved.select(_GROUP, start, reach=pl.col("reach").cum_max()).with_columns(
        opens=(pl.col(start) > pl.col("reach").shift(1)).fill_null(True)
    )
    return _pieces(swept, [_GROUP], start, end).select(_GROUP, pl.col(start, end) - offset)


def _keyed(pieces: pl.LazyFrame, groups: pl.DataFrame, by: list[str], columns: list[str]) -> pl.LazyFrame:
    """``pieces`` (with ``_GROUP``) with their groups' keys ``by`` joined back, in their order: ``by`` +
    ``columns``."""
    keyed = pieces.join(groups.lazy(), on=_GROUP, how="left", maintain_order="left") if by else pieces
    return keyed.select(*by, *columns)


def merge_each(frame: pl.DataFrame, by: list[str], column: str, unions: dict[str, list[str]],
               start: str = "start", end: str = "end") -> pl.DataFrame:
    """Several unions of ``frame``'s rows at once: for each name of ``unions``, ``merge`` (per group ``by``)
    of the rows whose ``column`` is one of its values. Columns ``by`` + ``column`` (the union's name, an
    ``Enum`` of the names: cheap to group by) + ``start``, ``end``; the unions in the order given, each
    sorted as ``merge`` sorts.

    A big frame is sorted once for them all (``_moved``); each union is then one sweep over its rows, which
    stay in order when filtered (a union of others' rows costs no second sort)."""
    names = pl.Enum(list(unions))
    moved = _moved(frame, by, start, end, [column]) if frame.height >= _FLAT_ROWS else None
    if moved is None:  # the unions' rows copied, tagged by union, and merged as one frame
        tagged = pl.concat([frame.lazy().filter(pl.col(column).is_in(values)).select(
            *by, pl.lit(name, names).alias(column), start, end) for name, values in unions.items()])
        return merge(tagged.collect(engine=ENGINE), [column, *by], start, end).select(*by, column, start, end)
    groups, rows, offset = moved
    rows = rows.collect(engine=ENGINE).lazy()
    pieces = [
        _swept(rows.filter(pl.col(column).is_in(values)), start, end, offset).with_columns(
            pl.lit(name, names).alias(column))
        for name, values in unions.items()
    ]
    return _keyed(pl.concat(pieces), groups, by, [column, start, end]).collect(engine=ENGINE)


def _numbered(frame: pl.DataFrame, by: list[str], start: str, end: str, keep: list[str] | None = None
              ) -> tuple[pl.DataFrame, pl.LazyFrame]:
    """The groups (``by`` in sort order, nulls first as in a sort, with their number ``_GROUP``: 0, 1, ...)
    and the rows' times (and columns ``keep``) with each one's group number. One key's sorted distinct
    values are replaced by their places (faster than a join)."""
    lazy, keep = frame.lazy(), keep or []
    if not by:
        return pl.DataFrame({_GROUP: [0]}, schema={_GROUP: pl.UInt32}), lazy.select(
            pl.lit(0, pl.UInt32).alias(_GROUP), *keep, start, end)
    if len(by) == 1:
        values = frame.get_column(by[0]).unique().sort()
        number = pl.col(by[0]).replace_strict(values, pl.Series(range(values.len()), dtype=pl.UInt32))
        groups = values.to_frame().with_row_index(_GROUP).cast({_GROUP: pl.UInt32})
        return groups, lazy.select(number.alias(_GROUP), *keep, start, end)
    groups = frame.select(by).unique().sort(by).with_row_index(_GROUP)
    return groups, lazy.join(groups.lazy(), on=by, how="left", nulls_equal=True).select(_GROUP, *keep, start, end)


def union_stats(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group, in the groups' sort order: ``busy_ns`` (length of the union), ``window_start_ns``/
    ``window_end_ns`` (first and last busy instant) and ``idle_ns`` = window − busy (``unions``)."""
    stats = unions(frame.select(*by, "start", "end"), by).lazy().sort(by).select(
        *by, busy_ns="ns", window_start_ns="start", window_end_ns="end")
    return stats.with_columns(idle_ns=pl.col("window_end_ns") - pl.col("window_start_ns") - pl.col("busy_ns")).collect(
        engine=ENGINE)


def unions(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Per group of ``by`` (one or more columns): ``ns``, the length of the union of its intervals, and its
    first ``start`` and last ``end``, in the groups' sort order. A pass is a group of a few spans and a job
    has thousands of them, and a window per group (``merge``'s) costs per group: here each group has a
    number and its times are moved above every earlier group's (number × the time width), so that the
    running maximum of the ends within every group is one cumulative maximum over the whole frame
    (``_lengths``). A small frame is sorted by its keys and start, and numbered where its keys change; a
    big one is numbered first (``_numbered``) and sorted by the moved start alone, one integer instead of
    keys compared row by row."""
    if frame.is_empty():
        return pl.DataFrame(schema={**{k: frame.schema[k] for k in by}, "ns": pl.Int64, "start": pl.Int64,
                                    "end": pl.Int64})
    lo, hi = frame["start"].min(), frame["end"].max()
    missing = frame["start"].null_count() + frame["end"].null_count()
    if missing or (frame.height + 1) * (hi - lo + 1) >= _FLAT_LIMIT:
        return merge(frame, by).group_by(by).agg(
            ns=(pl.col("end") - pl.col("start")).sum(), start=pl.col("start").min(), end=pl.col("end").max()
        )
    if frame.height < _KEYED_ROWS or not by:
        ordered = frame.lazy().select(*by, "start", "end").sort(*by, "start")
        first = pl.any_horizontal(pl.col(k).ne_missing(pl.col(k).shift(1)) for k in by) if by else pl.lit(False)
        group = first.cum_sum().cast(pl.Int64)
        return _lengths(ordered.with_columns(group.alias(_GROUP)), by, lo, hi).collect(engine=ENGINE)
    groups, numbered = _numbered(frame, by, "start", "end")
    moved = pl.col(_GROUP).cast(pl.Int64) * (hi - lo + 1) + pl.col("start")
    summed = _lengths(numbered.sort(moved), [_GROUP], lo, hi).sort(_GROUP)
    return _keyed(summed, groups, by, ["ns", "start", "end"]).collect(engine=ENGINE)


def _lengths(ordered: pl.LazyFrame, by: list[str], lo: int, hi: int) -> pl.LazyFrame:
    """``unions`` of rows sorted by group and start, each with its group's number (``_GROUP``, ascending),
    per group ``by`` in that order. Each interval adds what of it lies past the ends before it in its group
    (sorted by start, the union before it covers everything from its start to their running maximum)."""
    first = pl.col(_GROUP).ne_missing(pl.col(_GROUP).shift(1))
    offset = pl.col(_GROUP).cast(pl.Int64) * (hi - lo + 1) - lo  # group g's times land in [g·width, (g+1)·width)
    before = (pl.col("end") + offset).cum_max().shift(1) - offset  # the previous rows' running maximum
    beyond = pl.when(first).then(pl.col("end") - pl.col("start")).otherwise(
        (pl.col("end") - pl.max_horizontal("start", before)).clip(0)
    )
    return ordered.with_columns(ns=beyond).group_by(by, maintain_order=True).agg(
        pl.col("ns").sum(), start=pl.col("start").min(), end=pl.col("end").max())


def gaps(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Idle gaps between merged intervals per group: ``by`` + ``start``, ``end`` (positive lengths only)."""
    merged = merge(frame, by)
    return (
        merged.with_columns(gap_start=pl.col("end").shift(1).over(by))
        .filter(pl.col("gap_start").is_not_null() & (pl.col("start") > pl.col("gap_start")))
        .select(*by, start=pl.col("gap_start"), end=pl.col("start"))
    )


def top_level(frame: pl.DataFrame, by: str = "lane", *, keep_overhanging: bool = False) -> pl.DataFrame:
    """The top-level spans of each ``by`` group (a CPU thread's operators, not the calls nested inside them),
    ordered by group, start, and longest first at equal starts.

    A span is top-level when it starts at or after the end of every span before it. With
    ``keep_overhanging``, a span that starts inside an earlier one but ends after it is kept too: a CPU
    stage's work (``work._cpu_work``) wants every stretch of work no other span covers, while a launch's
    context (``labels._launch_context``) wants disjoint operators to look the launch up in. Lanes need
    neither: their busy time is a union, so nesting never counts twice.
    """
    ordered = frame.sort(by, "start", pl.col("end"), descending=[False, False, True])
    reach = pl.col("end").cum_max().shift(1).over(by)
    top = (pl.col("start") >= reach).fill_null(True)
    return ordered.filter(top | (pl.col("end") > reach) if keep_overhanging else top)
