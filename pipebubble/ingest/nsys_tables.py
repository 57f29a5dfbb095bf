"""Table access for Nsight Systems exports: one SQLite file or a ``parquetdir`` folder.

Both give the same view: which tables exist, which columns a table has, and a table loaded in bulk
as a polars frame with the asked-for dtypes. Columns a given nsys release lacks come back as nulls,
because the export schema drifts between releases (2021 to 2026) and other tools add columns.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl

from pipebubble.errors import TraceFormatError

SQLITE_MAGIC = b"SQLite format 3\x00"


def _decode(raw: bytes) -> str:
    # NVTX text and process names are whatever the traced program passed in: not always UTF-8.
    return raw.decode("utf-8", "replace")


def _with_missing(frame: pl.DataFrame, cols: dict[str, pl.DataType]) -> pl.DataFrame:
    return frame.select(
        (pl.col(c) if c in frame.columns else pl.lit(None)).cast(t, strict=False).alias(c) for c, t in cols.items()
    )


class SqliteTables:
    """An ``nsys export --type sqlite`` file, opened read-only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            self.conn.text_factory = _decode
            rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except sqlite3.Error as exc:
            raise TraceFormatError(path, f"not a readable SQLite database ({exc})") from exc
        self.names = {r[0] for r in rows}

    def columns(self, table: str) -> list[str]:
        if table not in self.names:
            return []
        return [r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')]

    def load(self, table: str, cols: dict[str, pl.DataType]) -> pl.DataFrame:
        present = [c for c in cols if c in self.columns(table)]
        if not present:
            return pl.DataFrame(schema=cols)
        sql = "SELECT " + ", ".join(f'"{c}"' for c in present) + f' FROM "{table}"'
        try:
            rows = self.conn.execute(sql).fetchall()
        except sqlite3.Error as exc:
            raise TraceFormatError(self.path, f"cannot read table {table} ({exc})") from exc
        # strict=False: SQLite columns are loosely typed; a stray text value becomes null, not a crash.
        frame = pl.DataFrame(rows, schema={c: cols[c] for c in present}, orient="row", strict=False)
        return _with_missing(frame, cols)

    def close(self) -> None:
        self.conn.close()


class ParquetTables:
    """An ``nsys export --type parquetdir`` folder: ``TABLE.parquet`` files or ``TABLE/`` folders of parts."""

    def __init__(self, folder: Path) -> None:
        self.path = folder
        self.files: dict[str, list[Path]] = {}
        for item in sorted(folder.iterdir()):
            if item.is_dir():
                parts = sorted(item.glob("*.parquet"))
            else:
                parts = [item] if item.suffix == ".parquet" else []
            if parts:
                self.files[item.name.removesuffix(".parquet")] = parts
        self.names = set(self.files)

    def columns(self, table: str) -> list[str]:
        if table not in self.files:
            return []
        try:
            return list(pl.read_parquet_schema(self.files[table][0]))
        except Exception as exc:  # polars raises several error types for a damaged file
            raise TraceFormatError(self.files[table][0], f"not a readable Parquet file ({exc})") from exc

    def load(self, table: str, cols: dict[str, pl.DataType]) -> pl.DataFrame:
        present = [c for c in cols if c in self.columns(table)]
        if not present:
            return pl.DataFrame(schema=cols)
        frame = pl.concat([pl.read_parquet(p, columns=present) for p in self.files[table]], how="vertical_relaxed")
        return _with_missing(frame, cols)

    def close(self) -> None:
        pass


Tables = SqliteTables | ParquetTables


def is_sqlite(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            return fh.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def looks_like_nsys(names: set[str]) -> bool:
    """An Nsight export has the string table and at least one CUDA activity or NVTX table."""
    return "StringIds" in names and any(n.startswith("CUPTI_ACTIVITY_KIND_") or n == "NVTX_EVENTS" for n in names)
