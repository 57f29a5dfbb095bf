"""A report to gate on: a saved JSON report (``pipebubble analyze --format json -o base.json``) or traces,
analysed afresh. Either way the result is the JSON report's dict, so both compare alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipebubble.errors import PipebubbleError
from pipebubble.report import SCHEMA_VERSION

SNIFF_BYTES = 256  # a saved report starts with schema_version (Kineto's key is schemaVersion)


def is_report(path: Path) -> bool:
    if not path.is_file() or path.suffix.lower() != ".json":
        return False
    with open(path, "rb") as file:
        return b'"schema_version"' in file.read(SNIFF_BYTES)


def read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipebubbleError(f"{path}: not a readable JSON report ({exc})") from None
    version = report.get("schema_version") if isinstance(report, dict) else None
    if version != SCHEMA_VERSION:
        raise PipebubbleError(f"{path}: expected a report with schema_version {SCHEMA_VERSION}, found {version!r}")
    return report


def load_report(paths: list[Path], settings: dict[str, Any] | None = None, use_cache: bool = True) -> dict[str, Any]:
    """The saved report when ``paths`` is one JSON report file, else ingest and analyse the traces."""
    if len(paths) == 1 and is_report(paths[0]):
        return read_report(paths[0])
    from pipebubble.analyze import analyze
    from pipebubble.ingest import load
    from pipebubble.mapreduce import Options

    options = Options.from_settings(settings or {})
    report = analyze(load(paths, use_cache=use_cache), options.pipeline, options.serving).to_dict()
    return json.loads(json.dumps(report))  # exactly what a saved report reads back as
