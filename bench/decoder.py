"""Where a big trace's decode time goes, block by block, and what a native columnar decoder would save.

    python bench/decoder.py [--events 2000000] [--blocks 4]

Takes ``--blocks`` blocks of the events array (as the reader cuts them) from a generated
Kineto-like trace and times, in this process on one thread (median of 3 runs per block):

- ``json.loads`` of the block (the stdlib baseline);
- the typed msgspec decode alone (events to structs: the parse a columnar decoder cannot avoid);
- the same plus the columns built from the structs (what pipebubble's decode does);
- ``polars.read_json`` with the fields' schema (a native columnar decoder that exists today);
- the whole per-block work: decode, columns, span mapping and the Parquet spill part.

The last lines project the whole read when columns came straight out of the parse, at the typed decode's
speed (the structs and the lists built from them gone). Figures vary with the machine; compare ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one block, one core: as in a decode worker

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen import generate  # noqa: E402

HERE = Path(__file__).resolve().parent


def blocks(trace: Path, count: int) -> list[bytes]:
    """``count`` blocks from the middle of the trace's events array, each a JSON array."""
    from pipebubble.ingest.json import blocks as jsonblocks
    from pipebubble.ingest.json import trace as jsontrace

    data = trace.read_bytes()
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    region = memoryview(data)[start : data.rindex(b"]")]
    cuts = jsonblocks._cuts(region, jsontrace.BLOCK_BYTES)
    middle = len(cuts) // 2 - count // 2
    return [jsonblocks._wrapped(region, a, b) for a, b in cuts[max(0, middle) : max(0, middle) + count]]


def timed(fn, block: bytes) -> float:
    runs = []
    for _ in range(3):
        t = time.perf_counter()
        fn(block)
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--trace", type=Path, default=HERE / "_data" / "kineto_{events}.json")
    args = parser.parse_args()
    trace = Path(str(args.trace).format(events=args.events))
    if not trace.exists():
        print(f"generating {trace} ...", flush=True)
        generate(trace, args.events)

    import polars as pl

    from pipebubble.ingest.json import events as jsonevents
    from pipebubble.ingest.json import spans as jsonspans

    schema = {
        "ph": pl.String, "cat": pl.String, "name": pl.String, "pid": pl.Int64, "tid": pl.Int64,
        "ts": pl.Float64, "dur": pl.Float64,
        "args": pl.Struct({"External id": pl.Int64, "correlation": pl.Int64, "name": pl.String}),
    }
    spill = tempfile.mkdtemp()

    def whole(block: bytes) -> None:
        jsonspans.block_spans(jsonevents.decode_block(block).frame, "trace", 0, 0, spill)

    stages = {
        "json.loads": json.loads,
        "msgspec typed decode (structs)": jsonevents._FAST.decode,
        "typed decode + columns": jsonevents._decode_fast,
        "polars read_json (native)": lambda b: pl.read_json(io.BytesIO(b), schema=schema),
        "whole block (+ spans, spill)": whole,
    }
    chosen = blocks(trace, args.blocks)
    mb = sum(len(b) for b in chosen) / 1e6
    seconds, failed = {}, {}
    for name, fn in stages.items():
        try:
            seconds[name] = sum(timed(fn, b) for b in chosen)
        except Exception as exc:  # noqa: BLE001 - a reader that cannot take these events is reported, not timed
            failed[name] = str(exc).splitlines()[0]
    print(f"{len(chosen)} blocks, {mb:.0f} MB, one thread")
    base = seconds["json.loads"]
    for name, s in seconds.items():
        print(f"{name:32s} {1000 * s / len(chosen):7.1f} ms/block {mb / s:7.0f} MB/s {s / base:6.2f}x json.loads")
    for name, why in failed.items():
        print(f"{name:32s} cannot read these events: {why}")
    per_block = seconds["whole block (+ spans, spill)"]
    columns = seconds["typed decode + columns"] - seconds["msgspec typed decode (structs)"]
    native = per_block - columns
    print(f"columns from structs: {columns / per_block:.0%} of a block's work; a decoder writing columns as it "
          f"parses would take the block from {1000 * per_block / len(chosen):.0f} to "
          f"{1000 * native / len(chosen):.0f} ms ({per_block / native:.2f}x faster)")


if __name__ == "__main__":
    main()
