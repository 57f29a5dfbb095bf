"""What every format reader returns for one file."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # analysis-free commands (a cached report) need not load polars
    import polars as pl


@dataclass
class FileResult:
    """One trace file read into spans, with an account of everything that did not become a span.

    ``skipped`` counts events read but not kept, by reason (``flow``, ``counter``, ``metadata``, ...);
    ``meta`` carries what later steps need from the file header (``rank``, ``world_size``, ``pg_config``,
    ``process_names``, ``clock_offset_ns`` ...).
    """

    source: str
    spans: pl.DataFrame
    events_read: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    format: str = ""
    #: Allocator events (``allocations.SCHEMA``), None where the format or the file has none.
    memory: pl.DataFrame | None = None
    #: Served requests (``requests_table.SCHEMA``), None where the format or the file has none.
    requests: pl.DataFrame | None = None
    #: An engine's traced scheduler steps (``requests_table.STEP_SCHEMA``), None where the file has none.
    request_steps: pl.DataFrame | None = None
