"""Writes that no reader sees half done: a writer's own temporary name, then an atomic rename."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def _tmp_name(path: Path) -> Path:
    """A name of this writer's own beside ``path``, so concurrent writers never share a half-written file."""
    return path.with_name(f"{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex}")


def _write_atomic(path: Path, text: str) -> None:
    tmp = _tmp_name(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        _unlink(tmp)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
