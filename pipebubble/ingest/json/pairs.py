"""Pairing a trace's duration events into spans: ``B``/``E`` on a stack per pid/tid, async ``b``/``e`` by
category, id and name. These are few per trace, so they come back from the block decoders (unlike complete
``X`` events, which become spans where their block is decoded) and are paired here in time order; ends
without a begin and begins without an end are counted, never guessed. A pair's arguments are merged (the
Trace Event Format's rule): where its begin or end names a ``microbatch`` (and ``model_chunk``), the span is
named for them (``spans.args_label``: ``forward (microbatch 3, model_chunk 1)``), which the pipeline's labels
read.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from pipebubble.ingest.json.columns import ENGINE
from pipebubble.spans import args_label


def paired_spans(events: pl.DataFrame) -> tuple[pl.DataFrame, Counter[str]]:
    """``B``/``E`` pairs (a stack per pid/tid) and async ``b``/``e`` pairs (by category, id and name). The
    events in time order and the count of those without a time come from one plan."""
    no_time = pl.when(pl.col("ts_ns").is_null()).then(pl.lit("bad_time"))
    rows = events.lazy().filter(pl.col("ph").is_in(["B", "E", "b", "e"]))
    rows = rows.with_columns(skip=pl.coalesce("skip", no_time))
    reasons = rows.filter(pl.col("skip").is_not_null()).group_by("skip").len()
    ordered = rows.filter(pl.col("skip").is_null()).sort("ts_ns", maintain_order=True)  # ties: file order
    fields = ("ph", "cat", "name", "pid", "tid", "ts_ns", "id", "external_id", "correlation", "mb", "chunk")
    reasons, ordered = pl.collect_all([reasons, ordered.select(fields)], engine=ENGINE)
    skipped = Counter(dict(reasons.iter_rows()))
    out: list[tuple] = []
    stacks: dict[tuple, list[tuple]] = {}
    for ph, cat, name, pid, tid, ts, eid, ext, corr, mb, chunk in ordered.iter_rows():
        key = (pid, tid) if ph in "BE" else (cat, eid, name)
        if ph in "Bb":
            stacks.setdefault(key, []).append((cat, name, pid, tid, ts, ext, corr, mb, chunk))
        elif stacks.get(key):
            b_cat, b_name, b_pid, b_tid, b_ts, b_ext, b_corr, b_mb, b_chunk = stacks[key].pop()
            mb, chunk = b_mb if mb is None else mb, b_chunk if chunk is None else chunk  # E's win over B's
            label = args_label(b_name or name, mb, chunk)
            out.append((b_cat, label, b_pid, b_tid, b_ext, b_corr, b_ts, ts))
        else:
            skipped["unmatched_end" if ph == "E" else "unmatched_async_end"] += 1
    for key, left in stacks.items():
        if left:
            skipped["unmatched_begin" if len(key) == 2 else "unmatched_async_begin"] += len(left)
    schema = {
        "cat": pl.String,
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "external_id": pl.Int64,
        "correlation": pl.Int64,
        "start": pl.Int64,
        "end": pl.Int64,
    }
    return pl.DataFrame(out, schema=schema, orient="row"), skipped
