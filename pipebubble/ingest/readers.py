"""The formats ingest reads: one entry per format, saying how a file is recognised, which names a folder's
traces have, and how the file is read. ``reader_for`` is the one place a file's format is decided; a new
format is a module with a ``read`` function and one entry in ``READERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from pipebubble.ingest.base import FileResult
from pipebubble.ingest.magic import is_sqlite


@dataclass(frozen=True)
class Where:
    """What a read may use: the file's position in the job (its rank when nothing else says), a pool for the
    blocks of one big file, a work folder (exports, gunzipped scratch) and a spill folder for its spans."""

    position: int = 0
    pool: Executor | None = None
    work: Path | None = None
    spill: Path | None = None


@dataclass(frozen=True)
class Reader:
    name: str
    suffixes: tuple[str, ...]  # the names a folder's traces of this format end with
    claims: Callable[[Path], bool]  # whether this reader reads ``path`` (name or content)
    read: Callable[[Path, Where], FileResult]
    writes_files: Callable[[Path], bool]  # needs a work folder besides a spill
    spills: Callable[[Path], bool] = lambda path: False  # too big for memory: spans go to Parquet
    splits: Callable[[Path], bool] = lambda path: False  # worth decoding in parallel blocks


# --- Nsight Systems: SQLite exports, parquetdir folders, .nsys-rep/.qdrep reports ---

NSYS_SUFFIXES = (".sqlite", ".nsys-rep", ".qdrep")
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")  # need nsys to export them, unless their .sqlite is beside them


def _nsys_claims(path: Path) -> bool:
    if path.name.endswith(NSYS_SUFFIXES):
        return True
    # Said without loading the Nsight reader (and polars): a folder with no table in it is no parquetdir
    # export, a file that is not SQLite no export.
    if path.is_dir() and not any(p.suffix == ".parquet" or p.is_dir() for p in path.iterdir()):
        return False
    if path.is_file() and not is_sqlite(path):
        return False
    from pipebubble.ingest import nsys

    return nsys.sniff(path)


def _nsys_read(path: Path, where: Where) -> FileResult:
    from pipebubble.ingest import nsys

    return nsys.read(sqlite_beside(path) or path, where.work)


def sqlite_beside(report: Path) -> Path | None:
    """The SQLite export next to an Nsight report (`report1.sqlite` by `report1.nsys-rep`, as `nsys profile
    --export sqlite` and `nsys export` leave them), unless it is older than the report (a stale export): read
    it instead, and no nsys is needed."""
    if not report.name.endswith(NSYS_REPORT_SUFFIXES):
        return None
    sqlite = report.with_suffix(".sqlite")
    try:
        return sqlite if sqlite.is_file() and sqlite.stat().st_mtime >= report.stat().st_mtime else None
    except OSError:
        return None


def paired(files: list[Path], notes: list[str] | None = None) -> list[Path]:
    """``files`` without the Nsight reports whose fresh SQLite export is among them (one run, read once)
    nor the stale exports of reports among them (the report is what is current; a line in ``notes``)."""
    given = set(files)
    drop = {f for f in files if sqlite_beside(f) in given}
    stale = [f for f in files if f.name.endswith(NSYS_REPORT_SUFFIXES) and f not in drop
             and f.with_suffix(".sqlite") in given]
    if notes is not None:
        notes.extend(f"{f.with_suffix('.sqlite')}: skipped, older than {f.name} (export it again)" for f in stale)
    drop |= {f.with_suffix(".sqlite") for f in stale}
    return [f for f in files if f not in drop]


def saved_report(path: Path) -> bool:
    """A JSON report pipebubble wrote (`analyze --format json -o`), not a trace: its first key is
    `schema_version` (Kineto's traces say `schemaVersion`)."""
    if not path.is_file() or not path.name.lower().endswith(".json"):
        return False
    try:
        with open(path, "rb") as fh:
            return b'"schema_version"' in fh.read(4096)
    except OSError:
        return False


def _nsys_writes(path: Path) -> bool:
    from pipebubble.ingest import nsys

    return path.name.endswith(nsys.REPORT_SUFFIXES)  # exported to SQLite in the work folder first


# --- Chrome-trace JSON (torch.profiler/Kineto writes it too), plain or gzipped ---

JSON_SUFFIXES = (".json", ".json.gz")


def _json_read(path: Path, where: Where) -> FileResult:
    from pipebubble.ingest.json import chrome

    scratch = where.work / "scratch" if where.work is not None else None
    return chrome.read(path, where.position, where.pool, scratch, where.spill)


def _json_text_bytes(path: Path) -> int:
    """Bytes of JSON text the file holds, about: gzip shrinks Kineto JSON about tenfold."""
    return path.stat().st_size * (10 if _gzipped(path) else 1)


def _gzipped(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _json_writes(path: Path) -> bool:
    """A big gzipped trace is gunzipped to a scratch file rather than into memory."""
    from pipebubble.ingest.json.trace import GUNZIP_TO_DISK

    return path.is_file() and _gzipped(path) and path.stat().st_size >= GUNZIP_TO_DISK


def _json_spills(path: Path) -> bool:
    """Too big for memory: more JSON text than the memory budget holds in memory (``budget.spill_bytes``)."""
    from pipebubble import budget

    return path.is_file() and _json_text_bytes(path) >= budget.spill_bytes()


#: No less JSON text than this is worth decoding in blocks on a pool, whatever the block size.
SPLIT_FLOOR_BYTES = 32 << 20


def _json_splits(path: Path) -> bool:
    """Enough decode blocks' worth of JSON text to be worth starting a pool for (four blocks, and over
    ``SPLIT_FLOOR_BYTES``)."""
    from pipebubble.ingest.json.trace import BLOCK_BYTES

    return path.is_file() and _json_text_bytes(path) > max(4 * BLOCK_BYTES, SPLIT_FLOOR_BYTES)


def may_split(path: Path) -> bool:
    """Whether a file might be decoded in blocks on a pool (over ``SPLIT_FLOOR_BYTES`` of text), asked
    before polars is loaded, so without the block size or the file's format."""
    return path.is_file() and _json_text_bytes(path) > SPLIT_FLOOR_BYTES


# --- request spans: OTLP JSON (an OpenTelemetry Collector's file exporter) and Jaeger JSON, told by content ---

#: Bytes of a file's (gunzipped) start looked at to tell request spans from a Chrome trace.
HEAD_BYTES = 4096


def head(path: Path) -> bytes:
    """The first ``HEAD_BYTES`` of a file's text (gunzipped when it is gzipped), leading blanks dropped; b""
    for a folder or a file that cannot be read."""
    import zlib

    try:
        with path.open("rb") as fh:
            raw = fh.read(HEAD_BYTES * 4)
    except OSError:
        return b""
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = zlib.decompressobj(wbits=31).decompress(raw, HEAD_BYTES * 2)
        except zlib.error:
            return b""
    return raw.lstrip()[:HEAD_BYTES]


def _otlp_claims(path: Path) -> bool:
    """An OTLP JSON object: ``{"resourceSpans": ...`` (one per line from a collector's file exporter)."""
    start = head(path) if path.is_file() else b""
    return start.startswith(b"{") and b'"resourceSpans"' in start


def _jaeger_claims(path: Path) -> bool:
    """Jaeger's JSON: an object whose first span names ``traceID``, ``spanID`` and ``operationName``."""
    start = head(path) if path.is_file() else b""
    return start.startswith(b"{") and all(k in start for k in (b'"traceID"', b'"spanID"', b'"operationName"'))


def _otlp_read(path: Path, where: Where) -> FileResult:
    from pipebubble.ingest import otlp

    return otlp.read(path)


def _jaeger_read(path: Path, where: Where) -> FileResult:
    from pipebubble.ingest import jaeger

    return jaeger.read(path)


# --- Perfetto protobuf (pipebubble's export, PyTorch's profiler, the Perfetto SDK) ---


def _pftrace_claims(path: Path) -> bool:
    if not path.is_file() or path.name.lower().endswith(JSON_SUFFIXES + NSYS_SUFFIXES):
        return False
    from pipebubble.ingest import pftrace

    return pftrace.sniff(path)


def _pftrace_read(path: Path, where: Where) -> FileResult:
    from pipebubble.ingest import pftrace

    return pftrace.read(path, where.position)


READERS = (
    Reader("nsys", NSYS_SUFFIXES, _nsys_claims, _nsys_read, _nsys_writes),
    Reader("otlp", JSON_SUFFIXES, _otlp_claims, _otlp_read, lambda path: False),
    Reader("jaeger", JSON_SUFFIXES, _jaeger_claims, _jaeger_read, lambda path: False),
    Reader("perfetto", (".pftrace", ".perfetto-trace"), _pftrace_claims, _pftrace_read, lambda path: False),
    # Last: whatever no other reader claims is read as JSON (its errors say what a JSON trace needs).
    Reader("json", JSON_SUFFIXES, lambda path: True, _json_read, _json_writes, _json_spills, _json_splits),
)
TRACE_SUFFIXES = tuple(s for r in READERS for s in r.suffixes)


def reader_for(path: Path) -> Reader:
    """The reader of ``path``: the first that claims it."""
    return next(r for r in READERS if r.claims(path))


def is_trace_dir(path: Path) -> bool:
    """A folder that is one trace (an Nsight parquetdir export), not a folder of traces."""
    return path.is_dir() and _nsys_claims(path)
