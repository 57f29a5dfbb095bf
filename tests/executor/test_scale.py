"""The same analysis in this process, in a local process pool and on Ray gives the same report."""

from __future__ import annotations

import pytest
from synth import simulate, write_pipeline

from pipebubble import ingest
from pipebubble.options import Options, Scale
from pipebubble.run import run, wire
from pipebubble.run.mapper import map_spans


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    sim = simulate("1f1b", 6, 12, [10_000, 12_000, 9_000, 15_000, 10_000, 11_000],
                   [20_000, 25_000, 18_000, 30_000, 21_000, 22_000])
    return write_pipeline(tmp_path_factory.mktemp("ranks"), sim)


def test_part_survives_its_bytes(folder):
    result = ingest.load([folder / "rank3.json"], use_cache=False).files[0]
    part = map_spans(result, Options())
    [again] = wire.decode(wire.encode([part]))
    assert again.lanes.equals(part.lanes) and again.stages.work.equals(part.stages.work)
    assert again.stages.names == part.stages.names and again.stages.order == part.stages.order
    assert again.file.skipped == part.file.skipped and again.file.meta == part.file.meta


def test_local_pool_matches_in_process(folder):
    serial = run([folder], Options(), Scale(workers=1, use_cache=False)).to_dict()
    pooled = run([folder], Options(), Scale(workers=2, use_cache=False)).to_dict()  # this process and one worker
    assert pooled == serial
    assert serial["pipeline"]["stages"] == 6 and serial["pipeline"]["microbatches"] == 12


def test_ray_matches_local(folder):
    ray = pytest.importorskip("ray")
    local = run([folder], Options(), Scale(workers=1, use_cache=False)).to_dict()
    try:
        remote = run([folder], Options(), Scale("ray", workers=2, use_cache=False)).to_dict()
    finally:
        ray.shutdown()
    assert remote == local
