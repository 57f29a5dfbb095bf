"""Every output format of the registry, and what each promises: the arguments that ask ``analyze`` for each
(``cases``), ``export``'s output names, gates no sound report fails, and the checks of an output that
succeeded (``assert_valid``, ``assert_export``). The repros and the fuzzers both run them."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

from pipebubble.render import choices, formats

WIDTH = 80  # the narrowest layout the terminal report has (no bars, stacked headers, columns left out)
#: gates no sound report fails: a bubble is at most 100% of a step, utilization at least 0; an incomplete input
#: (a cut-off repro, one rank of many) judged by them alone (``tests/gates/test_completeness.py`` fails it)
GATES = ("--max-bubble", "100%", "--min-utilization", "0%", "--allow-partial")
EXPORT_NAMES = {"perfetto": "out.pftrace", "perfetto-json": "out.json", "perfetto-json-gz": "out.json.gz"}


def cases() -> list[tuple[str, list[str]]]:
    """(what it checks, the arguments after the file) for every format of the registry."""
    analyze = [(name, ["--format", name]) for name in formats.names("analyze") if name not in ("text", "csv")]
    tables = [(f"csv {table}", ["--format", "csv", "--table", table]) for table in choices.CSV_TABLES]
    return [("text", ["--width", str(WIDTH)]), *analyze, *tables]


def assert_valid(path: Path, what: str, out: str) -> None:
    """The output of an analyze that succeeded is what its format promises."""
    where = f"{path.name} {what}"
    if what == "text":
        assert out.strip() and max(map(len, out.splitlines())) <= WIDTH, where
    elif what == "json":
        assert json.loads(out)["schema_version"] == 1, where
    elif what == "markdown":
        assert out.lstrip().startswith("#") and "None" not in out, where
    elif what == "html":
        assert out.lstrip().lower().startswith("<!doctype html>") and out.rstrip().endswith("</html>"), where
    else:  # csv: a header, then rows of its width
        rows = list(csv.reader(io.StringIO(out)))
        assert rows and rows[0] and all(rows[0]), where
        assert all(len(row) == len(rows[0]) for row in rows), where


def assert_export(path: Path, name: str, out: Path) -> None:
    data = out.read_bytes()
    if name == "perfetto":
        assert Trace.FromString(data).packet, path.name
    else:
        text = gzip.decompress(data) if name.endswith("-gz") else data
        assert isinstance(json.loads(text)["traceEvents"], list), f"{path.name} {name}"
