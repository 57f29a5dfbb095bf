"""How many polars queries the analysis of a big pipeline job issues: the stage part and the reduce are
passes over all ranks at once (group-bys and joins by rank and stage), not a few small queries per file,
stage or micro-batch, so the count stays near a thousand for 64 stages and does not grow with them. And the
stage part a batch of files gets at once is each file's own.

A query is a ``LazyFrame.collect`` (and each frame of ``pl.collect_all``) or an eager DataFrame operation:
``filter``, ``join``, ``group_by(...).agg``, ``with_columns``, ``sort``, ``unique`` ... all run one query
through ``LazyFrame._collect_eager``, so counting those two entry points counts them all. Reading the files
is not counted (the readers are not the analysis)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
import synth
from queries import counting

from pipebubble import executor
from pipebubble.ingest import find_traces, read_file
from pipebubble.options import Options
from pipebubble.run import mapper, reducer

#: A 64-stage job's analysis (map in a one-worker run's two batches, then the reduce) issues fewer queries
#: than this: 751, some 200 each batch whatever its files (each map analysis a few lazy plans, its
#: unions merged once per level; the idle account and the steps, the arrivals' windows of rootcause with
#: the GPU's idle by cause, the GPU timeline's bins and the critical path's runs) and the reduce's. It was
#: 678 before the idle account, 1,090 with four batches of 16 files and a reduce of 400, 1,500 when each
#: map step ran eagerly, and 11,700 (some 180 a rank file) before the stage part and the reduce were
#: vectorised. The launch part (GPU annotations, launch queues and delays) adds 3 a batch and 2 to the reduce.
LIMIT = 820


def test_the_counter_counts_eager_operations_and_lazy_queries():
    frame = pl.DataFrame({"rank": [0, 0, 1], "start": [3, 1, 2]})
    with counting() as count:
        frame.filter(pl.col("rank") == 0)
        frame.group_by("rank").agg(pl.col("start").min())
        frame.join(frame, on="rank")
        frame.with_columns(end=pl.col("start") + 1).sort("start")
        frame.lazy().select(pl.col("start").sum()).collect()
        pl.collect_all([frame.lazy(), frame.lazy()])
    assert count[0] == 1 + 1 + 1 + 2 + 1 + 2


def job(folder: Path, p: int, m: int = 8) -> list:
    """A 1F1B job of ``p`` slightly unequal stages, read (its files' results, in the job's order)."""
    forward = [100_000 + 1_000 * (s % 4) for s in range(p)]
    synth.write_pipeline(folder, synth.simulate("1f1b", p, m, forward, [2 * f for f in forward]))
    return [read_file(f, i, use_cache=False) for i, f in enumerate(find_traces([folder]))]


def analysed(results: list, batches: list[list[int]]) -> tuple[int, dict]:
    """Queries of the map (``batches`` of files given to ``map_together``) and the reduce, and the report."""
    options = Options(files=len(results))
    with counting() as count:
        parts: list = [None] * len(results)
        for batch in batches:
            for k, part in zip(batch, mapper.map_together([results[k] for k in batch], options), strict=True):
                parts[k] = part
        report = reducer.reduce(parts, options)
    return count[0], report.to_dict()


def test_a_64_stage_pipeline_takes_hundreds_of_queries_not_thousands(tmp_path):
    results = job(tmp_path, 64)
    jobs = [(r.source, k) for k, r in enumerate(results)]
    batches = executor._units(jobs, 1, batched=True)  # as a one-worker run hands them out
    assert len(batches) > 1
    queries, report = analysed(results, batches)
    assert report["pipeline"]["stages"] == 64 and report["pipeline"]["schedule"] == "1f1b"
    assert queries <= LIMIT, f"{queries} polars queries for 64 stages"


def test_the_count_does_not_grow_with_the_stages(tmp_path):
    """All files in one batch: 64 stages take about as many queries as 16 (none per file or stage)."""
    counts = {}
    for p in (16, 64):
        results = job(tmp_path / str(p), p)
        counts[p], report = analysed(results, [list(range(len(results)))])
        assert len(report["stages"]) == p
    assert counts[64] <= counts[16] + 16, counts


# --- the stage part of files mapped together is each file's own ---


def parts_alone_and_together(results: list, options: Options = Options()) -> tuple[list, list]:
    options = replace(options, files=len(results))
    alone = [mapper.map_spans(r, options) for r in results]
    return alone, mapper.map_together(results, options)


def same_stage_parts(alone: list, together: list) -> None:
    for a, b in zip(alone, together, strict=True):
        assert (a.stages is None) == (b.stages is None)
        if a.stages is None:
            continue
        assert (a.stages.names, a.stages.order, a.stages.facts, a.stages.pipeline) == (
            b.stages.names, b.stages.order, b.stages.facts, b.stages.pipeline)
        for x, y in ((a.stages.work, b.stages.work), (a.stages.host, b.stages.host)):
            assert x.schema == y.schema
            assert x.sort(x.columns).equals(y.sort(y.columns))
        assert (a.serving, a.segments) == (b.serving, b.segments)


def write(folder: Path, **kwargs) -> list:
    forward = [10_000, 12_000, 9_000, 11_000]
    synth.write_pipeline(folder, synth.simulate("1f1b", 4, 8, forward, [2 * f for f in forward]), **kwargs)
    return [read_file(f, i, use_cache=False) for i, f in enumerate(find_traces([folder]))]


@pytest.mark.parametrize("kwargs", [{}, {"labels": False, "context": True}, {"labels": False, "p2p": False},
                                    {"spin_before_forward": 2_000}])
def test_stage_parts_of_a_batch_are_each_files_own(tmp_path, kwargs):
    """Labelled, inferred (no labels), no evidence at all (a stage name each, no work) and spinning receives."""
    alone, together = parts_alone_and_together(write(tmp_path, **kwargs))
    same_stage_parts(alone, together)
    assert any(p.stages is not None for p in together)


def test_files_of_different_label_patterns_and_groups_in_one_batch(tmp_path):
    """Ranks whose labels follow different patterns are labelled apart; a rank in a pipeline group takes its
    place in it; a rank without labels among labelled ones infers its passes, as each does alone."""
    groups = [{"ranks": [0, 1, 2, 3], "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP"}]
    results = write(tmp_path / "a", groups=groups)
    gpipe = write(tmp_path / "b", labels=False, context=True)
    renamed = []
    for r in results[:2]:  # ranks 0 and 1 keep torch's labels and their group
        renamed.append(r)
    for r in results[2:]:  # ranks 2 and 3: GPipe's spelling of the same passes, no group
        labels = pl.col("name").str.replace(r"^PP:\d+F(\d+)$", "Forward $1").str.replace(r"^PP:\d+B(\d+)$",
                                                                                          "Backward $1")
        renamed.append(replace(r, spans=r.spans.with_columns(name=labels), meta={**r.meta, "pg_config": None}))
    unlabelled = [replace(r, spans=r.spans.with_columns(rank=pl.lit(10 + k, r.spans.schema["rank"]),
                                                        lane=pl.col("lane").str.replace(r"^rank\d+", f"rank{10 + k}")))
                  for k, r in enumerate(gpipe[:2])]
    batch = renamed + unlabelled
    alone, together = parts_alone_and_together(batch)
    same_stage_parts(alone, together)
    patterns = [p.stages.facts["pattern"] for p in together]
    assert patterns == ["torch_pipelining", "torch_pipelining", "gpipe", "gpipe", None, None]
    assert together[1].stages.pipeline == 0 and together[2].stages.pipeline is None


def test_a_rank_of_two_gpus_is_mapped_alone(tmp_path):
    """A rank holding two GPUs is two stages (by device): its file's stage part is computed on its own. (Two
    of its backward kernels run on the second GPU: its thread launches most of its work on the first.)"""
    results = write(tmp_path)
    moved = (pl.col("name") == "gemm_B") & (pl.col("start").rank("ordinal").over("name") <= 2)
    two = results[0].spans.with_columns(device=pl.when(moved).then(pl.col("device") + 1).otherwise(pl.col("device")))
    batch = [replace(results[0], spans=two), *results[1:]]
    alone, together = parts_alone_and_together(batch)
    same_stage_parts(alone, together)
    assert len(together[0].stages.names) == 2


def test_the_report_of_a_batch_is_the_report_of_its_files_alone(tmp_path):
    results = write(tmp_path, spin_before_forward=2_000)
    options = Options(files=len(results))
    alone = reducer.reduce([mapper.map_spans(r, options) for r in results], options).to_dict()
    together = reducer.reduce(mapper.map_together(results, options), options).to_dict()
    assert json.dumps(together, sort_keys=True) == json.dumps(alone, sort_keys=True)
