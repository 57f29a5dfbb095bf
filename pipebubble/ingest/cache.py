"""A Parquet cache of each file's span table, so re-analysis skips decoding.

Entries live under ``$PIPEBUBBLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/pipebubble``, else
``~/.cache/pipebubble`` (never beside the input), keyed by the file's absolute path, size, mtime and the
pipebubble version, so an edited trace or a new release is read afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

from pipebubble import __version__
from pipebubble.ingest.base import FileResult

_FORMAT = 1


def directory() -> Path:
    explicit = os.environ.get("PIPEBUBBLE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipebubble"


def _key(path: Path) -> str | None:
    try:
        st = path.stat()
    except OSError:
        return None
    if path.is_dir():  # a parquet folder: its newest member stands for it
        st = max((p.stat() for p in path.iterdir()), key=lambda s: s.st_mtime_ns, default=st)
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{__version__}|{_FORMAT}"
    return hashlib.sha1(ident.encode()).hexdigest()


def spill_folder(path: Path) -> Path:
    """The folder that holds ``path``'s span table when it is too big for memory."""
    return directory() / "spill" / (_key(path) or "unknown")


def get(path: Path) -> FileResult | None:
    """The cached result for ``path``, or None when absent, stale or unreadable."""
    key = _key(path)
    if key is None:
        return None
    import polars as pl

    base = directory() / key
    try:
        info = json.loads(base.with_suffix(".json").read_text())
        table = pl.read_parquet(base.with_suffix(".parquet"))
    except (OSError, ValueError, pl.exceptions.PolarsError):
        return None
    spill = info["meta"].get("spill")
    if spill and not Path(spill).is_dir():
        return None  # the spilled span table is gone: read the trace again
    return FileResult(
        info["source"],
        table,
        info["events_read"],
        Counter(info["skipped"]),
        info["warnings"],
        info["meta"],
        info["format"],
    )


def put(path: Path, result: FileResult) -> None:
    """Store ``result``; a cache that cannot be written is skipped silently (it is only an optimisation)."""
    key = _key(path)
    if key is None:
        return
    base = directory() / key
    info = {
        "source": result.source,
        "events_read": result.events_read,
        "skipped": dict(result.skipped),
        "warnings": result.warnings,
        "meta": result.meta,
        "format": result.format,
    }
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        tmp = base.with_suffix(".parquet.tmp")
        result.spans.write_parquet(tmp, compression="lz4")
        tmp.replace(base.with_suffix(".parquet"))
        base.with_suffix(".json").write_text(json.dumps(info, default=str))
    except OSError:
        return


def report_key(files: list[Path], options: dict) -> str | None:
    """Key of a whole report: every file's own key and the analysis options."""
    keys = [_key(f) for f in files]
    if None in keys:
        return None
    text = json.dumps({"files": keys, "options": options}, sort_keys=True, default=str)
    return "report-" + hashlib.sha1(text.encode()).hexdigest()


def get_report(key: str | None) -> dict | None:
    """A cached JSON report, so re-analysis of unchanged traces with the same options is instant."""
    if key is None:
        return None
    try:
        return json.loads((directory() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def put_report(key: str | None, report: dict) -> None:
    if key is None:
        return
    try:
        directory().mkdir(parents=True, exist_ok=True)
        (directory() / f"{key}.json").write_text(json.dumps(report))
    except OSError:
        return
