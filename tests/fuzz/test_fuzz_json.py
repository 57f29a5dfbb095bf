"""Mutation fuzzing of JSON ingest: damaged Kineto, generic Chrome and gzipped traces.

Every input must give either a FileResult whose spans validate or a TraceFormatError, and reading it with
small blocks, or gunzipped to disk instead of in memory, must give the same outcome. Inputs per format:
``PIPEBUBBLE_FUZZ_EXAMPLES`` (default 10000); the seed: ``PIPEBUBBLE_FUZZ_SEED`` (default 0).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import time
import traceback
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, SHARED_TRACES

from pipebubble import spans as span_table
from pipebubble.errors import TraceFormatError
from pipebubble.ingest import read_one
from pipebubble.ingest.json import trace as jsontrace

EXAMPLES = int(os.environ.get("PIPEBUBBLE_FUZZ_EXAMPLES", "10000"))
SEED = int(os.environ.get("PIPEBUBBLE_FUZZ_SEED", "0"))
FORMATS = ("kineto", "chrome", "gzip")


def _kineto_synthetic() -> bytes:
    events = [{"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}}]
    for i in range(20):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 4}", "pid": 11, "tid": 11,
                       "ts": 1712195495519000.125 + i * 7.5, "dur": 3.25, "args": {"External id": i}})
        events.append({"ph": "X", "cat": "kernel", "name": "ncclKernel" if i % 5 == 0 else f"k{i}", "pid": 0,
                       "tid": 7, "ts": 1712195495519002.5 + i * 7.5, "dur": 2, "args": {"correlation": i}})
        events.append({"ph": "f", "id": i, "pid": 0, "tid": 7, "ts": 1712195495519002.5 + i * 7.5, "cat": "ac2g"})
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2, "backend": "nccl",
           "pg_config": [{"pg_name": "0", "ranks": [0, 1]}]}, "deviceProperties": [{"id": 0}],
           "traceEvents": events, "traceName": "t.json"}
    return json.dumps(doc, indent=1).encode()


def _chrome_synthetic() -> bytes:
    events = [{"ph": "M", "name": "thread_name", "pid": "Renderer", "tid": 1, "args": {"name": "main"}}]
    for i in range(15):
        events.append({"ph": "B", "name": f"task{i}", "pid": "Renderer", "tid": 1, "ts": i * 10})
        events.append({"ph": "E", "pid": "Renderer", "tid": 1, "ts": i * 10 + 4.5})
        events.append({"ph": "b", "cat": "net", "id": f"0x{i}", "name": "req", "pid": "Browser", "tid": 2, "ts": i})
        events.append({"ph": "e", "cat": "net", "id": f"0x{i}", "name": "req", "pid": "Browser", "tid": 2,
                       "ts": i + 30})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": i % 3, "tid": "stream 7", "ts": i * 3,
                       "dur": 1.5})
        events.append({"ph": "C", "name": "mem", "pid": "Browser", "ts": i, "args": {"v": i}})
    return json.dumps(events).encode()


def _trimmed(path: Path, keep: int = 60) -> bytes | None:
    """A real trace cut down to its header and first ``keep`` events (small inputs: many per second)."""
    if not path.exists():
        return None
    doc = json.loads(gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes())
    if isinstance(doc, dict):
        doc["traceEvents"] = doc.get("traceEvents", [])[:keep]
    return json.dumps(doc).encode()


def seeds() -> dict[str, list[bytes]]:
    names = ("mi250_rocm_toy_train", "large_integer_ts", "cpu_only_gloo_rank34", "old_category_names_inference")
    real = [SHARED_TRACES / "kineto" / f"{n}.json.gz" for n in names]
    real += sorted((ROOT / "sample_traces").glob("*/rank0.pt.trace.json.gz"))[:2]
    kineto = [_kineto_synthetic(), *[t for t in map(_trimmed, real) if t]]
    chrome = [_chrome_synthetic(), json.dumps({"traceEvents": json.loads(_chrome_synthetic())}).encode()]
    return {"kineto": kineto, "chrome": chrome, "gzip": kineto[:3] + chrome}


_TOKENS = [b"{", b"}", b"[", b"]", b",", b'"', b":", b"\x00", b"NaN", b"}, {", b"null", b"-", b"\\", b"\\u", b"e"]
_VALUES = [b"null", b"true", b'"x"', b"[]", b"{}", b"[1, [2]]", b'{"a": {"b": 1}}', b"0", b"-1", b"1e400",
           b"-1e400", b"1e19", b"9223372036854775808", b"-9223372036854775809", b"4611686018427387904",
           b"1e16", b"-4.7e15", b"1712195495519695.8125", b"2147483648", b'"99999999999999999999"',
           b"123456789012345678901234567890", b"0.0000001", b'"\\ud800"', b'"\\udc00x"', b'"\xff\xfe"',
           b'"a\xc3"', b"Infinity", b'"gpu0"', b"1" * 400]
_NUMBER = __import__("re").compile(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?|\"[^\"\\]{0,40}\"|null|true|false")


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four random damages of a JSON text."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(["flip", "cut", "delete", "insert", "swap", "swap", "swap", "deep", "utf8", "dup", "space"])
        pos = rng.randrange(len(out) + 1) if out else 0
        if kind == "flip" and out:
            out[min(pos, len(out) - 1)] = rng.randrange(256)
        elif kind == "cut":
            del out[pos:]
        elif kind == "delete":
            del out[pos : pos + rng.randint(1, 64)]
        elif kind == "insert":
            out[pos:pos] = rng.choice(_TOKENS)
        elif kind == "swap":  # a scalar value becomes another type or an extreme number
            match = _NUMBER.search(bytes(out), pos) or _NUMBER.search(bytes(out))
            if match:
                out[match.start() : match.end()] = rng.choice(_VALUES)
        elif kind == "deep":
            match = _NUMBER.search(bytes(out), pos)
            if match:
                depth = rng.choice([40, 300, 1200, 5000])
                opener, closer = rng.choice([(b"[", b"]"), (b'{"a":', b"}")])
                out[match.start() : match.end()] = opener * depth + match.group() + closer * depth
        elif kind == "utf8":
            out[pos:pos] = rng.choice([b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"])
        elif kind == "dup":  # a slice of the text repeated (duplicate events, keys, brackets)
            a = rng.randrange(len(out) + 1) if out else 0
            out[pos:pos] = out[a : a + rng.randint(1, 300)]
        else:
            out[pos:pos] = rng.choice([b" " * rng.randint(1, 5000), b"\n\t\r " * 50])
    return bytes(out)


def mutate_gzip(rng: random.Random, text: bytes) -> bytes:
    """Damaged JSON gzipped, or damaged gzip: cut members, several members, zero padding, garbage."""
    if rng.random() < 0.5:
        text = mutate(rng, text)
    cut = rng.randrange(len(text) + 1)
    split = rng.random() < 0.5
    members = [gzip.compress(text[:cut]), gzip.compress(text[cut:])] if split else [gzip.compress(text)]
    data = b"".join(members)
    kind = rng.choice(["none", "pad", "cut", "flip", "garbage", "pad_member"])
    if kind == "pad":
        data += b"\x00" * rng.randint(1, 2000)
    elif kind == "cut":
        data = data[: rng.randrange(1, len(data) + 1)]
    elif kind == "flip":
        pos = rng.randrange(len(data))
        data = data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1 :]
    elif kind == "garbage":
        data += rng.choice([b"junk", b"\x1f\x8b", b"\x1f\x8b\x08\x00\x00"])
    elif kind == "pad_member":
        data = members[0] + b"\x00" * 100 + b"".join(members[1:])
    return data


def outcome(path: Path, block: int, to_disk: bool, scratch: Path):
    """What reading gives, comparable across ways of reading: an error message, or sorted spans,
    counts and warnings."""
    jsontrace.BLOCK_BYTES, jsontrace.GUNZIP_TO_DISK = block, 0 if to_disk else 16 << 20
    try:
        result = read_one(path) if not to_disk else _read_to_disk(path, scratch)
    except TraceFormatError as exc:
        return ("error", str(exc))
    problems = span_table.validate(result.spans)
    if problems:
        raise AssertionError(f"invalid spans: {problems}")
    return (result.spans.sort(pl.all(), nulls_last=True), dict(result.skipped), result.warnings,
            result.events_read, result.meta.get("unread_bytes"))


def _read_to_disk(path: Path, scratch: Path):
    from pipebubble.ingest.json import chrome

    return chrome.read(path, 0, None, scratch)


def same(a, b) -> bool:
    if isinstance(a[0], str) or isinstance(b[0], str):
        return a == b
    return a[0].equals(b[0]) and a[1:] == b[1:]


@pytest.mark.fuzz
@pytest.mark.parametrize("fmt", FORMATS)
def test_fuzz_json(tmp_path, fmt):
    rng = random.Random(f"{SEED}-{fmt}")
    bases = seeds()[fmt]
    counts: Counter[str] = Counter()
    failures: list[str] = []
    saved = jsontrace.BLOCK_BYTES, jsontrace.GUNZIP_TO_DISK
    started = time.perf_counter()
    path = tmp_path / ("t.json.gz" if fmt == "gzip" else "t.json")
    try:
        for n in range(EXAMPLES):
            base = rng.choice(bases)
            data = mutate_gzip(rng, base) if fmt == "gzip" else mutate(rng, base)
            path.write_bytes(data)
            try:
                reference = outcome(path, 16 << 20, False, tmp_path / "scratch")
                counts["error" if isinstance(reference[0], str) else "read"] += 1
                small = outcome(path, rng.choice([64, 200, 1000, 4096]), False, tmp_path / "scratch")
                others = [small]
                if fmt == "gzip":
                    others.append(outcome(path, 16 << 20, True, tmp_path / "scratch"))
                if not all(same(reference, o) for o in others):
                    counts["disagreements"] += 1
                    failures.append(f"#{n} disagreement: {_show(reference)} vs {[_show(o) for o in others]}")
                    (tmp_path / f"diff_{n}.bin").write_bytes(data)
            except Exception:  # noqa: BLE001 - any other exception is a crash to report
                counts["crashes"] += 1
                failures.append(f"#{n} crash: {traceback.format_exc(limit=3)}")
                (tmp_path / f"bug_{n}.bin").write_bytes(data)
    finally:
        jsontrace.BLOCK_BYTES, jsontrace.GUNZIP_TO_DISK = saved
    elapsed = time.perf_counter() - started
    print(f"\nfuzz {fmt}: {EXAMPLES} inputs, {counts['read']} read, {counts['error']} TraceFormatError, "
          f"{counts['crashes']} crashes, {counts['disagreements']} disagreements, {elapsed:.1f} s")
    assert not failures, "\n".join(failures[:5]) + f"\n(inputs kept in {tmp_path})"


def _show(result) -> str:
    if isinstance(result[0], str):
        return result[1][-160:]
    return f"{result[0].height} spans, skipped {result[1]}, warnings {[w[-80:] for w in result[2]]}, {result[3:]}"
