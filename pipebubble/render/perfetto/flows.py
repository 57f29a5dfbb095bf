"""Each span's own arguments and its flow arrows, joined to the span table for the Perfetto export.

``attach`` adds three columns: ``args`` (the event's ``args`` object as JSON text, or null), ``category`` (its
``cat``, or null) and ``flows`` (a list of
``{id, cat, step, last}``: the arrows this span starts, passes on or ends). Ids count from 1 over the whole job,
so the flows of two ranks never share one.

A flow event binds to a slice as the Trace Event Format says ("Flow Events" in Google's Trace Event Format
document, as catapult and Perfetto import it): ``s`` and ``t`` to the innermost slice enclosing their
timestamp on their thread; ``f`` too when ``bp`` is ``"e"``, else to the next slice to begin there. Flows
restart after each ``f`` (an id may be reused). Runtime calls and the GPU work they launched share a
correlation id; where the file draws no flow between them (Nsight reports never do), one is drawn, as
Perfetto's and Kineto's viewers draw them.
"""

from __future__ import annotations

import polars as pl

FLOW = pl.Struct({"id": pl.Int64, "cat": pl.String, "step": pl.Int32, "last": pl.Boolean})
#: The flow category given to a runtime-call-to-GPU-work arrow drawn from correlation ids.
CORRELATION = "correlation"
_KEY = ["source", "_pid", "_tid"]


def attach(spans: pl.DataFrame, args: pl.DataFrame | None = None, flows: pl.DataFrame | None = None
           ) -> pl.DataFrame:
    """``spans`` with ``args``, ``category`` and ``flows`` columns (``args``: ``ingest.extras.ARGS_SCHEMA``
    rows, ``flows``: ``FLOW_SCHEMA`` rows; either may be None)."""
    table = spans.with_row_index("_row").with_columns(
        _pid=pl.coalesce("pid", "device").cast(pl.Int64), _tid=pl.coalesce("tid", "stream"))
    table = _with_args(table, args) if args is not None and args.height else table.with_columns(
        args=pl.lit(None, pl.String), category=pl.lit(None, pl.String))
    steps = _source_steps(table, flows) if flows is not None and flows.height else _no_steps()
    steps = pl.concat([steps, _correlation_steps(table, steps)])
    per_row = steps.group_by("_row").agg(flows=pl.struct(id="flow", cat="cat", step="step", last="last"))
    table = table.join(per_row, on="_row", how="left", maintain_order="left")
    return table.with_columns(pl.col("flows").cast(pl.List(FLOW))).drop("_row", "_pid", "_tid")


def _with_args(table: pl.DataFrame, args: pl.DataFrame) -> pl.DataFrame:
    """A complete event's args by its source, thread, name, start and end; a begin event's without the end."""
    complete = args.filter(pl.col("ph") == "X").rename({"pid": "_pid", "tid": "_tid"})
    keys = [*_KEY, "name", "start", "end"]
    table = table.join(complete.unique(keys, keep="first", maintain_order=True).select(*keys, "args", category="cat"),
                       on=keys, how="left", nulls_equal=True, maintain_order="left")
    begins = args.filter(pl.col("ph") != "X").rename({"pid": "_pid", "tid": "_tid"})
    if not begins.height:
        return table
    keys = keys[:-1]
    begins = begins.unique(keys, keep="first", maintain_order=True).select(*keys, _args="args", _cat="cat")
    table = table.join(begins, on=keys, how="left", nulls_equal=True, maintain_order="left")
    matched = pl.col("args").is_not_null() | pl.col("category").is_not_null()
    return table.with_columns(args=pl.when(matched).then("args").otherwise("_args"),
                              category=pl.when(matched).then("category").otherwise("_cat")).drop("_args", "_cat")


def _no_steps() -> pl.DataFrame:
    return pl.DataFrame(schema={"_row": pl.UInt32, "flow": pl.Int64, "cat": pl.String, "step": pl.Int32,
                                "last": pl.Boolean})


