"""The span cache serves only what the trace holds now: content identity in the key, every entry checked on
read, private spill folders per read, and a cache that cannot be written never fails an analysis."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from pipebubble import ingest
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import cache, find_traces
from pipebubble.ingest.json import chrome
from pipebubble.options import Options, Scale
from pipebubble.run import run

ROOT = Path(__file__).resolve().parents[2]


def write_trace(path: Path, dur_us: int = 100, kernels: int = 40) -> Path:
    """A small Kineto trace: one rank, kernels of ``dur_us`` on two streams with their launches. Durations
    of the same digit count give files of the same size and different busy time."""
    events = []
    for i in range(kernels):
        start = 1_000 + i * 1_000
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": 100,
                "ts": start - 5,
                "dur": 3,
                "args": {"correlation": i},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"gemm_{i % 3}",
                "pid": 0,
                "tid": 7 + i % 2,
                "ts": start,
                "dur": dur_us,
                "args": {"correlation": i},
            }
        )
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def numbers(report) -> tuple[int, dict[str, int]]:
    """What a stale or doubled table would get wrong: the span count and every lane's busy time."""
    return report.ingest.spans, {lane.lane: lane.busy_ns for lane in report.lanes}


def analyse(path: Path, use_cache: bool = True):
    """Through the span cache, which these tests are about: cached whole reports are dropped first."""
    for entry in cache.directory().glob("report-*.json"):
        entry.unlink()
    return numbers(run([path], Options(), Scale(workers=1, use_cache=use_cache)))


def spill_entries() -> list[Path]:
    root = cache.directory() / "spill"
    return sorted(root.iterdir()) if root.is_dir() else []


@pytest.fixture
def spilling(monkeypatch):
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")


# --- the key: content identity ---


def test_same_size_and_mtime_edit_is_read_afresh(tmp_path):
    path = write_trace(tmp_path / "t.json", dur_us=100)
    old = analyse(path)
    before = path.stat()
    write_trace(path, dur_us=300)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    fresh = analyse(path)
    assert fresh == analyse(path, use_cache=False) and fresh != old


def test_rename_replace_is_read_afresh(tmp_path):
    path = write_trace(tmp_path / "t.json", dur_us=100)
    old = analyse(path)
    before = path.stat()
    other = write_trace(tmp_path / "new.json.part", dur_us=300)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, path)
    fresh = analyse(path)
    assert fresh == analyse(path, use_cache=False) and fresh != old


