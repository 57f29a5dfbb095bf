"""Map: one file's requests (OTLP / Jaeger request spans read into ``FileResult.requests``, or the request
events an engine wrote into its own trace, ``requests_from_trace``), its engine steps (to attribute the tail,
``tail``), the scheduler steps its engine traced (vLLM's step tracing, ``requests_table.STEP_SCHEMA``) and its
KV-cache occupancy; times on the file's clock until the reduce moves them (a request's ``intervals`` are from
its arrival, so they move with it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from pipebubble import requests_table
from pipebubble.analysis.serving.requests_from_trace import EVENT, KV_SCHEMA, requests_from_trace
from pipebubble.analysis.serving.steps_llm import attach_gpu, find_steps

#: Time columns of each frame, which the file's clock offset moves.
TIMES = {"requests": ("arrival", "scheduled", "first_token", "completion"),
         "steps": ("start", "end", "gpu_start", "gpu_end"), "kv": ("t",), "step_trace": ("start", "end")}


@dataclass(frozen=True)
class RequestsPart:
    requests: pl.DataFrame  # requests_table.SCHEMA
    steps: pl.DataFrame  # the engine's steps (steps_llm.STEP_COLUMNS with their GPU work)
    kv: pl.DataFrame  # requests_from_trace.KV_SCHEMA
    step_trace: pl.DataFrame = field(default_factory=requests_table.empty_steps)  # requests_table.STEP_SCHEMA

    FRAMES = ("requests", "steps", "kv", "step_trace")

    def shifted(self, offset: int) -> RequestsPart:
        """The part with ``offset`` taken off every time it holds."""
        return RequestsPart(*(getattr(self, k).with_columns(pl.col(c) - offset for c in TIMES[k]
                                                             if c in getattr(self, k).columns)
                              for k in self.FRAMES))


def has_request_events(spans: pl.DataFrame) -> bool:
    """Whether ``spans`` hold an engine's request events (``requests_from_trace.EVENT``)."""
    return bool(spans.height) and spans.filter(pl.col("kind") == "annotation",
                                               pl.col("name").str.contains(EVENT)).height > 0


def requests_part(requests: pl.DataFrame | None, spans: pl.DataFrame, step_regex: str | None = None,
                  step_trace: pl.DataFrame | None = None) -> RequestsPart | None:
    """The file's part: its request spans, else its own request events, and its traced scheduler steps; None
    when it has none of them. A trace with requests also gives its engine steps."""
    kv = pl.DataFrame(schema=KV_SCHEMA)
    if requests is None and has_request_events(spans):
        found = requests_from_trace(spans)
        requests, kv = found.requests, found.kv
    traced = requests_table.empty_steps() if step_trace is None else step_trace
    if (requests is None or requests.is_empty()) and traced.is_empty():
        return None
    steps = find_steps(spans, step_regex)
    if steps.height:
        steps = attach_gpu(steps, spans)
    table = requests_table.empty() if requests is None else requests
    return RequestsPart(requests_table.conform(table), steps, kv, traced)
