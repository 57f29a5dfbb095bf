"""Table access for Nsight Systems exports: one SQLite file or a ``parquetdir`` folder.

Both give the same view: which tables exist, which columns a table has, and a table loaded in bulk
as a polars frame with the asked-for dtypes. Columns a given nsys release lacks come back as nulls,
because the export schema drifts between releases (2021 to 2026) and other tools add columns.

Every access to the file is inside an error boundary: a damaged file raises ``TraceFormatError`` with a
one-line reason, never a database, decoding or polars error. Values of the wrong type (a BLOB or text in
an integer column) become nulls and are counted in ``coerced``, so callers can say what was lost.
"""

from __future__ import annotations

import os
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import polars as pl

from pipebubble.errors import TraceFormatError

#: Longest reason quoted from an SQLite or Parquet error; the rest is cut.
REASON_CHARS = 240
#: What can go wrong reading a damaged SQLite file (error text that is not UTF-8 arrives as a decode error).
SQLITE_ERRORS = (sqlite3.Error, UnicodeDecodeError, OverflowError, MemoryError, ValueError)


def _decode(raw: bytes) -> str:
    # NVTX text and process names are whatever the traced program passed in: not always UTF-8.
    return raw.decode("utf-8", "replace")


def one_line(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` with every run of whitespace or control characters collapsed to one space, cut to ``limit``."""
    flat = re.sub(r"[\s\x00-\x1f\x7f]+", " ", text).strip()
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def error_text(exc: BaseException) -> str:
    """A one-line description of ``exc``; SQLite messages that are not valid UTF-8 are decoded with replacement."""
    if isinstance(exc, UnicodeDecodeError) and isinstance(exc.object, bytes | bytearray):
        return one_line(bytes(exc.object).decode("utf-8", "replace"))
    return one_line(str(exc) or type(exc).__name__)


def sqlite_uri(path: Path) -> str:
    """A read-only, immutable URI for ``path``: SQLite then takes no locks and writes no ``-wal``/``-shm`` files."""
    return f"file:{quote(os.fsencode(Path(path).resolve()))}?mode=ro&immutable=1"


def quote_name(name: str) -> str:
    """An SQL identifier for ``name``, whatever characters it holds."""
    return '"' + name.replace('"', '""') + '"'


def _int_expr(col: str) -> str:
    """SQL for column ``col`` as an integer: integers as they are, integral reals and canonical integer text
    converted, anything else (BLOBs, other text, fractions) null."""
    c = quote_name(col)
    return (
        f"CASE typeof({c}) WHEN 'integer' THEN {c} "
        f"WHEN 'real' THEN CASE WHEN {c} BETWEEN -9.2e18 AND 9.2e18 AND {c} = CAST({c} AS INTEGER) "
        f"THEN CAST({c} AS INTEGER) END "
        f"WHEN 'text' THEN CASE WHEN CAST(CAST({c} AS INTEGER) AS TEXT) = {c} THEN CAST({c} AS INTEGER) END END"
    )


def _text_expr(col: str) -> str:
    """SQL for column ``col`` as text: BLOBs and numbers are read as text (decoded with replacement)."""
    return f"CAST({quote_name(col)} AS TEXT)"


def _blob_expr(col: str) -> str:
    """SQL for column ``col`` as bytes: BLOBs as they are, text and numbers as their text's bytes."""
    c = quote_name(col)
    return f"CASE typeof({c}) WHEN 'blob' THEN {c} WHEN 'null' THEN NULL ELSE CAST({c} AS BLOB) END"


def _sql_expr(col: str, dtype: pl.DataType) -> str:
    if dtype == pl.Binary:
        return _blob_expr(col)
    return _text_expr(col) if dtype == pl.String else _int_expr(col)


def _with_missing(frame: pl.DataFrame, cols: dict[str, pl.DataType]) -> pl.DataFrame:
    return frame.select(
        (pl.col(c) if c in frame.columns else pl.lit(None)).cast(t, strict=False).alias(c) for c, t in cols.items()
    )


#: Column types always read through their SQL conversion: a column's declared type does not bind its values.
_CONVERTED = (pl.String, pl.Binary)


class SqliteTables:
    """An ``nsys export --type sqlite`` file, opened read-only and immutable (nothing is written beside it)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.coerced: Counter[str] = Counter()
        self.warnings: list[str] = []
        self._columns: dict[str, list[str]] = {}
        self.conn: sqlite3.Connection | None = None
        try:
            with self._guard("not a readable SQLite database"):
                self.conn = sqlite3.connect(sqlite_uri(self.path), uri=True)
                self.conn.text_factory = _decode
                rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
        except TraceFormatError:
            self.close()
            raise
        self.names = {r[0] for r in rows if isinstance(r[0], str)}
        self._note_wal()

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        """Turn any SQLite failure inside the block into ``TraceFormatError(path, "what (reason)")``."""
        try:
            yield
        except SQLITE_ERRORS as exc:
            raise TraceFormatError(self.path, f"{what} ({error_text(exc)})") from None

    def _note_wal(self) -> None:
        """An immutable open ignores a ``-wal`` file; one with content may hold rows this read does not see."""
        wal = self.path.with_name(self.path.name + "-wal")
        try:
            size = wal.stat().st_size if wal.is_file() else 0
        except OSError:
            size = 0
        if size:
            self.warnings.append(f"{wal.name} ({size} bytes) beside the export is ignored: rows in it are not read")

    def columns(self, table: str) -> list[str]:
        if table not in self.names:
            return []
        if table not in self._columns:
            with self._guard(f"cannot read table {one_line(table, 80)}"):
                info = self.conn.execute(f"PRAGMA table_info({quote_name(table)})").fetchall()
            self._columns[table] = [r[1] for r in info if isinstance(r[1], str)]
        return self._columns[table]

    def load(self, table: str, cols: dict[str, pl.DataType]) -> pl.DataFrame:
        """The ``cols`` of ``table`` (those it has), read with one query and turned from rows into columns at
        once; columns the table lacks come back as nulls."""
        present = {c: t for c, t in cols.items() if c in self.columns(table)}
        if not present:
            return pl.DataFrame(schema=cols)
        source = f"FROM {quote_name(table)}"
        with self._guard(f"cannot read table {one_line(table, 80)}"):
            frame = self._read(present, source, convert=False)
            if frame is None:  # an integer column holds a BLOB, text or a real: read again, converting each value
                frame = self._read(present, source, convert=True)
            self._count_coerced(table, frame, source)
        return _with_missing(frame, cols)

    def _read(self, cols: dict[str, pl.DataType], source: str, convert: bool) -> pl.DataFrame | None:
        """``cols`` by one query: integer columns as stored, or with ``convert`` through ``_int_expr``; None
        when a value read as stored is not an integer (polars' strict construction refuses it)."""
        exprs = [_sql_expr(c, t) if convert or t in _CONVERTED else quote_name(c) for c, t in cols.items()]
        rows = self._rows(f"SELECT {', '.join(exprs)} {source}")
        columns = zip(*rows, strict=True) if rows else ([] for _ in cols)
        try:
            series = [pl.Series(c, v, t, strict=True) for (c, t), v in zip(cols.items(), columns, strict=True)]
        except TypeError:
            return None
        return pl.DataFrame(series)

    def _rows(self, sql: str) -> list[tuple]:
        """All rows of ``sql``, text decoded by sqlite3's own strict UTF-8 reader; read again, decoded with
        replacement, when some text is not UTF-8 (which sqlite3 reports as an ``OperationalError``)."""
        self.conn.text_factory = str
        try:
            return self.conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # a failure that is not about text fails the same way again
            self.conn.text_factory = _decode
            return self.conn.execute(sql).fetchall()
        finally:
            self.conn.text_factory = _decode

    def _count_coerced(self, table: str, frame: pl.DataFrame, source: str) -> None:
        """Count the values of ``table`` that were present but could not be read as their column's type: a
        column's nulls in ``frame`` less the stored NULLs. SQLite answers ``c IS NULL`` as false for a column
        declared NOT NULL, so a NULL stored there anyway counts as lost."""
        nulls = {c: n for c, n in zip(frame.columns, frame.null_count().row(0), strict=True) if n}
        if not nulls:
            return
        stored = ", ".join(f"TOTAL({quote_name(c)} IS NULL)" for c in nulls)
        (counts,) = self.conn.execute(f"SELECT {stored} {source}").fetchall()
        for (col, n), null in zip(nulls.items(), counts, strict=True):
            if lost := n - int(null):
                self.coerced[f"{table}.{col}"] += lost

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class ParquetTables:
    """An ``nsys export --type parquetdir`` folder: ``TABLE.parquet`` files or ``TABLE/`` folders of parts."""

    def __init__(self, folder: Path) -> None:
        self.path = folder
        self.coerced: Counter[str] = Counter()
        self.warnings: list[str] = []
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
            raise TraceFormatError(self.files[table][0], f"not a readable Parquet file ({error_text(exc)})") from None

    def load(self, table: str, cols: dict[str, pl.DataType]) -> pl.DataFrame:
        present = [c for c in cols if c in self.columns(table)]
        if not present:
            return pl.DataFrame(schema=cols)
        try:
            parts = [pl.read_parquet(p, columns=present) for p in self.files[table]]
            frame = pl.concat(parts, how="vertical_relaxed")
            out = _with_missing(frame, cols)
        except Exception as exc:  # polars raises several error types for a damaged or mistyped file
            raise TraceFormatError(self.path, f"cannot read table {table} ({error_text(exc)})") from None
        for col in present:
            lost = out[col].null_count() - frame[col].null_count()
            if lost:
                self.coerced[f"{table}.{col}"] += lost
        return out

    def close(self) -> None:
        pass


Tables = SqliteTables | ParquetTables


#: Tables only Nsight Systems writes, which every export holds whatever was traced (one taken without CUDA
#: tracing has no CUPTI_* table, one without NVTX no NVTX_EVENTS).
NSYS_TABLES = ("TARGET_INFO_SESSION_START_TIME", "META_DATA_EXPORT", "EXPORT_META_DATA", "ANALYSIS_DETAILS")


def has_cuda(names: set[str]) -> bool:
    """Whether the export holds any CUDA activity table (none when it was taken without CUDA tracing)."""
    return any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in names)


def looks_like_nsys(names: set[str]) -> bool:
    """An Nsight export has the string table and a CUDA activity, NVTX or Nsight's own session table."""
    return "StringIds" in names and (has_cuda(names) or "NVTX_EVENTS" in names or any(n in names for n in NSYS_TABLES))