def test_every_member_of_a_parquet_folder_counts(tmp_path):
    folder = tmp_path / "report_pqtdir"
    folder.mkdir()
    (folder / "StringIds.parquet").write_bytes(b"a" * 100)
    (folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").write_bytes(b"b" * 100)
    os.utime(folder / "StringIds.parquet", ns=(10**18, 10**18 - 10**9))  # the older member
    os.utime(folder / "CUPTI_ACTIVITY_KIND_KERNEL.parquet", ns=(10**18, 10**18))
    key, report = cache.key(folder), cache.report_key([folder], {})
    old = (folder / "StringIds.parquet").stat()
    (folder / "StringIds.parquet").write_bytes(b"c" * 100)  # same size, mtime put back: only content differs
    os.utime(folder / "StringIds.parquet", ns=(old.st_atime_ns, old.st_mtime_ns))
    assert cache.key(folder) != key and cache.report_key([folder], {}) != report
    key = cache.key(folder)
    (folder / "CUPTI_ACTIVITY_KIND_MEMCPY.parquet").write_bytes(b"d")
    assert cache.key(folder) != key


@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilled"])
def test_a_good_entry_is_used(tmp_path, monkeypatch, spill):
    if spill:
        monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    path = write_trace(tmp_path / "t.json")
    first = analyse(path)

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded again although the cache holds the file")

    monkeypatch.setattr(chrome, "read", no_decoding)
    assert analyse(path) == first


# --- spill folders ---

_CHILD = """
import json, os, sys, time
from pathlib import Path
from pipebubble.options import Options, Scale
from pipebubble.run import run
ready, go, path = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
ready.touch()
while not go.exists():
    time.sleep(0.005)
report = run([path], Options(), Scale(workers=1, use_cache=True))
print(json.dumps([report.ingest.spans, {lane.lane: lane.busy_ns for lane in report.lanes}]))
"""


def test_concurrent_spilled_reads_never_mix_parts(tmp_path, monkeypatch):
    path = write_trace(tmp_path / "t.json", kernels=400)
    expected = analyse(path, use_cache=False)
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    for round_ in range(3):
        home = tmp_path / f"cache{round_}"
        monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(home))
        go = tmp_path / f"go{round_}"
        ready = [tmp_path / f"ready{round_}-{i}" for i in range(2)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        children = [
            subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(r), str(go), str(path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in ready
        ]
        deadline = time.monotonic() + 60
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()
        for child in children:
            out, err = child.communicate(timeout=120)
            assert child.returncode == 0, err
            spans, busy = json.loads(out)
            assert (spans, busy) == expected
        assert analyse(path) == expected  # and what they cached
        assert [p.name for p in spill_entries()] == [cache.key(path)]  # one committed folder, no leftovers


def test_a_deleted_spill_part_means_reading_again(tmp_path, spilling):
    path = write_trace(tmp_path / "t.json", kernels=400)
    expected = analyse(path)
    (folder,) = spill_entries()
    biggest = max(folder.glob("part-*.parquet"), key=lambda p: p.stat().st_size)
    biggest.unlink()
    assert analyse(path) == expected
    assert cache.get(path) is not None  # read again and cached whole


def test_stale_private_spill_folders_are_removed(tmp_path, spilling):
    path = write_trace(tmp_path / "t.json")
    root = cache.directory() / "spill"
    stale = root / f"{'0' * 40}.tmp-12345@elsewhere-{'a' * 32}"
    stale.mkdir(parents=True)
    (stale / "part-x.parquet").write_bytes(b"x")
    os.utime(stale, (time.time() - 3 * 86400,) * 2)
    analyse(path)
    assert not stale.exists()


def test_spilled_trace_without_spans_is_like_in_memory(tmp_path, monkeypatch):
    path = tmp_path / "counters.json"
    path.write_text('{"traceEvents": [{"ph": "C", "name": "mem", "pid": 1, "ts": 1, "args": {"v": 1}}]}')
    with pytest.raises(TraceFormatError) as in_memory:
        run([path], Options(), Scale(use_cache=False))
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "10")
    for _ in range(2):  # read, then from the cache
        with pytest.raises(TraceFormatError) as spilled:
            run([path], Options(), Scale(use_cache=True))
        assert str(spilled.value) == str(in_memory.value) and "nothing to analyse" in str(spilled.value)
    assert spill_entries() == []


# --- a cache that cannot be written ---


def _cache_warnings_since(seen: int) -> list[str]:
    return cache.warnings()[seen:]


@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize(
    "error",
    [
        pl.exceptions.ComputeError("No space left on device (os error 28)"),
        OSError(errno.ENOSPC, "No space left on device"),
    ],
    ids=["polars-compute-error", "oserror-enospc"],
)
def test_full_cache_volume(tmp_path, monkeypatch, error, spill):
    path = write_trace(tmp_path / "t.json")
    expected = analyse(path, use_cache=False)
    if spill:
        monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")

    def full(self, *args, **kwargs):
        raise error

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    seen = len(cache.warnings())
    report = run([path], Options(), Scale(workers=1, use_cache=True))
    assert numbers(report) == expected
    (warning,) = _cache_warnings_since(seen)
    assert "No space left on device" in warning and str(cache.directory()) in warning
    assert warning in report.ingest.warnings


def _unwritable(kind: str, tmp_path: Path, monkeypatch) -> None:
    """Point the cache somewhere no file can be written, in a way that holds even for root."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    if kind == "path-is-a-file":
        monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(blocker))
    elif kind == "under-a-file":
        monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(blocker / "cache"))
    elif kind == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders (see the permission-denied case)")
        home = tmp_path / "ro"
        home.mkdir()
        home.chmod(0o555)
        monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(home))
    else:  # permission denied on every write, as a read-only folder gives a user who is not root

        def denied(self, target, *args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(target))

        monkeypatch.setattr(pl.DataFrame, "write_parquet", denied)


@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilled"])
@pytest.mark.parametrize("kind", ["path-is-a-file", "under-a-file", "read-only", "permission-denied"])
def test_unwritable_cache_falls_back_with_one_warning(tmp_path, monkeypatch, kind, spill):
    path = write_trace(tmp_path / "t.json")
    expected = analyse(path, use_cache=False)
    if spill:
        monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    _unwritable(kind, tmp_path, monkeypatch)
    seen = len(cache.warnings())
    for _ in range(2):
        assert analyse(path) == expected
    assert len(_cache_warnings_since(seen)) == 1


def test_big_gzip_scratch_falls_back_too(tmp_path, monkeypatch):
    import gzip

    from pipebubble.ingest.json import trace as jsontrace

    plain = write_trace(tmp_path / "t.json")
    expected = analyse(plain, use_cache=False)
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(plain.read_bytes()))
    monkeypatch.setattr(jsontrace, "GUNZIP_TO_DISK", 0)
    _unwritable("path-is-a-file", tmp_path, monkeypatch)
    seen = len(cache.warnings())
    assert analyse(path) == expected
    assert len(_cache_warnings_since(seen)) == 1


def test_cached_report_keeps_no_cache_warning(tmp_path):
    key = cache.report_key([write_trace(tmp_path / "t.json")], {})
    report = run([tmp_path / "t.json"], Options(), Scale(workers=1)).to_dict()
    report["ingest"]["warnings"] = ["cache /x unusable (No space left on device); using a temporary folder", "kept"]
    cache.put_report(key, report)
    assert cache.get_report(key)["ingest"]["warnings"] == ["kept"]


# --- damaged entries ---


def _entries(suffix: str) -> list[Path]:
    return [p for p in cache.directory().glob(f"*{suffix}") if not p.name.startswith("report-")]


@pytest.mark.parametrize(
    "text",
    ["[1, 2, 3]", "{}", '{"source": 1}', "null", "truncated"],
    ids=["a-list", "empty", "wrong-types", "null", "truncated"],
)
@pytest.mark.parametrize("spill", [False, True], ids=["in-memory", "spilled"])
def test_corrupt_entry_json(tmp_path, monkeypatch, text, spill):
    if spill:
        monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    path = write_trace(tmp_path / "t.json")
    expected = analyse(path)
    (entry,) = _entries(".json")
    if text == "truncated":
        text = entry.read_text()[: len(entry.read_text()) // 2]
    entry.write_text(text)
    assert analyse(path) == expected


def test_entry_json_with_wrong_field_types(tmp_path):
    path = write_trace(tmp_path / "t.json")
    expected = analyse(path)
    (entry,) = _entries(".json")
    good = json.loads(entry.read_text())
    for field, bad in [("skipped", ["x"]), ("meta", []), ("events_read", "12"), ("warnings", "w"), ("rows", None)]:
        entry.write_text(json.dumps({**good, field: bad}))
        assert cache.get(path) is None
        assert analyse(path) == expected


@pytest.mark.parametrize("damage", ["garbage", "wrong-columns", "wrong-types", "rows-missing"])
def test_corrupt_entry_parquet(tmp_path, damage):
    path = write_trace(tmp_path / "t.json")
    expected = analyse(path)
    (entry,) = _entries(".parquet")
    table = pl.read_parquet(entry)
    if damage == "garbage":
        entry.write_bytes(b"PAR1 not really parquet PAR1")
    elif damage == "wrong-columns":
        pl.DataFrame({"a": [1, 2]}).write_parquet(entry)
    elif damage == "wrong-types":
        table.with_columns(pl.col("start").cast(pl.Float64)).write_parquet(entry)
    else:
        table.head(3).write_parquet(entry)
    assert cache.get(path) is None
    assert analyse(path) == expected


@pytest.mark.parametrize("body", ["[]", '{"key": "k"}', "{", '{"key": "K", "report": {"ingest": 5}}'])
def test_corrupt_cached_report_is_ignored(tmp_path, body):
    path = write_trace(tmp_path / "t.json")
    expected = run([path], Options(), Scale(workers=1)).to_dict()
    key = cache.report_key([path], Options().settings())
    assert cache.get_report(key) == expected
    (cache.directory() / f"{key}.json").write_text(body.replace('"K"', json.dumps(key)))
    assert cache.get_report(key) is None or "ingest" in body  # a report of the wrong shape: run rebuilds it
    assert run([path], Options(), Scale(workers=1)).to_dict() == expected


# --- what a folder holds ---


def test_folder_skips_capture_leftovers(tmp_path):
    trace = write_trace(tmp_path / "rank0.json")
    for name in [".rank0.status.json", "rank1.status.json", "rank1.partial.json.gz", "rank2.json.tmp", ".hidden.json"]:
        (tmp_path / name).write_text("{}")
    assert find_traces([tmp_path]) == [trace]
    named = tmp_path / ".rank0.status.json"
    assert find_traces([named]) == [named]  # a file named itself is still read


def test_folder_of_only_leftovers_is_an_empty_folder(tmp_path):
    (tmp_path / ".rank0.status.json").write_text("{}")
    with pytest.raises(TraceFormatError, match="no trace files"):
        find_traces([tmp_path])


def test_ingest_load_through_a_fallback(tmp_path, monkeypatch, spilling):
    path = write_trace(tmp_path / "t.json")
    expected = ingest.load([path], use_cache=False).spans.height
    _unwritable("path-is-a-file", tmp_path, monkeypatch)
    loaded = ingest.load([path])
    assert loaded.spans.height == expected
    assert sum(cache.is_cache_warning(w) for w in loaded.warnings) == 1


@pytest.mark.parametrize("spill", ["1", str(1 << 40)], ids=["spilled", "in-memory"])
def test_cli_with_a_cache_path_that_is_a_file(tmp_path, spill):
    path = write_trace(tmp_path / "t.json")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    env = {**os.environ, "PIPEBUBBLE_CACHE_DIR": str(blocker), "PIPEBUBBLE_SPILL_BYTES": spill}
    expected = run([path], Options(), Scale(workers=1, use_cache=False)).to_dict()
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "pipebubble", "analyze", str(path), "--format", "json", "-q"],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and proc.stderr.count("unusable") == 1
        report = json.loads(proc.stdout)
        assert report["ingest"]["spans"] == expected["ingest"]["spans"] and report["lanes"] == expected["lanes"]
    assert blocker.read_text() == "not a folder"


def test_a_changed_build_never_reads_an_older_builds_entries(tmp_path, monkeypatch):
    """The keys hold the package's own files' identity: a build whose reader or analysis changed, under the
    same version number, reads the trace afresh rather than serving what the older build cached."""
    from pipebubble.ingest.cache import entries

    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    before = entries.key(trace), entries.report_key([trace], {})
    monkeypatch.setattr(entries, "code_identity", lambda: "another build")
    after = entries.key(trace), entries.report_key([trace], {})
    assert before[0] != after[0] and before[1] != after[1]
