"""Small files mapped a batch at a time give the report their parts give one by one: for pipelines, data
parallel and expert parallel jobs, real per-rank traces, and the files a batch must map alone (spilled,
rankless, a rank twice). And the executor hands small files to the batch function, results in job order."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import shapes
import synth
from conftest import SHARED_TRACES

from pipebubble import executor
from pipebubble.ingest import find_traces, read_file
from pipebubble.options import Options, Scale
from pipebubble.run import mapper, reducer, wire


def reports(paths: list[Path], options: Options = Options()) -> tuple[dict, dict]:
    """The report of ``paths`` from parts mapped one by one, and from parts mapped together."""
    files = find_traces(paths)
    options = replace(options, files=len(files))
    results = [read_file(f, i, use_cache=False) for i, f in enumerate(files)]
    alone = reducer.reduce([mapper.map_spans(r, options) for r in results], options)
    together = mapper.map_together(results, options)
    # Through the bytes a worker sends, as in a run.
    together = wire.decode(wire.encode(together))
    return alone.to_dict(), reducer.reduce(together, options).to_dict()


def assert_same(paths: list[Path], options: Options = Options()) -> dict:
    alone, together = reports(paths, options)
    assert json.dumps(together, sort_keys=True) == json.dumps(alone, sort_keys=True)
    return alone


def test_a_gpipe_pipeline(tmp_path):
    sim = synth.simulate("gpipe", 4, 8, [1_000_000] * 4, [2_000_000] * 4)
    report = assert_same([synth.write_pipeline(tmp_path, sim)])
    assert report["pipeline"] is not None and len(report["stages"]) == 4


def test_data_parallel_with_a_straggler(tmp_path):
    report = assert_same([shapes.data_parallel(tmp_path, [10.0, 10.0, 14.0, 10.0], steps=3)])
    assert report["collectives"] is not None and report["breakdown"]


def test_expert_parallel_all_to_all(tmp_path):
    report = assert_same([shapes.all_to_all(tmp_path, world=4)])
    assert report["collectives"] is not None


@pytest.mark.parametrize("folder", ["pipeline_cpu/gpipe", "pipeline_cpu/1f1b", "pipeline_cpu/interleaved1f1b"])
def test_real_cpu_pipelines(folder):
    path = SHARED_TRACES / folder
    if not path.exists():
        pytest.skip(f"real traces not available ({path} is absent)")
    assert assert_same([path])["pipeline"] is not None


def test_real_recsys_ranks():
    ranks = sorted((SHARED_TRACES / "kineto").glob("recsys_128rank_sampled_rank-*.json.gz"))
    if len(ranks) < 2:
        pytest.skip("real traces not available")
    assert assert_same(ranks)["breakdown"]


def test_a_rank_twice_and_an_empty_file_are_mapped_alone(tmp_path):
    folder = shapes.data_parallel(tmp_path / "dp", [10.0, 12.0, 10.0])
    twice = tmp_path / "twice"
    twice.mkdir()
    for path in folder.iterdir():
        (twice / path.name).write_bytes(path.read_bytes())
    (twice / "again.json").write_bytes((folder / "rank1.json").read_bytes())  # rank 1 again
    (twice / "empty.json").write_text(json.dumps({"traceEvents": []}))
    files = find_traces([twice])
    options = Options(files=len(files))
    results = [read_file(f, i, use_cache=False) for i, f in enumerate(files)]
    assert [mapper._only_rank(r) for r in results] == [1, None, 0, 1, 2]
    parts = mapper.map_together(results, options)
    lanes = [p.lanes["rank"].unique().to_list() for p in parts]
    assert lanes == [[1], [], [0], [1], [2]]  # every file's own lanes, the rank twice included
    assert_same([twice])


def test_files_sharing_a_lane_name_are_mapped_alone(tmp_path):
    """Ranks that differ but lanes named alike (lane names that do not carry the rank) would merge."""
    from dataclasses import replace as with_

    folder = shapes.data_parallel(tmp_path, [10.0, 12.0, 11.0])
    files = find_traces([folder])
    options = Options(files=len(files))
    results = [read_file(f, i, use_cache=False) for i, f in enumerate(files)]
    renamed = [with_(r, spans=r.spans.with_columns(pl.col("lane").str.replace(r"^rank\d+/", ""))) for r in results]
    assert set(renamed[0].spans["lane"]) & set(renamed[1].spans["lane"])  # the same names in both
    together = reducer.reduce(mapper.map_together(renamed, options), options)
    alone = reducer.reduce([mapper.map_spans(r, options) for r in renamed], options)
    assert together.to_dict() == alone.to_dict()
    assert len(together.lanes) == sum(mapper.map_spans(r, options).lanes.height for r in renamed)


def test_a_spilled_file_is_mapped_alone(tmp_path, monkeypatch):
    folder = shapes.data_parallel(tmp_path, [10.0, 12.0])
    files = find_traces([folder])
    options = Options(files=len(files))
    monkeypatch.setenv("PIPEBUBBLE_SPILL_BYTES", "1")
    spilled = read_file(files[0], 0, use_cache=False)
    monkeypatch.delenv("PIPEBUBBLE_SPILL_BYTES")
    assert spilled.meta.get("spill")
    plain = read_file(files[1], 1, use_cache=False)
    assert mapper._only_rank(spilled) is None
    together = reducer.reduce(mapper.map_together([spilled, plain], options), options)
    alone = reducer.reduce([mapper.map_spans(r, options) for r in (spilled, plain)], options)
    assert together.to_dict() == alone.to_dict()


def test_the_summaries_go_with_the_first_file_only(tmp_path):
    folder = shapes.data_parallel(tmp_path, [10.0, 12.0, 11.0])
    files = find_traces([folder])
    options = Options(files=len(files))
    results = [read_file(f, i, use_cache=False) for i, f in enumerate(files)]
    parts = mapper.map_together(results, options)
    assert parts[0].gpu.ops.height and all(p.gpu.ops.is_empty() and p.gpu.delay["count"] == 0 for p in parts[1:])
    assert [sorted({r.rank for r in p.gpu.rows}) for p in parts] == [[0], [1], [2]]
    assert sum(p.comm.calls.height for p in parts) == pl.concat(
        [mapper.map_spans(r, options).comm.calls for r in results]
    ).height


# --- the executor's side: small files in batches ---


def ran(path: str, position: int, workers: int = 1) -> tuple[int, int, str]:
    return position, os.getpid(), "alone"


def ran_together(jobs: list[tuple[str, int]]) -> list[tuple[int, int, str]]:
    return [(position, os.getpid(), f"batch of {len(jobs)}") for _, position in jobs]


def _files(folder: Path, sizes: list[int]) -> list[tuple[str, int]]:
    folder.mkdir(exist_ok=True)
    jobs = []
    for i, size in enumerate(sizes):
        path = folder / f"rank{i}.json"
        path.write_bytes(b" " * size)
        jobs.append((str(path), i))
    return jobs


def test_small_files_are_batched_big_ones_go_alone(tmp_path):
    big = executor.BATCH_FILE_BYTES
    jobs = _files(tmp_path, [big + 1, *([100] * 32), big])
    units = executor._units(jobs, cores=2, batched=True)
    assert units[:2] == [[0], [33]]  # biggest first, alone
    batches = units[2:]
    assert sorted(k for u in batches for k in u) == list(range(1, 33))
    assert {len(u) for u in batches} == {8}  # 32 small files, two batches for each of 2 cores
    assert executor._units(jobs, cores=2, batched=False) == [[k] for k in sorted(range(34), key=lambda k: -(
        os.path.getsize(jobs[k][0])))]


def test_a_batch_holds_at_most_its_bytes(tmp_path, monkeypatch):
    """Small files that are big together (gzipped traces hold ten times their size) go in smaller batches."""
    monkeypatch.setattr(executor, "MAX_BATCH_BYTES", 1_000)
    jobs = _files(tmp_path, [300] * 24)
    units = executor._units(jobs, cores=1, batched=True)
    assert sorted(k for u in units for k in u) == list(range(24))
    assert [len(u) for u in units] == [3] * 8  # 4 would hold 1,200 bytes


def test_batches_come_back_in_job_order(tmp_path):
    jobs = _files(tmp_path, [100 + i for i in range(40)])
    done: list[str] = []
    out = executor.each(jobs, ran, Scale(workers=2), done.append, batch=ran_together)
    assert [position for position, *_ in out] == list(range(40))
    assert {how for *_, how in out} == {"batch of 10"}  # 40 files, 2 cores: two batches each
    assert sorted(done) == sorted(path for path, _ in jobs)
    one_core = executor.each(jobs, ran, Scale(workers=1), batch=ran_together)
    assert [position for position, *_ in one_core] == list(range(40))
    assert {pid for _, pid, _ in one_core} == {os.getpid()}


def test_then_runs_here_on_every_result_as_it_arrives(tmp_path):
    jobs = _files(tmp_path, [100 + i for i in range(20)])
    arrived: list[int] = []

    def then(value):
        arrived.append(value[0])
        return (*value, os.getpid())

    out = executor.each(jobs, ran, Scale(workers=2), batch=ran_together, then=then)
    assert [position for position, *_ in out] == list(range(20)) and sorted(arrived) == list(range(20))
    assert {here for *_, here in out} == {os.getpid()} and len({pid for _, pid, *_ in out}) == 2


def test_a_folder_of_many_ranks_runs_in_batches_to_the_same_report(tmp_path):
    """End to end: 24 data-parallel ranks on 2 cores go in batches of 6 (this process and a worker), and
    give the report that mapping each file alone gives."""
    from pipebubble.run import of_results, run

    folder = shapes.data_parallel(tmp_path, [10.0 + (i % 5) for i in range(24)], steps=2)
    files = find_traces([folder])
    assert len(executor._units([(str(f), i) for i, f in enumerate(files)], 2, True)) == 4
    batched = run([folder], scale=Scale(workers=2, use_cache=False)).to_dict()
    alone = of_results([read_file(f, i, use_cache=False) for i, f in enumerate(files)]).to_dict()
    assert json.dumps(batched, sort_keys=True) == json.dumps(alone, sort_keys=True)
    assert len(batched["ingest"]["files"]) == 24 and batched["collectives"] is not None
