"""Host calls and ranges as a user counts them, for the host summary (``breakdown.part.summaries``); the span
table keeps every name as the trace wrote it.

- A range PyTorch writes into NVTX (``emit_nvtx``, ``record_function`` under Nsight) names its call as well as
  its operator: ``name[, seq = N][, op_id = N][, sizes = [...]][, input_op_ids = [...]]``, in that order
  (``torch/csrc/profiler/util.cpp``, ``getNvtxStr``). ``aten::to, seq = 12, op_id = 999599`` and ``aten::to,
  op_id = 2`` are one ``aten::to`` (``range_name``).
- Nsight writes a CUPTI synchronization record (``Stream sync``, ``Event sync``, ``Stream wait sync``,
  ``Context sync``) of each synchronizing runtime call, on the call's own thread and over the same wait:
  listed beside ``cudaStreamSynchronize`` it counts every wait twice. Each record belongs to its call, so the
  runtime calls leave them out (``sync_record``); the span table keeps them. Kineto's records (``Stream
  Sync``, ...) sit on the GPU, never among the host's calls.
"""

from __future__ import annotations

import polars as pl

#: The per-call details PyTorch writes after an operator's name in an NVTX range, at the name's end.
CALL_DETAILS = r"(?:, (?:seq = -?\d+|op_id = \d+|sizes = \[.*\]|input_op_ids = \[.*\]))+$"
#: CUPTI's synchronization types as Nsight (``Stream sync``) and Kineto (``Stream Sync``) name their records.
SYNC_RECORDS = r"(?i)^(?:(?:event|stream wait|stream|context|unknown) sync|stream wait event)$"


def range_name(name: pl.Expr) -> pl.Expr:
    """``name`` without the per-call details PyTorch writes after it (``aten::to, op_id = 7`` -> ``aten::to``)."""
    return name.str.replace(CALL_DETAILS, "")


def sync_record() -> pl.Expr:
    """Whether a span is a CUPTI synchronization record of a runtime call (kind ``sync``, named by its type),
    not the call itself (``cudaStreamSynchronize``, kind ``sync`` in a Kineto trace)."""
    return (pl.col("kind") == "sync") & pl.col("name").cast(pl.String).str.contains(SYNC_RECORDS).fill_null(False)


def per_range(calls: pl.LazyFrame) -> pl.LazyFrame:
    """name, count, total, max: ``calls`` (the same per name as the trace wrote it) per range as
    ``range_name`` names it."""
    named = calls.with_columns(range_name(pl.col("name").cast(pl.String)))
    return named.group_by("name").agg(pl.col("count", "total").sum(), pl.col("max").max())
