"""Spill folders: one private folder per read, committed by an atomic rename.

A read that spills its span table writes Parquet parts into a folder of its own, then publishes it as
``spill/<key>`` with a manifest of its parts, so a later read can check that none went missing. Private
folders of reads that died are cleaned up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipebubble.ingest.base import FileResult
from pipebubble.ingest.cache.atomic import _unlink, _write_atomic

#: A spill folder's own account of its parts, written before the folder is committed.
MANIFEST = "MANIFEST.json"
#: A private spill folder whose reader is gone is removed after this long; any after a day.
_STALE_S = 60
_ABANDONED_S = 24 * 3600


def new_spill(work: Path, entry_key: str | None) -> Path:
    """A fresh folder of this read's own for a spilled span table (``spill/<key>.tmp-<pid>@<host>-<id>``),
    so concurrent reads of one trace never mix parts."""
    root = work / "spill"
    root.mkdir(parents=True, exist_ok=True)
    _clean_stale(root)
    folder = root / f"{entry_key or uuid.uuid4().hex}.tmp-{os.getpid()}@{_host()}-{uuid.uuid4().hex}"
    folder.mkdir()
    return folder


def commit_spill(result: FileResult, folder: Path, entry_key: str | None) -> FileResult:
    """Publish a finished private spill folder as ``spill/<key>`` and point ``result`` at it. When another
    read committed the same key first and its folder is intact, that one is used and ours dropped. A
    trace with no span comes back exactly as one read in memory. Failing to commit keeps ours private."""
    spans_count = result.meta.get("spans")
    if not spans_count:
        discard(folder)
        meta = {k: v for k, v in result.meta.items() if k not in ("spill", "spans")}
        from pipebubble import spans

        return replace(result, spans=spans.empty(), meta=meta)
    try:
        manifest = {"parts": parts(folder), "spans": int(spans_count)}
        _write_atomic(folder / MANIFEST, json.dumps(manifest))
    except OSError:
        return _pointing(result, folder)
    if entry_key is None:
        return _pointing(result, folder)
    target = folder.parent / entry_key
    for _ in range(3):
        try:
            os.rename(folder, target)
            return _pointing(result, target)
        except OSError:
            pass
        theirs = _manifest(target)
        if theirs is not None and theirs["spans"] == manifest["spans"] and intact(target, theirs):
            discard(folder)
            return _pointing(result, target)
        _move_aside(target)  # damaged or foreign: out of the way, then try again
    return _pointing(result, folder)


def _pointing(result: FileResult, folder: Path) -> FileResult:
    return replace(result, meta={**result.meta, "spill": str(folder)})


def parts(folder: Path) -> list[str]:
    """The names of a spill folder's Parquet parts, sorted."""
    return sorted(p.name for p in Path(folder).glob("*.parquet"))


def intact(folder: Path, manifest: dict) -> bool:
    """Whether a spill folder still holds exactly its parts, with the span schema and all their rows (a
    deleted part would silently shrink every total)."""
    folder = Path(folder)
    if not folder.is_dir() or parts(folder) != manifest.get("parts") or not manifest["parts"]:
        return False
    import polars as pl

    from pipebubble.spans import SCHEMA

    files = [str(folder / name) for name in manifest["parts"]]
    try:
        scan = pl.scan_parquet(files)
        if dict(scan.collect_schema()) != SCHEMA:
            return False
        return scan.select(pl.len()).collect().item() == manifest["spans"]
    except Exception:
        return False


def _valid_manifest(manifest: Any) -> bool:
    return (
        isinstance(manifest, dict)
        and isinstance(manifest.get("spans"), int)
        and isinstance(manifest.get("parts"), list)
        and all(isinstance(p, str) for p in manifest["parts"])
    )


def _manifest(folder: Path) -> dict | None:
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if _valid_manifest(manifest) else None


def discard(folder: Path | None) -> None:
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def _move_aside(folder: Path) -> None:
    """Rename a damaged committed folder away (atomic, so no reader sees it half removed), then remove it."""
    aside = folder.with_name(f"{folder.name}.old-{uuid.uuid4().hex}")
    try:
        os.rename(folder, aside)
    except OSError:
        return
    if aside.is_dir():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        _unlink(aside)


_PRIVATE = re.compile(r"\.tmp-(\d+)@(.*)-[0-9a-f]{32}$")


def _clean_stale(root: Path) -> None:
    """Best effort: remove private folders of reads that died (this host's, whose process is gone) and
    any left for a day, and folders moved aside."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    now = time.time()
    for entry in entries:
        if ".old-" in entry.name:
            discard(entry)
            continue
        match = _PRIVATE.search(entry.name)
        if match is None:
            continue
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue
        mine = match.group(2) == _host()
        if age > _ABANDONED_S or (mine and age > _STALE_S and not _alive(int(match.group(1)))):
            discard(entry)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    if os.name == "nt":  # there, signal 0 would end the process: assume it lives (age still cleans up)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True
