"""Parts cross between processes as bytes only: a part mapped in this process is reduced as it is (never
encoded), those mapped in a pool worker cross as ``wire.encode``'s envelope, and both give one report."""

from __future__ import annotations

import json
import os

import shapes

from pipebubble import executor
from pipebubble.options import Scale
from pipebubble.run import run, wire


def made(path: str, position: int, workers: int = 1) -> tuple[int, int]:
    """A job that says which process made it."""
    return position, os.getpid()


def packed(values: list[tuple[int, int]]) -> bytes:
    return json.dumps(values).encode()


def unpacked(blob: bytes) -> list[tuple]:
    return [(*value, "crossed") for value in json.loads(blob)]


def test_only_results_made_in_another_process_cross_the_wire(tmp_path):
    jobs = []
    for i in range(9):
        path = tmp_path / f"rank{i}.json"
        path.write_bytes(b"x" * (100 * (i + 1)))
        jobs.append((str(path), i))
    out = executor.each(jobs, made, Scale(workers=2), wire=(packed, unpacked))
    assert [value[0] for value in out] == list(range(9))
    here = [value for value in out if value[1] == os.getpid()]
    there = [value for value in out if value[1] != os.getpid()]
    assert here and there
    assert all(len(value) == 2 for value in here) and all(value[2] == "crossed" for value in there)


def test_a_run_in_this_process_encodes_no_part_and_reports_as_a_pooled_one(tmp_path, monkeypatch):
    folder = shapes.data_parallel(tmp_path, [10.0 + (i % 5) for i in range(12)], steps=2)
    pooled = run([folder], scale=Scale(workers=2, use_cache=False)).to_dict()

    def refused(parts):
        raise AssertionError("a part mapped in this process was encoded")

    monkeypatch.setattr(wire, "encode", refused)
    here = run([folder], scale=Scale(workers=1, use_cache=False)).to_dict()
    assert json.dumps(here, sort_keys=True) == json.dumps(pooled, sort_keys=True)


def test_every_field_of_a_part_crosses():
    from dataclasses import fields

    from pipebubble.run.mapper import FilePart

    assert set(wire.FIELDS) == {f.name for f in fields(FilePart)} - {"file"}
