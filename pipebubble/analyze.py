"""Orchestration: an ingested span table in, a Report out. Pure: no printing, no files."""

from __future__ import annotations

from dataclasses import dataclass

from pipebubble.analysis.interference import interference
from pipebubble.analysis.lanes import lane_table
from pipebubble.analysis.pipeline_report import PipelineOptions, pipeline_section
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import Ingested
from pipebubble.report import IngestSummary, Lane, Report


def summarize_ingest(ingested: Ingested) -> IngestSummary:
    return IngestSummary(
        files=[f.source for f in ingested.files],
        events_read=sum(f.events_read for f in ingested.files),
        spans=ingested.spans.height,
        skipped=dict(sorted(ingested.skipped.items())),
        warnings=ingested.warnings,
        formats={f.source: f.format for f in ingested.files},
        unread_bytes=sum(f.meta.get("unread_bytes", 0) for f in ingested.files),
    )


@dataclass(frozen=True)
class ServingOptions:
    step_regex: str | None = None  # named groups: mode, prefill_reqs, prefill_tokens, decode_reqs, bs, toks
    tbt_slo_ms: float | None = None


def analyze(
    ingested: Ingested, pipeline: PipelineOptions | None = None, serving: ServingOptions | None = None
) -> Report:
    """Lanes always; stages, pipeline, waits and timeline when the traces hold a pipeline; prefill/decode
    interference when they hold LLM engine steps."""
    if ingested.spans.is_empty():
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(ingested.skipped.items())) or "none"
        files = ", ".join(f.source for f in ingested.files)
        raise TraceFormatError(files, f"nothing to analyse: no event became a span (not spans: {skipped})")
    lanes = [Lane(**row) for row in lane_table(ingested.spans).iter_rows(named=True)]
    section = pipeline_section(ingested.spans, pipeline or PipelineOptions())
    serving = serving or ServingOptions()
    steps, segments = interference(ingested.spans, step_regex=serving.step_regex, tbt_slo_ms=serving.tbt_slo_ms)
    return Report(
        ingest=summarize_ingest(ingested),
        lanes=lanes,
        stages=section.stages,
        pipeline=section.pipeline,
        waits=section.waits,
        interference=steps,
        timeline=section.timeline + segments,
    )
