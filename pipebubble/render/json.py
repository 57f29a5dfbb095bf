"""The JSON report: stable key order, two-space indent, one trailing newline (friendly to jq and diff)."""

from __future__ import annotations

import json

from pipebubble.report import Report


def render(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, allow_nan=False) + "\n"