def _source_steps(table: pl.DataFrame, flows: pl.DataFrame) -> pl.DataFrame:
    """The file's flow events bound to spans, as steps of numbered flows (at least two slices each)."""
    slices = table.select("_row", *_KEY, "start", "end").sort("start", pl.col("end"), descending=[False, True])
    events = flows.rename({"pid": "_pid", "tid": "_tid"}).with_row_index("_order").sort("ts")
    nxt = (pl.col("ph") == "f") & (pl.col("bp").fill_null("") != "e")
    enclosing = events.filter(~nxt).join_asof(slices, left_on="ts", right_on="start", by=_KEY,
                                              strategy="backward", check_sortedness=False)
    inside = pl.col("end") >= pl.col("ts")
    missed = enclosing.filter(~inside.fill_null(False)).drop("_row", "start", "end")
    following = events.filter(nxt).join_asof(slices, left_on="ts", right_on="start", by=_KEY, strategy="forward",
                                             check_sortedness=False)
    cols = ["_order", "source", "ph", "cat", "id", "ts", "_row"]
    bound = pl.concat([enclosing.filter(inside).select(cols), _swept(slices, missed).select(cols),
                       following.select(cols)]).filter(pl.col("_row").is_not_null())
    chain = ["source", "cat", "id"]
    bound = bound.sort(*chain, "ts", "_order").with_columns(
        chain=(pl.col("ph") == "f").cast(pl.Int32).cum_sum().shift(1, fill_value=0).over(chain))
    once = pl.col("_row").ne_missing(pl.col("_row").shift(1).over([*chain, "chain"]))  # a slice once per flow
    bound = bound.filter(once)
    groups = bound.group_by([*chain, "chain"], maintain_order=True).agg("_row").filter(pl.col("_row").list.len() > 1)
    return _numbered(groups.select("cat", "_row"))


def _swept(slices: pl.DataFrame, missed: pl.DataFrame) -> pl.DataFrame:
    """Events whose latest-starting slice had ended (they sit in a parent after a child): a sweep over their
    threads' slices with a stack of the open ones finds the innermost that encloses each."""
    found: list[tuple[int, int]] = []
    if missed.height:
        threads = slices.join(missed.select(_KEY).unique(), on=_KEY, nulls_equal=True)
        groups = threads.partition_by(_KEY, as_dict=True, maintain_order=True)
        for key, events in missed.partition_by(_KEY, as_dict=True, maintain_order=True).items():
            rows = groups[key].select("_row", "start", "end").rows() if key in groups else []
            found += _sweep(rows, events.sort("ts").select("_order", "ts").rows())
    rows = pl.DataFrame(found, schema={"_order": pl.UInt32, "_row": pl.UInt32}, orient="row")
    return missed.join(rows, on="_order", how="left")


def _sweep(slices: list[tuple[int, int, int]], events: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(event, slice) for each event (order, ts) inside a slice (row, start, end; by start, longer first)."""
    out, stack, i = [], [], 0
    for order, ts in events:
        while i < len(slices) and slices[i][1] <= ts:
            while stack and stack[-1][2] < slices[i][1]:
                stack.pop()
            stack.append(slices[i])
            i += 1
        while stack and stack[-1][2] < ts:
            stack.pop()
        if stack:
            out.append((order, stack[-1][0]))
    return out


def _numbered(groups: pl.DataFrame, first: int = 1) -> pl.DataFrame:
    """One row per step of each flow (``groups``: cat and the list of its slices' rows, in order)."""
    steps = groups.with_row_index("flow", offset=first).with_columns(
        pl.col("flow").cast(pl.Int64), n=pl.col("_row").list.len()).explode("_row")
    steps = steps.with_columns(step=pl.int_range(pl.len(), dtype=pl.Int32).over("flow"))
    return steps.select("_row", "flow", "cat", "step", last=pl.col("step") == pl.col("n") - 1)


def _correlation_steps(table: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """A flow from each host span to each GPU span of its correlation id (same file, same process where both
    say), unless the file's own flows already link the two."""
    has = pl.col("correlation").is_not_null()
    host = table.filter(has & pl.col("device").is_null()).select("source", "correlation", "pid", src="_row",
                                                                  start0="start")
    gpu = table.filter(has & pl.col("device").is_not_null()).select("source", "correlation", dst="_row",
                                                                    gpid="pid", start1="start")
    pairs = host.join(gpu, on=["source", "correlation"]).filter(
        pl.col("pid").is_null() | pl.col("gpid").is_null() | (pl.col("pid") == pl.col("gpid")))
    linked = steps.sort("flow", "step").select(src="_row", dst=pl.col("_row").shift(-1).over("flow")).drop_nulls()
    pairs = pairs.join(linked, on=["src", "dst"], how="anti").sort("start1", "start0", "src", "dst")
    groups = pairs.select(cat=pl.lit(CORRELATION), _row=pl.concat_list("src", "dst"))
    first = int(steps["flow"].max() or 0) + 1
    return _numbered(groups, first) if groups.height else _no_steps()

