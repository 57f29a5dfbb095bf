"""A Parquet cache of each file's span table, so re-analysis skips decoding.

Entries live under ``$PIPEBUBBLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/pipebubble``, else
``~/.cache/pipebubble`` (never beside the input). An entry is keyed by the file's identity: its absolute
path, size, mtime, inode, ctime and a hash of its first and last MB (for a folder, every member's), with
the pipebubble version and the cache format, so an edited, touched-back or replaced trace is read afresh.

Everything read back is checked (the JSON's shape, the table's columns and rows, a spilled table's parts)
and anything amiss means "read the trace again", never a crash or a stale answer. A cache that cannot be
written never fails an analysis: work moves to a temporary folder (removed at exit) with one warning.

The package's parts: ``folder`` (where the cache lives and where work goes instead, with the process's
cache state), ``entries`` (keys, span table entries, whole reports), ``spill`` (private spill folders
committed by rename, their manifests, stale clean-up) and ``atomic`` (writes no reader sees half done).
"""

from __future__ import annotations

from pipebubble.ingest.cache.entries import get, get_report, key, put, put_report, report_key
from pipebubble.ingest.cache.folder import (
    clean_at_exit,
    directory,
    disk_error,
    is_cache_warning,
    unusable,
    usable,
    warnings,
    work_dir,
)
from pipebubble.ingest.cache.spill import MANIFEST, commit_spill, discard, intact, new_spill, parts

__all__ = [
    "MANIFEST",
    "clean_at_exit",
    "commit_spill",
    "directory",
    "discard",
    "disk_error",
    "get",
    "get_report",
    "intact",
    "is_cache_warning",
    "key",
    "new_spill",
    "parts",
    "put",
    "put_report",
    "report_key",
    "unusable",
    "usable",
    "warnings",
    "work_dir",
]
