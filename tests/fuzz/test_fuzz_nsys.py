"""Mutated Nsight Systems exports: ingest returns a sound span table or a one-line ``TraceFormatError``.

Seeds are small exports in every fixture layout, the minimal shared repro (when present) and a trimmed copy
of the real 2-GPU export (when present). Each input applies one to three random mutations: tables and
columns dropped or renamed, NULLs, BLOBs, text and reals in integer columns, huge and negative numbers,
invalid UTF-8, broken views, a damaged schema, WAL mode, truncation and corrupted pages.

Run with ``python -m pytest -m fuzz tests/fuzz/test_fuzz_nsys.py -p no:cacheprovider -s``;
``PIPEBUBBLE_FUZZ_EXAMPLES`` sets the number of inputs (default 10000), ``PIPEBUBBLE_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec
import polars as pl
import pytest

from pipebubble.errors import TraceFormatError
from pipebubble.ingest import read_one
from pipebubble.spans import validate

try:  # tests/ as a package, or as a plain folder on sys.path (pytest's default import mode)
    from tests import nsys_fixtures as fx
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import nsys_fixtures as fx

ROOT = Path(__file__).resolve().parents[2]
REPROS = ROOT.parent / "shared" / "repros"
REAL = ROOT.parent / "shared" / "traces" / "nsys" / "torchrun_2xh100_nccl.sqlite"
EXAMPLES = int(os.environ.get("PIPEBUBBLE_FUZZ_EXAMPLES", "10000"))
SEED = int(os.environ.get("PIPEBUBBLE_FUZZ_SEED", "20260"))
LIMIT = 1 << 62

INTS = [
    0, -1, 1, 2**31 - 1, 2**31, -(2**31) - 1, 2**62, 2**62 + 1, -(2**62) - 1,
    2**63 - 1, -(2**63), 2**48 | (144 << 24), 10**15, -(10**15),
]  # fmt: skip
REALS = [1.5, 1e300, -1e300, float("inf"), float("-inf"), 2.0**63, 1000.0, -0.0]
TEXTS = ["", "abc", "123", "-5", "99999999999999999999", " 7", "0x10", "1e3", "\u00e9\u4e2d", "a\nb"]
BLOBS = [b"", b"A", b"\xff\xfe\x00", b"\x00" * 9, b"SQLite"]


# --- seeds ---


def _seed_trace() -> fx.Trace:
    """Two processes, GPU work of every kind, NVTX ranges and a sync: every table the reader uses."""
    t = fx.Trace(processes={100: "python3", 200: "tr\u00e4iner"})
    for pid, device, tid in ((100, 0, 11), (200, 1, 21)):
        t.gpu += [
            fx.Gpu(pid, device, 7, 1_000, 2_000, name="void gemm<float>(int)", correlation=1, launch_tid=tid),
            fx.Gpu(pid, device, 8, 1_500, 2_500, name="ncclKernel", correlation=2, launch_tid=tid),
            fx.Gpu(pid, device, 7, 3_000, 3_200, kind="memcpy", correlation=3),
            fx.Gpu(pid, device, 7, 4_000, 4_100, kind="memset", correlation=4),
            fx.Gpu(pid, device, 7, 7_000, 7_500, kind="graph", correlation=6),
        ]
        t.nvtx += [
            fx.Nvtx(pid, tid, 900, 2_600, "F0.0.1"),
            fx.Nvtx(pid, tid, 960, None, "never popped"),
            fx.Nvtx(pid, tid, 970, 970, "a mark", event_type=34),
            fx.Nvtx(pid, tid + 1, 4_900, 6_100, "send", event_type=60, range_id=pid),
        ]
        t.syncs.append((pid, 950, 960, 1, 3))
    return t


def _trimmed_real(out: Path, rows: int = 60) -> Path:
    """The first ``rows`` rows of every table of the real export, with its schema."""
    src = sqlite3.connect(f"file:{REAL}?mode=ro&immutable=1", uri=True)
    dst = sqlite3.connect(out)
    tables = src.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL").fetchall()
    for name, sql in tables:
        if name.startswith("sqlite_"):
            continue
        dst.execute(sql)
        data = src.execute(f'SELECT * FROM "{name}" LIMIT {rows}').fetchall()
        if data:
            dst.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(data[0]))})', data)
    dst.commit()
    dst.close()
    src.close()
    return out


def build_seeds(folder: Path) -> list[Path]:
    """Seed exports: each fixture layout, the minimal repro and a trimmed real export where available."""
    folder.mkdir(parents=True, exist_ok=True)
    seeds = [fx.write(_seed_trace(), folder / f"seed-{layout}.sqlite", layout) for layout in fx.LAYOUTS]
    minimal = REPROS / "N0_nsys_minimal_ok.sqlite"
    if minimal.exists():
        seeds.append(Path(shutil.copy(minimal, folder / "seed-minimal.sqlite")))
    if REAL.exists():
        seeds.append(_trimmed_real(folder / "seed-real.sqlite"))
    return seeds


# --- mutations ---


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')").fetchall()
    return [r[0] for r in rows if not r[0].startswith("sqlite_")]


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in conn.execute(f'PRAGMA table_info("{table}")')]


def _pick_column(rng: random.Random, conn: sqlite3.Connection) -> tuple[str, str] | None:
    tables = [
        t
        for t in _tables(conn)
        if conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] == "table"
    ]
    rng.shuffle(tables)
    for table in tables:
        cols = _columns(conn, table)
        if cols:
            return table, rng.choice(cols)
    return None


def _random_value(rng: random.Random) -> object:
    pool = rng.choice([INTS, REALS, TEXTS, BLOBS, [None], [rng.randint(-(2**63), 2**63 - 1)]])
    return rng.choice(pool)


def m_drop_table(rng: random.Random, conn: sqlite3.Connection) -> str:
    table = rng.choice(_tables(conn))
    kind = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    conn.execute(f'DROP {kind.upper()} "{table}"')
    return "drop_table"


def m_rename_table(rng: random.Random, conn: sqlite3.Connection) -> str:
    tables = [t for t in _tables(conn) if not t.startswith("sqlite_")]
    table = rng.choice(tables)
    new = rng.choice(
        [table.lower(), table + "_OLD", table[:-1], "x" + table, table + '"q', table + "\u00e9", table + "\n2"]
    )
    if new in tables:
        return "noop"
    conn.execute(f'ALTER TABLE "{table}" RENAME TO "{new.replace(chr(34), chr(34) * 2)}"')
    return "rename_table"


def m_rename_column(rng: random.Random, conn: sqlite3.Connection) -> str:
    picked = _pick_column(rng, conn)
    if not picked:
        return "noop"
    table, col = picked
    new = rng.choice([col.upper(), col + "2", "_" + col, col + " x"])
    if new in _columns(conn, table):
        return "noop"
    conn.execute(f'ALTER TABLE "{table}" RENAME COLUMN "{col}" TO "{new}"')
    return "rename_column"


def m_drop_column(rng: random.Random, conn: sqlite3.Connection) -> str:
    picked = _pick_column(rng, conn)
    if not picked:
        return "noop"
    table, col = picked
    if len(_columns(conn, table)) < 2:
        return "noop"
    try:
        conn.execute(f'ALTER TABLE "{table}" DROP COLUMN "{col}"')
    except sqlite3.OperationalError:  # a primary key or indexed column
        return "noop"
    return "drop_column"


def m_set_values(rng: random.Random, conn: sqlite3.Connection) -> str:
    """Some rows of one column set to one odd value (NULL, BLOB, text, real, huge or negative int)."""
    picked = _pick_column(rng, conn)
    if not picked:
        return "noop"
    table, col = picked
    value = _random_value(rng)
    where = rng.choice(["", " WHERE rowid % 2 = 0", " WHERE rowid = (SELECT min(rowid) FROM t)"])
    where = where.replace("FROM t", f'FROM "{table}"')
    try:
        conn.execute(f'UPDATE "{table}" SET "{col}" = ?{where}', (value,))
    except sqlite3.IntegrityError:  # NOT NULL or primary key constraint
        return "noop"
    return f"set_{type(value).__name__}"


def m_shift_times(rng: random.Random, conn: sqlite3.Connection) -> str:
    """Times of one table scaled or offset towards the int64 limits."""
    tables = [t for t in _tables(conn) if {"start", "end"} <= set(_columns(conn, t))]
    if not tables:
        return "noop"
    table = rng.choice(tables)
    offset = rng.choice([2**62 - 5_000, -(2**62), 2**61, 2**63 - 10_000, -(2**63) + 10_000])
    try:
        conn.execute(f'UPDATE "{table}" SET start = start + ?, end = end + ?', (offset, offset))
    except sqlite3.Error:  # integer overflow in SQL turns into a real; any failure leaves the table as it is
        return "noop"
    return "shift_times"


def m_bad_utf8(rng: random.Random, conn: sqlite3.Connection) -> str:
    """Invalid UTF-8 stored as TEXT in a string column."""
    targets = [("StringIds", "value"), ("PROCESSES", "name"), ("NVTX_EVENTS", "text"), ("META_DATA_EXPORT", "value")]
    targets = [(t, c) for t, c in targets if c in _columns(conn, t)] if _tables(conn) else []
    if not targets:
        return "noop"
    table, col = rng.choice(targets)
    raw = rng.choice([b"\xff\xfe", b"ok\xc3", b"\xed\xa0\x80", b"\x00\xff"])
    conn.execute(f'UPDATE "{table}" SET "{col}" = CAST(? AS TEXT)', (raw,))
    return "bad_utf8"


def m_broken_view(rng: random.Random, conn: sqlite3.Connection) -> str:
    """A table replaced by a view over a missing table, over itself indirectly, or of constants."""
    table = rng.choice(_tables(conn))
    kind = conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0]
    cols = _columns(conn, table) or ["start"]
    conn.execute(f'DROP {kind.upper()} "{table}"')
    body = rng.choice(
        [
            "SELECT * FROM missing_table",
            "SELECT " + ", ".join(f'1 AS "{c}"' for c in cols),
            "SELECT " + ", ".join(f"x'ff' AS \"{c}\"" for c in cols),
            "SELECT 1 AS start, 1 AS start",
            f'SELECT * FROM "{table}_b"',
        ]
    )
    conn.execute(f'CREATE VIEW "{table}" AS {body}')
    if "_b" in body:
        conn.execute(f'CREATE VIEW "{table}_b" AS SELECT * FROM "{table}"')
    return "broken_view"


def m_retype_table(rng: random.Random, conn: sqlite3.Connection) -> str:
    """A table rebuilt with untyped or TEXT columns (no integer affinity), its values kept as they are."""
    tables = [
        t
        for t in _tables(conn)
        if conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] == "table"
    ]
    if not tables:
        return "noop"
    table = rng.choice(tables)
    cols = _columns(conn, table)
    decl = rng.choice(["", " TEXT", " BLOB", " REAL"])
    conn.execute(f'CREATE TABLE "{table}__new" ({", ".join(f"{chr(34)}{c}{chr(34)}{decl}" for c in cols)})')
    conn.execute(f'INSERT INTO "{table}__new" SELECT * FROM "{table}"')
    conn.execute(f'DROP TABLE "{table}"')
    conn.execute(f'ALTER TABLE "{table}__new" RENAME TO "{table}"')
    return "retype_table"


def m_duplicate_rows(rng: random.Random, conn: sqlite3.Connection) -> str:
    tables = [
        t
        for t in _tables(conn)
        if conn.execute("SELECT type FROM sqlite_master WHERE name = ?", (t,)).fetchone()[0] == "table"
        and t != "StringIds"
    ]
    if not tables:
        return "noop"
    table = rng.choice(tables)
    conn.execute(f'INSERT INTO "{table}" SELECT * FROM "{table}"')
    return "duplicate_rows"


def m_bad_schema(rng: random.Random, conn: sqlite3.Connection) -> str:
    """``sqlite_master`` edited in place: a table's SQL made invalid, multi-line or not UTF-8."""
    table = rng.choice(_tables(conn))
    sql = rng.choice(
        [
            b"CREATE TABLE x(",
            b"CREATE TABLE \xff\xfe(a)",
            b"CREATE TABLE y(a INTEGER,\n  b TEXT -- comment\n  c)",
            b"garbage",
        ]
    )
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET sql = CAST(? AS TEXT) WHERE name = ?", (sql, table))
    return "bad_schema"


