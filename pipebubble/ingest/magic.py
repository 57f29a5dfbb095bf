"""What a file is, told from its first bytes (its magic number), without loading a reader: no polars, no sqlite3.

Both the format registry (``readers``, deciding who reads a file) and the Nsight reader (``nsys``, opening
one) ask it.
"""

from __future__ import annotations

from pathlib import Path

SQLITE_MAGIC = b"SQLite format 3\x00"


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` begins as an SQLite database does (an Nsight export); False when it cannot be read."""
    try:
        with path.open("rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False
