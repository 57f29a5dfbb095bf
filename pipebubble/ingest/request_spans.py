"""The request table and the step table from what ``request_collect`` gathered of a file's spans, whatever
shape vLLM's tracing wrote (``request_collect``'s docstring lists them), in whole-table queries.

A request is its request span (``llm_request``, or a GenAI-conventions span), or a journey ``llm_core`` span
whose parent is not among the spans; its core and phase spans are the spans whose parent is it (a phase span
may hang under the core span). What a span states (``gen_ai.latency.*``, tokens) is kept as stated; what it
does not is derived from its phases, so every shape gives the same figures for the same facts:
- phases: journey state events in order, each interval from one event to the next, its phase by the event
  it starts at (``QUEUED`` -> queue, ``PREEMPTED`` -> requeue, ``SCHEDULED`` -> prefill, or decode once the
  first token came, ``FIRST_TOKEN`` -> decode); or the phase spans (a queue span after the first is a
  requeue; so is the gap from a run span marked ``preempted`` to the next run span, where no queue span
  follows it);
- the request id: the request span's, else its core span's (journey tracing sets it on ``llm_core``);
- scheduled = the first run's start; the engine's first token = the last prefill's end (else the first
  decode's start); queue = the first queue interval; prefill = first token − scheduled (vLLM's
  ``time_in_model_prefill``); decode = the last decode's end − first token; preemptions = the requeue
  intervals, ``requeue_ns`` their sum; ``lost_tokens``: prompt and output tokens done at each ``PREEMPTED``;
- arrival = ``api.ARRIVED``, else the span's start; TTFT to ``api.FIRST_RESPONSE_FROM_CORE``, else the
  engine's first token; e2e to ``api.DEPARTED``, else the span's end; tokens from the last event's progress.
"""

from __future__ import annotations

from collections import Counter

import polars as pl

from pipebubble import requests_table, spans
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.request_collect import LATENCY_PREFIX, REQUEST_SPAN, Collected

_KEY = ("trace_id", "span_id")
_RUN = ("prefill", "decode")
_ORDER = {"row": pl.Int64, "seq": pl.Int64, "name": pl.String, "t": pl.Int64}
#: A step's own start and end are used when they lie within this of its event's time (the same clock).
SAME_CLOCK_NS = 3_600_000_000_000


def finish(out: Collected, fmt: str) -> FileResult:
    """The file's result: no spans, its requests (duplicates and requests without any time counted and left
    out), its traced scheduler steps, the account and the warnings."""
    rows = _frame(out.rows, {"trace_id": pl.String, "span_id": pl.String, "parent_id": pl.String, "kind": pl.String,
                             "request_id": pl.String, "preempted": pl.Boolean})
    unnamed = pl.col("trace_id").is_null() | pl.col("span_id").is_null()
    indexed = rows.with_row_index("row").with_columns(pl.col("row").cast(pl.Int64))
    unique = indexed.filter(pl.struct(*_KEY).is_first_distinct() | unnamed)
    out.skipped["duplicate_span"] += rows.height - unique.height
    table = assemble(unique, _frame(out.events, _ORDER), out.skipped)
    timed = table.filter(pl.any_horizontal(pl.col("start", "ttft_ns", "e2e_ns", "queue_ns").is_not_null()))
    out.skipped["request_without_times"] += table.height - timed.height
    if out.first_bad:
        out.warnings.append(f"{out.path}: {out.skipped['bad_value']} value(s) of the wrong type or out of range "
                            f"left null (first: {out.first_bad})")
    steps = step_table(_frame(out.steps, {"kv_usage": pl.Float64}))
    if timed.is_empty() and steps.is_empty():
        out.warnings.append(f"{out.path}: no request spans ({REQUEST_SPAN}, or spans with {LATENCY_PREFIX}* "
                            f"attributes) among {out.spans_read} span(s)")
    skipped = Counter({k: v for k, v in out.skipped.items() if v})
    return FileResult(str(out.path), spans.empty(), out.spans_read, skipped, out.warnings, {}, fmt,
                      requests=requests_table.conform(derive(timed, str(out.path))),
                      request_steps=steps if steps.height else None)


