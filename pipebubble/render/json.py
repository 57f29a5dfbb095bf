"""The JSON report: stable key order, two-space indent, one trailing newline (friendly to jq and diff)."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from pipebubble.report import Report


def render(report: Report) -> str:
    return dumps(report.to_dict())


def dumps(body: Any) -> str:
    """``json.dumps(body, indent=2, allow_nan=False)`` and a newline, to the byte: the standard library's C
    encoder writes it compact (an indent sends it to the pure-Python one, four times slower on a big report)
    and msgspec only re-indents that text, leaving every number and string as written."""
    return msgspec.json.format(json.dumps(body, allow_nan=False), indent=2) + "\n"
