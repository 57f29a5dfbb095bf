"""The request table: one row per served request, a table of its own beside the span table.

Filled from request spans (OpenTelemetry ``llm_request`` spans as vLLM exports them, in OTLP JSON or Jaeger JSON)
or from the request events an engine writes into its own trace (``pipebubble capture --workload serve``). Times
are int64 ns on the file's clock (epoch ns for OTLP); durations are ns; unknown is null, never guessed.

- ``arrival``: the request reached the server; ``scheduled``: it left the queue (its first prefill began);
  ``first_token``: its first output token; ``completion``: its last.
- ``queue_ns``, ``ttft_ns``, ``e2e_ns``, ``prefill_ns``, ``decode_ns``: as the source states them (vLLM's
  ``gen_ai.latency.*`` attributes, in seconds there), else derived from the instants above where both ends exist.
- ``prompt_tokens``, ``completion_tokens``: as the source states them.
- ``preemptions``: how often the engine evicted the request (vLLM's journey ``PREEMPTED`` events or its
  ``preempted`` phase spans); ``requeue_ns``: the time it waited to be scheduled again after them, the time a
  preemption lost (its recompute is not in it: no event marks where it ends); ``lost_tokens``: the tokens it had
  computed at each preemption, summed (a recompute preemption frees them all; journey events only).
- ``intervals``: the request's phases in order, each ``{phase, start, end}`` in ns from its arrival (so the
  file's clock offset leaves them as they are): ``queue`` (the first wait), ``requeue`` (each wait after a
  preemption), ``prefill`` (running before the first token), ``decode``, ``kv_transfer``; empty where the
  source gives only durations.

The step table (``STEP_SCHEMA``, ``FileResult.request_steps``): one row per scheduler step an engine traced
(vLLM's step tracing, ``step.BATCH_SUMMARY`` events; sampled, so step ids have gaps): its id, start and end,
the queue (``waiting``) and running batch, the requests and tokens of prefill and decode, those that finished
or were preempted in it, and the KV cache's use (``kv_usage``, 0..1) and blocks.
"""

from __future__ import annotations

import polars as pl

from pipebubble import spans

SCHEMA: dict[str, pl.DataType] = {
    "source": pl.String,
    "request_id": pl.String,
    "arrival": pl.Int64,
    "scheduled": pl.Int64,
    "first_token": pl.Int64,
    "completion": pl.Int64,
    "queue_ns": pl.Int64,
    "ttft_ns": pl.Int64,
    "e2e_ns": pl.Int64,
    "prefill_ns": pl.Int64,
    "decode_ns": pl.Int64,
    "prompt_tokens": pl.Int64,
    "completion_tokens": pl.Int64,
    "preemptions": pl.Int64,
    "requeue_ns": pl.Int64,
    "lost_tokens": pl.Int64,
    "intervals": pl.List(pl.Struct({"phase": pl.String, "start": pl.Int64, "end": pl.Int64})),
}

STEP_SCHEMA: dict[str, pl.DataType] = {
    "step": pl.Int64,
    "start": pl.Int64,
    "end": pl.Int64,
    "waiting": pl.Int64,
    "running": pl.Int64,
    "prefill_reqs": pl.Int64,
    "decode_reqs": pl.Int64,
    "prefill_tokens": pl.Int64,
    "decode_tokens": pl.Int64,
    "scheduled_tokens": pl.Int64,
    "finished": pl.Int64,
    "preempted": pl.Int64,
    "kv_usage": pl.Float64,
    "kv_blocks_total": pl.Int64,
    "kv_blocks_free": pl.Int64,
}


def empty() -> pl.DataFrame:
    """A request table with no rows."""
    return pl.DataFrame(schema=SCHEMA)


def empty_steps() -> pl.DataFrame:
    """A step table with no rows."""
    return pl.DataFrame(schema=STEP_SCHEMA)


def conform(frame):
    """Cast ``frame`` (eager or lazy, kept so) to the request table's schema (``spans.conform``)."""
    return spans.conform(frame, SCHEMA)