def _frame(columns: dict[str, list], text: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(columns, schema={k: text.get(k, pl.Int64) for k in columns})


def assemble(rows: pl.DataFrame, events: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    """One row per request (``rows`` indexed by ``row``; ``events``: the journey events of those rows) with its
    stated attributes, ``start``/``end`` and what its phases and events give (module docstring)."""
    owner = _owners(rows, skipped)
    events = events.join(owner, on="row", how="inner").drop("row")
    intervals = pl.concat([_from_events(events), _from_phase_spans(rows.join(owner, on="row"))])
    requests = rows.join(owner.filter(pl.col("row") == pl.col("req")).select("row"), on="row", how="semi")
    core_ids = rows.filter(pl.col("kind") == "core").join(owner, on="row").group_by("req").agg(
        core_request_id=pl.col("request_id").drop_nulls().first())
    facts = _phase_facts(intervals).join(_event_facts(events), on="req", how="full", coalesce=True).join(
        core_ids, on="req", how="full", coalesce=True)
    table = requests.rename({"row": "req"}).join(facts, on="req", how="left")
    arrival = pl.coalesce("arrived", "start")
    return _relative(table.with_columns(
        request_id=pl.coalesce("request_id", "core_request_id"),
        start=arrival,
        end=pl.coalesce("departed", "end"),
        ttft_ns=pl.coalesce("ttft_ns", pl.coalesce("first_response", "first_at") - arrival),
        queue_ns=pl.coalesce("queue_ns", "first_queue"),
        prefill_ns=pl.coalesce("prefill_ns", pl.col("first_at") - pl.col("scheduled_at")),
        decode_ns=pl.coalesce("decode_ns", pl.col("decode_end") - pl.col("first_at")),
        prompt_tokens=pl.coalesce("prompt_tokens", "prefill_total"),
        completion_tokens=pl.coalesce("completion_tokens", "decode_done")))


def _relative(table: pl.DataFrame) -> pl.DataFrame:
    """Each interval's start and end from its request's arrival."""
    flat = table.select("req", "start", "intervals").explode("intervals").unnest("intervals").filter(
        pl.col("phase").is_not_null())
    moved = flat.group_by("req", maintain_order=True).agg(intervals=pl.struct(
        "phase", start=pl.col("at") - pl.col("start"), end=pl.col("until") - pl.col("start")))
    return table.drop("intervals").join(moved, on="req", how="left")


def _owners(rows: pl.DataFrame, skipped: Counter[str]) -> pl.DataFrame:
    """``row`` -> ``req``: the request each request, core and phase span belongs to (a core span whose parent
    is not among the spans is a request of its own; a phase span without a request is counted and left out)."""
    def by_parent(of: pl.DataFrame, to: pl.DataFrame) -> pl.DataFrame:
        return of.join(to.select(*_KEY, "req"), left_on=["trace_id", "parent_id"], right_on=list(_KEY), how="left")

    requests = rows.filter(pl.col("kind") == "request").with_columns(req="row")
    cores = by_parent(rows.filter(pl.col("kind") == "core"), requests).with_columns(req=pl.coalesce("req", "row"))
    phases = by_parent(rows.filter(pl.col("kind").str.starts_with("phase:")), pl.concat(
        [requests.select(*_KEY, "req"), cores.select(*_KEY, "req")]))
    skipped["phase_span_without_request"] += int(phases["req"].null_count())
    return pl.concat([f.select("row", "req") for f in (requests, cores, phases.drop_nulls("req"))])


def _from_events(events: pl.DataFrame) -> pl.DataFrame:
    """Intervals between a request's consecutive journey state events (module docstring)."""
    state = events.filter(pl.col("name").is_in(["QUEUED", "SCHEDULED", "FIRST_TOKEN", "PREEMPTED", "FINISHED"]),
                          pl.col("t").is_not_null()).sort("req", "t", "seq")
    after = (pl.col("name") == "FIRST_TOKEN").cast(pl.Int64).cum_sum().over("req") > 0
    phase = (pl.when(pl.col("name") == "QUEUED").then(pl.lit("queue"))
             .when(pl.col("name") == "PREEMPTED").then(pl.lit("requeue"))
             .when(pl.col("name") == "FIRST_TOKEN").then(pl.lit("decode"))
             .when(pl.col("name") == "SCHEDULED").then(
                 pl.when(after).then(pl.lit("decode")).otherwise(pl.lit("prefill"))))
    return state.select("req", phase=phase, at=pl.col("t"), until=pl.col("t").shift(-1).over("req")).filter(
        pl.col("phase").is_not_null(), pl.col("until").is_not_null())


def _from_phase_spans(phases: pl.DataFrame) -> pl.DataFrame:
    """Intervals from phase spans; a queue span after the request's first is a requeue, and so is the wait from
    a run span that ended ``preempted`` to the next run span when no queue span comes between."""
    kind = pl.col("kind").str.strip_prefix("phase:")
    rows = phases.filter(pl.col("kind").str.starts_with("phase:"), pl.col("start").is_not_null(),
                         pl.col("end").is_not_null()).sort("req", "start")
    later = (kind == "queue").cast(pl.Int64).cum_sum().over("req") > 1
    spans = rows.select("req", phase=pl.when((kind == "queue") & later).then(pl.lit("requeue")).otherwise(kind),
                        at="start", until="end", preempted=pl.col("preempted").fill_null(False))
    after = spans.with_columns(next_phase=pl.col("phase").shift(-1).over("req"),
                               next_at=pl.col("at").shift(-1).over("req"))
    waits = after.filter(pl.col("preempted"), pl.col("phase").is_in(_RUN), pl.col("next_phase").is_in(_RUN),
                         pl.col("next_at") >= pl.col("until")).select(
        "req", phase=pl.lit("requeue"), at="until", until="next_at")
    return pl.concat([spans.drop("preempted"), waits]).sort("req", "at")


def _phase_facts(intervals: pl.DataFrame) -> pl.DataFrame:
    """Per request: when its first run began and its first token came, its first queue, its last decode's end,
    its preemptions and the time they waited to run again, and its intervals in order."""
    dur = pl.col("until") - pl.col("at")
    is_ = pl.col("phase").eq
    return intervals.sort("req", "at").group_by("req").agg(
        scheduled_at=pl.col("at").filter(pl.col("phase").is_in(_RUN)).min(),
        first_at=pl.coalesce(pl.col("until").filter(is_("prefill")).max(), pl.col("at").filter(is_("decode")).min()),
        first_queue=dur.filter(is_("queue")).first(),
        decode_end=pl.col("until").filter(is_("decode")).max(),
        preemptions=is_("requeue").sum().cast(pl.Int64),
        requeue_ns=dur.filter(is_("requeue")).sum(),
        intervals=pl.struct("phase", "at", "until"))


def _event_facts(events: pl.DataFrame) -> pl.DataFrame:
    """Per request from its journey events: the API layer's instants, its progress and the tokens it had done
    at its preemptions."""
    def at(name: str) -> pl.Expr:
        return pl.col("t").filter(pl.col("name") == name).min()

    done = pl.col("prefill_done").fill_null(0) + pl.col("decode_done").fill_null(0)
    preempted = pl.col("name") == "PREEMPTED"
    return events.group_by("req").agg(
        arrived=at("ARRIVED"), first_response=at("FIRST_RESPONSE_FROM_CORE"), departed=at("DEPARTED"),
        prefill_total=pl.col("prefill_total").max(), decode_done=pl.col("decode_done").max(),
        lost_tokens=done.filter(preempted).sum().cast(pl.Int64),
        core_events=pl.col("name").is_in(["QUEUED", "SCHEDULED", "FINISHED"]).any())


def derive(raw: pl.DataFrame, source: str) -> pl.DataFrame:
    """The request table's instants from a span's start and end and its stated durations: arrival = the span's
    start; e2e as stated, else end − start; first token = arrival + TTFT; completion = arrival + e2e;
    scheduled = the first run's start where phases say, else first token − prefill (vLLM's prefill runs from
    scheduling to the first token), null where it would precede the arrival (the two clocks disagree).
    Preemptions, requeue time and lost tokens are null where the request has no phases (unknown, not 0)."""
    for column in ("scheduled_at", "preemptions", "requeue_ns", "lost_tokens", "core_events", "intervals"):
        if column not in raw.columns:
            raw = raw.with_columns(pl.lit(None).alias(column))
    with_e2e = raw.with_columns(e2e_ns=pl.coalesce("e2e_ns", pl.col("end") - pl.col("start")))
    instants = with_e2e.with_columns(
        source=pl.lit(source), arrival=pl.col("start"), first_token=pl.col("start") + pl.col("ttft_ns"),
        completion=pl.col("start") + pl.col("e2e_ns"))
    scheduled = pl.coalesce("scheduled_at", pl.col("first_token") - pl.col("prefill_ns"))
    known = pl.col("intervals").list.len().fill_null(0) > 0
    return instants.with_columns(
        scheduled=pl.when(scheduled >= pl.col("arrival")).then(scheduled),
        preemptions=pl.when(known).then(pl.col("preemptions").fill_null(0)),
        requeue_ns=pl.when(known).then(pl.col("requeue_ns").fill_null(0)),
        lost_tokens=pl.when(known & pl.col("core_events").fill_null(False)).then(pl.col("lost_tokens").fill_null(0)))


def step_table(raw: pl.DataFrame) -> pl.DataFrame:
    """The traced scheduler steps in step order: a step's own start and end where they lie on its event's clock
    (``SAME_CLOCK_NS``), else its event's time as its end and its duration before it."""
    if raw.is_empty():
        return requests_table.empty_steps()
    near = (pl.col("ts_end") - pl.col("t")).abs() <= SAME_CLOCK_NS
    dur = pl.col("duration_us") * 1000
    end = pl.when(near).then(pl.col("ts_end")).otherwise(pl.col("t"))
    start = pl.when(near & pl.col("ts_start").is_not_null()).then(pl.col("ts_start")).otherwise(end - dur)
    return raw.with_columns(start=start, end=end).filter(pl.col("end").is_not_null()).sort(
        "step", "end", nulls_last=True).select(list(requests_table.STEP_SCHEMA)).cast(requests_table.STEP_SCHEMA)