def m_bad_name(rng: random.Random, conn: sqlite3.Connection) -> str:
    """A table's name in ``sqlite_master`` set to invalid UTF-8."""
    table = rng.choice(_tables(conn))
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute("UPDATE sqlite_master SET name = CAST(? AS TEXT) WHERE name = ?", (b"CUPTI\xff", table))
    return "bad_name"


SQL_MUTATIONS: list[Callable[[random.Random, sqlite3.Connection], str]] = [
    m_drop_table, m_rename_table, m_rename_column, m_drop_column, m_set_values, m_set_values, m_set_values,
    m_shift_times, m_bad_utf8, m_broken_view, m_retype_table, m_duplicate_rows, m_bad_schema, m_bad_name,
]  # fmt: skip


def b_truncate(rng: random.Random, data: bytearray) -> str:
    del data[rng.randint(0, len(data) - 1) :]
    return "truncate"


def b_corrupt(rng: random.Random, data: bytearray) -> str:
    """A few random bytes overwritten, somewhere in the file or inside one page."""
    page = rng.randrange(max(1, len(data) // 4096)) * 4096
    for _ in range(rng.randint(1, 16)):
        pos = page + rng.randrange(min(4096, len(data) - page))
        data[pos] = rng.randrange(256)
    return "corrupt_bytes"


def b_zero_page(rng: random.Random, data: bytearray) -> str:
    page = rng.randrange(max(1, len(data) // 4096)) * 4096
    data[page : page + 4096] = bytes(min(4096, len(data) - page))
    return "zero_page"


def b_append(rng: random.Random, data: bytearray) -> str:
    data += rng.randbytes(rng.randint(1, 5000))
    return "append"


BYTE_MUTATIONS = [b_truncate, b_corrupt, b_zero_page, b_append]


def mutate(rng: random.Random, seed: Path, out: Path) -> list[str]:
    """Copy ``seed`` to ``out`` and apply one to three mutations; the names of those applied."""
    shutil.copy(seed, out)
    applied: list[str] = []
    steps = rng.randint(1, 3)
    sql_steps = [rng.random() < 0.8 for _ in range(steps)]
    if any(sql_steps):
        conn = sqlite3.connect(out, isolation_level=None)
        try:
            for step_is_sql in sql_steps:
                if step_is_sql:
                    applied.append(_apply_sql(rng, conn))
            if rng.random() < 0.05:
                conn.execute("PRAGMA journal_mode = WAL")
                applied.append("wal_mode")
        finally:
            conn.close()
    for suffix in ("-wal", "-shm", "-journal"):
        out.with_name(out.name + suffix).unlink(missing_ok=True)
    if not all(sql_steps):
        data = bytearray(out.read_bytes())
        for step_is_sql in sql_steps:
            if not step_is_sql and data:
                applied.append(rng.choice(BYTE_MUTATIONS)(rng, data))
        out.write_bytes(bytes(data))
    return applied


def _apply_sql(rng: random.Random, conn: sqlite3.Connection) -> str:
    """One SQL mutation; one that SQLite refuses (the schema was already broken) is recorded as such."""
    mutation = rng.choice(SQL_MUTATIONS)
    try:
        if not _tables(conn):
            return "noop"
        return mutation(rng, conn)
    except sqlite3.Error:
        return f"{mutation.__name__}_refused"


# --- checks ---


def check_result(path: Path, before: set[str]) -> str:
    """Ingest ``path``; the outcome name, or raise AssertionError naming the broken contract."""
    try:
        result = read_one(path)
    except TraceFormatError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1, f"multi-line error: {message!r}"
        assert str(path) in message, f"error does not name the file: {message!r}"
        outcome = "format_error"
    else:
        spans = result.spans
        assert validate(spans) == [], validate(spans)
        assert spans.height > 0
        out_of_range = spans.filter(
            (pl.col("start") <= -LIMIT)
            | (pl.col("end") >= LIMIT)
            | (pl.col("start") >= LIMIT)
            | (pl.col("end") <= -LIMIT)
        )
        assert out_of_range.is_empty(), "span times beyond +-2**62"
        assert result.events_read == spans.height + sum(result.skipped.values()), "rows not accounted for"
        assert all(len(w.splitlines()) == 1 for w in result.warnings), result.warnings
        msgspec.msgpack.encode(result.meta, enc_hook=str)  # meta must stay within 64-bit ints
        outcome = "spans_with_skips" if result.skipped else "spans"
    after = {p.name for p in path.parent.iterdir()}
    assert after == before, f"files written beside the input: {sorted(after - before)}"
    return outcome


def _signature(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "pipebubble" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__} at {where}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"


@pytest.mark.fuzz
def test_fuzz_nsys_ingest(tmp_path: Path) -> None:
    """``EXAMPLES`` mutated exports: each a sound span table or a one-line TraceFormatError, nothing else."""
    rng = random.Random(SEED)
    seeds = build_seeds(tmp_path / "seeds")
    crashes_dir = tmp_path / "crashes"
    work = tmp_path / "work"
    work.mkdir()
    outcomes: Counter[str] = Counter()
    mutations: Counter[str] = Counter()
    crashes: dict[str, str] = {}
    began = time.monotonic()
    for i in range(EXAMPLES):
        case = work / f"case{i % 2}"
        shutil.rmtree(case, ignore_errors=True)
        case.mkdir()
        path = case / "input.sqlite"
        applied = mutate(rng, rng.choice(seeds), path)
        mutations.update(applied)
        before = {p.name for p in case.iterdir()}
        try:
            outcomes[check_result(path, before)] += 1
        except Exception as exc:  # a crash or a broken contract: keep the input
            outcomes["crash"] += 1
            sig = _signature(exc)
            if sig not in crashes:
                crashes_dir.mkdir(exist_ok=True)
                kept = crashes_dir / f"crash{len(crashes)}.sqlite"
                shutil.copy(path, kept)
                crashes[sig] = f"{kept} ({', '.join(applied)})"
    wall = time.monotonic() - began
    print(
        f"\nnsys fuzz: {EXAMPLES} inputs, seed {SEED}, {len(seeds)} seeds, {wall:.1f} s, "
        f"{outcomes['crash']} crashes ({len(crashes)} distinct)\n  outcomes: {dict(outcomes)}\n"
        f"  mutations: {dict(sorted(mutations.items()))}"
    )
    for sig, where in crashes.items():
        print(f"  CRASH {sig}\n    input: {where}")
    assert not crashes, f"{outcomes['crash']} crashes: {list(crashes)}"
