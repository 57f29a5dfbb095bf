"""Orchestration: an ingested span table in, a Report out. Pure: no printing, no files.

The work is the map and reduce of ``pipebubble.mapreduce`` run in this process over files already read.
"""

from __future__ import annotations

from pipebubble.analysis.pipeline_report import PipelineOptions
from pipebubble.ingest import Ingested
from pipebubble.mapreduce import Options, ServingOptions, map_spans, reduce
from pipebubble.report import Report

__all__ = ["ServingOptions", "analyze"]


def analyze(
    ingested: Ingested, pipeline: PipelineOptions | None = None, serving: ServingOptions | None = None
) -> Report:
    """Lanes always; stages, pipeline, waits and timeline when the traces hold a pipeline; prefill/decode
    interference when they hold LLM engine steps."""
    ranks = ingested.spans["rank"].drop_nulls()
    world = int(ranks.max()) + 1 if ranks.len() else None
    options = Options(pipeline or PipelineOptions(), serving or ServingOptions(), world, len(ingested.files))
    return reduce([map_spans(f, options) for f in ingested.files], options)
