"""The request table: one row per served request, a table of its own beside the span table.

Filled from request spans (OpenTelemetry ``llm_request`` spans as vLLM exports them, in OTLP JSON or Jaeger JSON)
or from the request events an engine writes into its own trace (``pipebubble capture --workload serve``). Times
are int64 ns on the file's clock (epoch ns for OTLP); durations are ns; unknown is null, never guessed.

- ``arrival``: the request reached the server; ``scheduled``: it left the queue (its first prefill began);
  ``first_token``: its first output token; ``completion``: its last.
- ``queue_ns``, ``ttft_ns``, ``e2e_ns``, ``prefill_ns``, ``decode_ns``: as the source states them (vLLM's
  ``gen_ai.latency.*`` attributes, in seconds there), else derived from the instants above where both ends exist.
- ``prompt_tokens``, ``completion_tokens``: as the source states them.
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
}


def empty() -> pl.DataFrame:
    """A request table with no rows."""
    return pl.DataFrame(schema=SCHEMA)


def conform(frame):
    """Cast ``frame`` (eager or lazy, kept so) to the request table's schema (``spans.conform``)."""
    return spans.conform(frame, SCHEMA)
