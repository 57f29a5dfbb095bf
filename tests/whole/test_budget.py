"""The memory budget is a bound (``pipebubble/budget.py``): every size the work is cut to (decode blocks, decode
processes, spill threshold, window rows, processes mapping files at once) follows from it and shrinks with
it, the model of what each holds stays within it, the command and its pool are sized by it, and a budget
below the least an analysis needs, or one that cannot hold what a trace must read whole, is a one-line
error (exit 2) that says the least it needs. No big trace: the sizes are checked where they are used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebubble import budget
from pipebubble.ingest.json import trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_traces" / "pipeline_1f1b"
ENGINE = ROOT / "sample_traces" / "serve_chunked_prefill"
BUDGETS = [budget.LEAST_BYTES, 300 * 10**6, 512 << 20, 800 * 10**6, 2 * 10**9, 8 << 30]
CORES = 16


@pytest.fixture
def clean(monkeypatch):
    for name in (budget.ENV, budget.SPILL_ENV, budget.WINDOW_ENV, budget.MAPPERS_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def sizes(size: int, mappers: int = 1) -> dict[str, int]:
    with budget.used(size), budget.shared(mappers):
        block = budget.block_bytes(trace.BLOCK_BYTES)
        return {"spill": budget.spill_bytes(), "block": block, "decoders": budget.decoders(CORES, block),
                "rows": budget.rows_per_window(), "mappers": budget.mappers(CORES), "share": budget.share_bytes()}


def test_every_size_shrinks_with_the_budget(clean):
    found = [sizes(size) for size in BUDGETS]
    for name in found[0]:
        values = [f[name] for f in found]
        assert values == sorted(values), (name, values)
        assert values[0] < values[-1], f"{name} follows the budget"
    least = found[0]
    assert least["decoders"] == 1 and least["mappers"] == 1, "the least budget: one process decodes and maps"
    assert least["block"] < trace.BLOCK_BYTES and least["rows"] < budget.MAX_WINDOW_ROWS
    assert found[-1]["decoders"] == CORES and found[-1]["block"] == trace.BLOCK_BYTES


@pytest.mark.parametrize("size", BUDGETS)
def test_what_each_phase_holds_stays_within_the_budget(clean, size):
    """The model: a lone file's decode (this process's block, and each worker's own memory and block), its
    windows, and several files mapped at once (each process's base and a trace held whole at the spill
    threshold, in its share), each within the budget."""
    one = sizes(size)
    helpers = budget.PROCESS_BYTES + budget.POOL_BYTES
    block = budget.BLOCK_FACTOR * one["block"]
    assert helpers + block + (one["decoders"] - 1) * (budget.DECODER_BYTES + block) <= size
    assert helpers + one["rows"] * budget.WINDOW_ROW_BYTES <= size
    many = sizes(size, one["mappers"])
    held = budget.PROCESS_BYTES + many["spill"] * budget.IN_MEMORY_FACTOR
    assert budget.POOL_BYTES + one["mappers"] * held <= size
    assert one["mappers"] * many["share"] + budget.POOL_BYTES <= size


@pytest.mark.parametrize("text", ["100M", "1", "200MiB"])
def test_a_budget_below_the_least_is_refused_saying_the_least(clean, text):
    with pytest.raises(budget.BudgetError) as refused:
        budget.parse(text)
    message = str(refused.value)
    assert f"memory budget {text} is below the least" in message
    least = message.split("--memory-budget ")[1].split()[0]
    assert budget.parse(least) >= budget.LEAST_BYTES, "the least it says is one it takes"
    with pytest.raises(budget.BudgetError), budget.used(budget.LEAST_BYTES - 1):
        pass


def test_the_command_exits_2_below_the_least(clean, capsys, tmp_path):
    from pipebubble import cli

    clean.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(SAMPLE), "--memory-budget", "100M", "--no-cache"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("pipebubble: error: memory budget 100M is below the least an analysis needs")
    clean.setenv(budget.ENV, "100M")  # the environment's budget too
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(SAMPLE), "--no-cache"])
    assert done.value.code == 2 and "memory budget 100M is below the least" in capsys.readouterr().err


def test_the_library_refuses_it_too(clean):
    import pipebubble as pb

    with pytest.raises(budget.BudgetError, match="below the least"):
        pb.analyze(SAMPLE, memory_budget="100M")


def test_a_trace_read_whole_beyond_the_budget_exits_2_saying_the_least_it_needs(clean, capsys, tmp_path):
    """An engine's trace spilled is read whole for its serving parts: where the budget cannot hold that, the
    command says how much would (here every span is made to cost 10 kB, so the least budget cannot)."""
    from pipebubble import cli

    clean.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    clean.setenv(budget.SPILL_ENV, "0")
    clean.setattr(budget, "WHOLE_ROW_BYTES", 10_000)
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(ENGINE), "--memory-budget", budget.size_text(budget.LEAST_BYTES), "--no-cache",
                  "--workers", "1"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1, err
    assert "spans whole, which needs a memory budget of at least" in err
    least = err.split("--memory-budget ")[1].split(";")[0]
    with pytest.raises(SystemExit) as done:
        cli.main(["analyze", str(ENGINE), "--memory-budget", least, "--no-cache", "--workers", "1", "--format",
                  "json", "-q"])
    assert done.value.code == 0 and json.loads(capsys.readouterr().out)["interference"], "the least it said is enough"


def test_a_big_files_decode_pool_is_as_big_as_the_budget_holds(clean, tmp_path):
    """The blocks of one big JSON file are decoded by this process and a pool of as many workers as the budget
    holds (``budget.decoders``): fewer at the least budget than at a big one, which has one per other core."""
    from pipebubble import ingest
    from pipebubble.ingest import readers

    path = ENGINE / "rank0.pt.trace.json.gz"
    clean.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path))
    clean.setattr(readers, "SPLIT_FLOOR_BYTES", 0)
    clean.setattr(trace, "BLOCK_BYTES", 512 << 10)
    asked = []
    real = ingest._pool

    def pool(workers):
        asked.append(workers)
        return real(workers)

    clean.setattr(ingest, "_pool", pool)
    got, expected = {}, []
    for size in (budget.LEAST_BYTES, 8 << 30):
        with budget.used(size):
            expected.append(budget.decoders(4, budget.block_bytes(trace.BLOCK_BYTES)) - 1)
            got[size] = ingest.read_file(path, use_cache=False, workers=4).spans.height
    assert asked == [n for n in expected if n] and expected[0] < expected[1] == 3, (asked, expected)
    assert got[budget.LEAST_BYTES] == got[8 << 30], "the same spans, however many decoded them"


def test_several_files_are_mapped_by_as_many_processes_as_the_budget_holds(clean):
    from pipebubble.options import Scale
    from pipebubble.run import _within_budget

    with budget.used(budget.LEAST_BYTES):
        scale, processes = _within_budget(Scale(workers=8), 4)
    assert processes == 1 and scale.workers == 1
    with budget.used(8 << 30):
        scale, processes = _within_budget(Scale(workers=8), 4)
    assert processes == 4 and scale.workers == 4, "no more than the files"
    assert _within_budget(Scale(workers=8), 1)[1] == 1, "a lone file: this process (its blocks on a pool)"
    with budget.used(budget.LEAST_BYTES), budget.shared(3):
        assert budget.share_bytes() == (budget.LEAST_BYTES - budget.POOL_BYTES) // 3


def test_the_flags_help_says_the_least():
    from pipebubble.cli import flags

    assert f"at least {budget.size_text(budget.LEAST_BYTES)}" in flags.MemoryBudget.__metadata__[0].help
