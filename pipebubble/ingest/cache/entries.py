"""Cache entries: each file's key, its cached span table (with its allocator events and requests beside it),
and whole cached reports.

An entry is keyed by the file's identity: its absolute path, size, mtime, inode, ctime and a hash of its
first and last MB (for a folder, every member's), with the pipebubble version and the cache format, so an
edited, touched-back or replaced trace is read afresh. Everything read back is checked, and anything amiss
means "read the trace again", never a crash or a stale answer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from pipebubble import __version__
from pipebubble.ingest.base import FileResult
from pipebubble.ingest.cache.atomic import _tmp_name, _unlink, _write_atomic
from pipebubble.ingest.cache.folder import _probe, _reason, directory, is_cache_warning, unusable, usable
from pipebubble.ingest.cache.spill import _manifest, _valid_manifest, intact

_FORMAT = 6  # 3: the allocator-event table beside the span table; 4: the request table; 5: the span table's
# argument columns (bytes, flops, dims, dtypes) and the traced serving steps; 6: the GPUs' names in the meta
#: Bytes hashed at each end of a file: cheap, and catches an edit that keeps size and mtime.
_EDGE_BYTES = 1 << 20


# --- keys: a file's content identity ---


def key(path: Path) -> str | None:
    """The cache key of a trace file or Nsight parquet folder; None when it cannot be read."""
    try:
        ident = _identity(path)
    except OSError:
        return None
    text = json.dumps([str(path.resolve()), ident, __version__, _FORMAT, code_identity()])
    return hashlib.sha1(text.encode()).hexdigest()


@functools.cache
def code_identity() -> str:
    """The installed package's own files (name, size, mtime), so a build that changes the reader or an
    analysis never serves what an older one cached under the same version number."""
    root = Path(__file__).resolve().parents[2]
    parts = []
    for file in sorted(root.rglob("*.py")):
        try:
            st = file.stat()
        except OSError:
            continue
        parts.append(f"{file.relative_to(root)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()


def _identity(path: Path) -> list:
    """A file's identity, or for a folder every member's (by name), so a change to any member counts."""
    if not path.is_dir():
        return _file_identity(path)
    members = sorted(p for p in path.rglob("*") if p.is_file())
    return [[str(p.relative_to(path)), *_file_identity(p)] for p in members]


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, _edges_digest(path, st.st_size)]


def _edges_digest(path: Path, size: int) -> str:
    """A hash of the first and last MB (the whole file when smaller): content changes that keep the size
    and mtime (``touch -d``, a copy with ``-p``) mostly touch a trace's header or its end."""
    digest = hashlib.sha1()
    with open(path, "rb") as fh:
        digest.update(fh.read(_EDGE_BYTES))
        if size > 2 * _EDGE_BYTES:
            fh.seek(size - _EDGE_BYTES)
        digest.update(fh.read(_EDGE_BYTES))
    return digest.hexdigest()


# --- span table entries ---


def get(path: Path, entry_key: str | None = None) -> FileResult | None:
    """The cached result for ``path``, or None when absent, stale, damaged or of the wrong shape."""
    entry_key = entry_key or key(path)
    if entry_key is None:
        return None
    base = directory() / entry_key
    try:
        info = json.loads(base.with_suffix(".json").read_text())
        if not _valid_info(info, entry_key):
            return None
        import polars as pl

        table = pl.read_parquet(base.with_suffix(".parquet"))
        if not _valid_table(table, info["rows"]):
            return None
        spill = info["meta"].get("spill")
        if spill and not intact(Path(spill), info["spill"]):
            return None  # the spilled span table lost parts: read the trace again
        memory = _memory(base, info.get("memory_rows"))
        requests = _requests(base, info.get("requests_rows"))
        request_steps = _request_steps(base, info.get("request_steps_rows"))
    except Exception:  # unreadable, truncated or foreign: read the trace again
        return None
    except BaseException as exc:  # polars' panics are BaseExceptions
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return None
    return FileResult(
        info["source"],
        table,
        info["events_read"],
        Counter(info["skipped"]),
        info["warnings"],
        info["meta"],
        info["format"],
        memory,
        requests,
        request_steps,
    )


def _memory(base: Path, rows: Any):
    """The entry's allocator-event table (None when the file had none)."""
    from pipebubble.allocations import SCHEMA

    return _side_table(base, ".memory.parquet", rows, SCHEMA)


def _requests(base: Path, rows: Any):
    """The entry's request table (None when the file had none)."""
    from pipebubble.requests_table import SCHEMA

    return _side_table(base, ".requests.parquet", rows, SCHEMA)


def _request_steps(base: Path, rows: Any):
    """The entry's traced scheduler steps (None when the file had none)."""
    from pipebubble.requests_table import STEP_SCHEMA

    return _side_table(base, ".steps.parquet", rows, STEP_SCHEMA)


