"""The result of an analysis as plain frozen data, and its JSON form.

``SCHEMA_VERSION`` guards the public JSON contract (ARCHITECTURE.md): keys may be added freely; renaming or
dropping one bumps the version.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class IngestSummary:
    files: list[str]
    events_read: int
    spans: int
    skipped: dict[str, int]
    warnings: list[str]
    formats: dict[str, str] = field(default_factory=dict)
    unread_bytes: int = 0


@dataclass(frozen=True)
class Lane:
    lane: str
    kind: str
    rank: int | None
    pid: int | None
    tid: int | None
    device: int | None
    stream: int | None
    busy_ns: int
    idle_ns: int
    window_start_ns: int
    window_end_ns: int

    @property
    def window_ns(self) -> int:
        return self.window_end_ns - self.window_start_ns

    @property
    def idle_fraction(self) -> float:
        return self.idle_ns / self.window_ns if self.window_ns else 0.0


@dataclass(frozen=True)
class Report:
    ingest: IngestSummary
    lanes: list[Lane]
    stages: list[dict[str, Any]] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None
    waits: list[dict[str, Any]] = field(default_factory=list)
    interference: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """The JSON report: ``schema_version`` first, then the sections in the documented order."""
        body = asdict(self)
        version = body.pop("schema_version")
        return {"schema_version": version, **body}
