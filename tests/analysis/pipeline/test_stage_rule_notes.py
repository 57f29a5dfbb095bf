"""A stage rule the user gave (``--stage-by``, ``--stage``) that finds fewer than two stages says so in the
report's notes, and what to try, instead of leaving the pipeline section out without a word."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipebubble.analysis.pipeline.evidence import too_few_stages
from pipebubble.options import Options, PipelineOptions, Scale, StageOptions
from pipebubble.run import run

CPU_PIPELINE = Path(__file__).resolve().parents[3] / "sample_traces" / "pipeline_gpipe"  # CPU ranks: no GPU work


def by(rule: str) -> Options:
    return Options(PipelineOptions(StageOptions(stage_by=rule)))


@pytest.mark.parametrize("stages, names, note", [
    (StageOptions(stage_by="device"), [],
     "--stage-by device found no stages: these traces have no GPU work; try --stage-by rank or thread"),
    (StageOptions(stage_by="stream"), [],
     "--stage-by stream found no stages: these traces have no GPU work; try --stage-by rank or thread"),
    (StageOptions(stage_by="process"), ["rank0/pid7"],
     "--stage-by process found one stage (rank0/pid7): a pipeline needs two; try --stage-by thread"),
    (StageOptions(stage_by="device"), ["rank0/pid7/device0"],
     "--stage-by device found one stage (rank0/pid7/device0): a pipeline needs two; try --stage-by rank or thread"),
    (StageOptions(rules=(("s0", "nothing"),)), [],
     "--stage rules found no stages: a pipeline needs two; each REGEX is matched against the lane ids of the "
     "lanes table"),
])
def test_too_few_stages_of_a_users_rule_say_what_to_try(stages, names, note):
    assert too_few_stages(stages, names) == note


@pytest.mark.parametrize("stages, names", [(StageOptions(), []), (StageOptions(stage_by="rank"), ["rank0", "rank1"])])
def test_stages_the_trace_chose_or_enough_of_them_need_no_note(stages, names):
    assert too_few_stages(stages, names) is None


def test_stage_by_device_on_cpu_ranks_notes_it_and_rank_still_finds_the_pipeline():
    report = run([CPU_PIPELINE], by("device"), Scale(use_cache=False))
    assert report.pipeline is None and not report.stages
    assert "--stage-by device found no stages: these traces have no GPU work; try --stage-by rank or thread" \
        in report.notes
    ranks = run([CPU_PIPELINE], by("rank"), Scale(use_cache=False))
    assert ranks.pipeline is not None and not any("found no stages" in note for note in ranks.notes)