def _side_table(base: Path, suffix: str, rows: Any, schema: dict):
    """A table stored beside the span table (None when the file had none); one of the wrong shape or length
    raises, so the trace is read again."""
    if rows is None:
        return None
    import polars as pl

    table = pl.read_parquet(base.with_suffix(suffix))
    if not isinstance(rows, int) or table.height != rows or dict(table.schema) != schema:
        raise ValueError(f"{suffix} table of the wrong shape")
    return table


_INFO_TYPES = {
    "key": str,
    "source": str,
    "events_read": int,
    "skipped": dict,
    "warnings": list,
    "meta": dict,
    "format": str,
    "rows": int,
}


def _valid_info(info: Any, entry_key: str) -> bool:
    """Whether an entry's JSON is what ``put`` writes for this key."""
    if not isinstance(info, dict) or info.get("key") != entry_key:
        return False
    if not all(isinstance(info.get(name), kind) for name, kind in _INFO_TYPES.items()):
        return False
    if not all(isinstance(k, str) and isinstance(v, int) for k, v in info["skipped"].items()):
        return False
    if not all(isinstance(w, str) for w in info["warnings"]):
        return False
    spill = info["meta"].get("spill")
    if spill is None:
        return True
    return isinstance(spill, str) and _valid_manifest(info.get("spill"))


def _valid_table(table, rows: int) -> bool:
    """The span schema exactly, and as many rows as were stored."""
    from pipebubble.spans import SCHEMA

    return table.height == rows and dict(table.schema) == SCHEMA


def put(path: Path, result: FileResult, entry_key: str | None = None) -> None:
    """Store ``result`` (a spilled one with its parts' account). A cache that cannot be written is only
    an optimisation lost: one warning, and the analysis goes on."""
    entry_key = entry_key or key(path)
    home = directory()
    if entry_key is None or not usable():
        return
    info: dict[str, Any] = {
        "key": entry_key,
        "source": result.source,
        "events_read": result.events_read,
        "skipped": dict(result.skipped),
        "warnings": [w for w in result.warnings if not is_cache_warning(w)],
        "meta": result.meta,
        "format": result.format,
        "rows": result.spans.height,
        "memory_rows": None if result.memory is None else result.memory.height,
        "requests_rows": None if result.requests is None else result.requests.height,
        "request_steps_rows": None if result.request_steps is None else result.request_steps.height,
    }
    spill = result.meta.get("spill")
    if spill:
        manifest = _manifest(Path(spill))
        if manifest is None:
            return  # a spill folder without its account cannot be checked later: do not cache it
        info["spill"] = manifest
    base = home / entry_key
    try:
        home.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_name(base.with_suffix(".parquet"))
        try:
            result.spans.write_parquet(tmp, compression="lz4")
            os.replace(tmp, base.with_suffix(".parquet"))
            for side, suffix in ((result.memory, ".memory.parquet"), (result.requests, ".requests.parquet"),
                                 (result.request_steps, ".steps.parquet")):
                if side is not None:
                    side.write_parquet(tmp, compression="lz4")
                    os.replace(tmp, base.with_suffix(suffix))
        finally:
            _unlink(tmp)
        _write_atomic(base.with_suffix(".json"), json.dumps(info, default=str))
    except Exception as exc:  # OSError, or polars' ComputeError for a full volume
        unusable(home, _probe(home) or _reason(exc))


# --- whole reports ---


def report_key(files: list[Path], options: dict) -> str | None:
    """Key of a whole report: every file's own key and the analysis options."""
    keys = [key(f) for f in files]
    if None in keys:
        return None
    text = json.dumps({"files": keys, "options": options}, sort_keys=True, default=str)
    return "report-" + hashlib.sha1(text.encode()).hexdigest()


def get_report(report: str | None) -> dict | None:
    """A cached JSON report, so re-analysis of unchanged traces with the same options is instant; None
    when absent or not a report this version wrote."""
    if report is None:
        return None
    try:
        entry = json.loads((directory() / f"{report}.json").read_text())
        if not isinstance(entry, dict) or entry.get("key") != report or not isinstance(entry.get("report"), dict):
            return None
    except Exception:
        return None
    return entry["report"]


def put_report(report: str | None, body: dict) -> None:
    """Store a report, without this run's cache warnings (a later run from the cache has none of them)."""
    home = directory()
    if report is None or not usable():
        return
    ingest = body.get("ingest")
    if isinstance(ingest, dict) and isinstance(ingest.get("warnings"), list):
        kept = [w for w in ingest["warnings"] if not (isinstance(w, str) and is_cache_warning(w))]
        body = {**body, "ingest": {**ingest, "warnings": kept}}
    try:
        home.mkdir(parents=True, exist_ok=True)
        _write_atomic(home / f"{report}.json", json.dumps({"key": report, "report": body}))
    except Exception as exc:
        unusable(home, _probe(home) or _reason(exc))
