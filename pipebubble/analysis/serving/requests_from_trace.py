"""Served requests from the request events an engine writes into its own trace.

The events are CPU ranges (``record_function`` in torch: Kineto ``user_annotation``; NVTX in Nsight) named
``request:{event} id={id}`` and then ``key=value`` fields, as ``pipebubble capture --workload serve`` emits
them (``capture/workloads/serve.py`` lists them: ``arrival prompt=N``, ``scheduled``, ``prefill tokens=N``,
``decode``, ``kv_alloc blocks=N used=U``, ``kv_free blocks=N used=U``, ``first_token``, ``completion
tokens=N``). An event happens at its range's start; the range's length means nothing.

Three frames come out, all times int64 ns on the file's clock and null where the trace does not say:

- ``requests``: the request table (``requests_table.SCHEMA``), one row per request id of each file; queue,
  TTFT, e2e, prefill (scheduled → first token) and decode (first → last token) derived from the instants.
- ``steps``: one row per (request, engine step it took part in): ``phase`` (prefill or decode), its prompt
  ``tokens`` (1 for a decode), the step's ``step_start``/``step_end`` and whether it held a prefill
  (``step_has_prefill``), from the engine's step label on the same thread (``steps_llm.find_steps``) that
  holds the event; null when no step label holds it.
- ``kv``: the KV-cache's occupancy over time, one row per allocation or release: ``t``, ``request_id``,
  ``event`` (kv_alloc, kv_free), ``blocks`` it moved and ``blocks_used`` across the cache after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipebubble import requests_table
from pipebubble.analysis.serving.steps_llm import find_steps

#: The name of a request event: its kind and its request id; ``key=value`` fields may follow.
EVENT = r"^request:(?P<event>[a-z_]+) id=(?P<id>\S+)"
FIELDS = ("prompt", "tokens", "blocks", "used")
STEP_SCHEMA = {"source": pl.String, "request_id": pl.String, "phase": pl.String, "tokens": pl.Int64,
               "at": pl.Int64, "step_start": pl.Int64, "step_end": pl.Int64, "step_has_prefill": pl.Boolean}
KV_SCHEMA = {"source": pl.String, "t": pl.Int64, "request_id": pl.String, "event": pl.String,
             "blocks": pl.Int64, "blocks_used": pl.Int64}


@dataclass(frozen=True)
class TraceRequests:
    """The request table, each request's engine steps and the KV-cache occupancy of one trace."""

    requests: pl.DataFrame
    steps: pl.DataFrame
    kv: pl.DataFrame


def _field(key: str) -> pl.Expr:
    """The integer value of ``key=`` in an event's name (null where it has none)."""
    return pl.col("name").str.extract(rf" {key}=(\d+)(?: |$)").cast(pl.Int64).alias(key)


def request_events(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per request event: source, lane, ``at`` (the range's start), ``event``, ``request_id`` and
    the integer fields (``FIELDS``)."""
    marks = spans.filter(pl.col("kind") == "annotation", pl.col("name").str.starts_with("request:"))
    parts = pl.col("name").str.extract_groups(EVENT)
    return (marks.select("source", "lane", "name", at="start", parts=parts).unnest("parts")
            .rename({"id": "request_id"}).filter(pl.col("request_id").is_not_null())
            .select("source", "lane", "at", "event", "request_id", *(_field(k) for k in FIELDS)))


def _at(event: str, first: bool = True) -> pl.Expr:
    """The earliest (or the latest) time of ``event`` in a request's group."""
    times = pl.col("at").filter(pl.col("event") == event)
    return (times.min() if first else times.max()).alias(event)


def _value(event: str, key: str) -> pl.Expr:
    """``key=`` of a request's ``event`` (its first such event)."""
    return pl.col(key).filter(pl.col("event") == event).first()


def request_table(events: pl.DataFrame) -> pl.DataFrame:
    """The request table (``requests_table.SCHEMA``) of ``request_events``' rows, ordered by arrival."""
    rows = events.group_by("source", "request_id").agg(
        _at("arrival"), _at("scheduled"), _at("first_token"), _at("completion", first=False),
        prompt_tokens=_value("arrival", "prompt"), completion_tokens=_value("completion", "tokens"))
    since = {"queue_ns": ("arrival", "scheduled"), "ttft_ns": ("arrival", "first_token"),
             "e2e_ns": ("arrival", "completion"), "prefill_ns": ("scheduled", "first_token"),
             "decode_ns": ("first_token", "completion")}
    table = rows.with_columns(**{name: pl.col(end) - pl.col(start) for name, (start, end) in since.items()})
    return requests_table.conform(table.sort("source", "arrival", "request_id", nulls_last=True))


def request_steps(events: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Each request's prefill and decode events, placed in the engine step whose range holds them."""
    taking_part = events.filter(pl.col("event").is_in(["prefill", "decode"])).sort("at")
    if taking_part.is_empty():
        return pl.DataFrame(schema=STEP_SCHEMA)
    steps = find_steps(spans).select(
        "lane", step_start="start", step_end="end", step_has_prefill=pl.col("cls").is_in(["prefill", "mixed"]))
    placed = taking_part.join_asof(steps.sort("step_start"), left_on="at", right_on="step_start", by="lane",
                                   strategy="backward", check_sortedness=False)
    inside = pl.col("at") <= pl.col("step_end")
    return placed.select(
        "source", "request_id", "at", phase="event",
        tokens=pl.when(pl.col("event") == "decode").then(pl.lit(1, pl.Int64)).otherwise(pl.col("tokens")),
        **{c: pl.when(inside).then(pl.col(c)) for c in ("step_start", "step_end", "step_has_prefill")},
    ).sort("source", "at").cast(STEP_SCHEMA)


def kv_occupancy(events: pl.DataFrame) -> pl.DataFrame:
    """The KV-cache's blocks in use after each allocation and release, in time order."""
    moves = events.filter(pl.col("event").is_in(["kv_alloc", "kv_free"]))
    return moves.select("source", "at", "request_id", "event", "blocks", "used").sort("source", "at").rename(
        {"at": "t", "used": "blocks_used"}).cast(KV_SCHEMA)


def requests_from_trace(spans: pl.DataFrame) -> TraceRequests:
    """The requests, their engine steps and the KV-cache occupancy that ``spans`` (one file's span table)
    record in request events; empty frames when it holds none."""
    events = request_events(spans)
    return TraceRequests(request_table(events), request_steps(events, spans), kv_occupancy(events))
