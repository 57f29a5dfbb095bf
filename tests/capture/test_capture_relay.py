"""The pieces of capture's terminal output on their own: the chatter filter, the progress lines, the start line."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the capture package needs torch")  # (these pieces do not, their package does)

from pipebubble.capture.progress import Lines, describe  # noqa: E402
from pipebubble.capture.relay import LineFilter, is_chatter  # noqa: E402

# What torch 2.13's Kineto and c10 print to fd 1/2 from C++, as seen on a CPU machine and in the logs of GPU ones.
CHATTER = [
    b"USDT:2026-12-01 14:23:09 22109:22109 SyncActivityProfilerHandler.cpp:52] profiler_start\n",
    b"STAGE:2024-03-01 10:00:00 1234:1234 ActivityProfilerController.cpp:314] Completed Stage: Warm Up\n",
    b"WARNING:2024-03-01 10:00:00 1234:1234 CuptiActivityProfiler.cpp:1063] CUPTI initialization failed\n",
    b"[W1201 14:23:21.907000 22378 torch/csrc/autograd/profiler_kineto.cpp:123] Warning: no CUDA\n",
    # the CPU allocator's memory reporter, as a rank of a process group prints it
    b"[rank3]:[W1202 00:49:16.686691979 CPUAllocator.cpp:245] Memory block of unknown size was allocated before "
    b"the profiling started, profiler results will not include the deallocation event\n",
    b"/x/site-packages/torch/profiler/profiler.py:204: UserWarning: Profiler won't be using warmup\n",
]
PROGRAM = [
    b"epoch 1 loss 0.25\n",
    b"[rank0]: Traceback (most recent call last):\n",
    b"W1201 14:32:16.032000 735 torch/distributed/run.py:874] Setting OMP_NUM_THREADS\n",  # torchrun's, kept
    b"/x/train.py:12: UserWarning: lr is high\n",
    b"INFO: using 4 workers\n",
]


def run(chunks: list[bytes]) -> tuple[bytes, list[bytes]]:
    f, out, chatter = LineFilter(), b"", []
    for chunk in chunks:
        passed, found = f.feed(chunk)
        out, chatter = out + passed, chatter + found
    return out + f.close(), chatter


@pytest.mark.parametrize("line", CHATTER)
def test_profiler_lines_are_chatter(line):
    assert is_chatter(line) and run([line]) == (b"", [line])


@pytest.mark.parametrize("line", PROGRAM)
def test_the_programs_lines_pass_untouched(line):
    assert not is_chatter(line) and run([line]) == (line, [])


def test_a_profiler_warnings_source_line_goes_with_it():
    warning = [CHATTER[-1], b"  warn('Profiler won't be using warmup')\n"]
    assert run([b"".join(warning) + b"  indented, the program's\n"]) == (b"  indented, the program's\n", warning)


def test_ranks_profiler_lines_run_together_are_all_chatter_and_so_are_their_newlines():
    # Kineto writes a line and its newline apart; ranks sharing one pipe interleave them (seen with 4 gloo ranks).
    starts = [CHATTER[0].rstrip(b"\n").replace(b"22109", str(pid).encode()) for pid in (1, 2, 3)]
    out, chatter = run([*starts, b"\n", b"\n", b"\n", b"epoch 1\n", b"\n"])
    assert out == b"epoch 1\n\n"  # the program's own empty line is kept
    assert chatter == [line + b"\n" for line in starts]


def test_a_ranks_line_written_between_a_profiler_line_and_its_newline_is_the_programs():
    # Rank 1's traceback lands after rank 0's Kineto line but before that line's newline.
    line = CHATTER[1].rstrip(b"\n")
    out, chatter = run([line, b"Traceback (most recent call last):\n", b"  File \"rank.py\"\n", b"\n"])
    assert out == b"Traceback (most recent call last):\n  File \"rank.py\"\n" and chatter == [CHATTER[1]]
    # its newline still coming first is the usual case, and a header alone may still have its message to come
    assert run([line, b"\n", b"epoch 1\n"]) == (b"epoch 1\n", [CHATTER[1]])
    header = line[: line.index(b"] ") + 2]
    assert run([header, line[len(header):] + b"\n"]) == (b"", [CHATTER[1]])


def test_chatter_written_in_pieces_is_still_caught():
    line = CHATTER[0]
    assert run([line[:2], line[2:30], line[30:]]) == (b"", [line])


def test_a_progress_bar_is_passed_on_as_it_redraws():
    f = LineFilter()
    assert f.feed(b"\r 10%|#") == (b"\r 10%|#", [])
    assert f.feed(b"\r 20%|##") == (b"\r 20%|##", [])  # not held back for a newline


def test_chatter_inside_a_programs_open_line_is_cut_out():
    # The program's `\r` line and Kineto's stderr share one terminal: the line goes on around it.
    out, chatter = run([b"\rstep 1", CHATTER[0], b"\rstep 2\n", b"loss " + CHATTER[0]])
    assert out == b"\rstep 1\rstep 2\nloss " and chatter == [CHATTER[0], CHATTER[0]]


def test_a_partial_line_is_not_lost_at_the_end():
    assert run([b"US"]) == (b"US", [])


def options(**kwargs):
    from pipebubble.capture.options import CaptureOptions

    return CaptureOptions(out=Path("out"), **kwargs)


def state(rank: int, phase: str, world: int = 4) -> dict:
    return {"rank": rank, "world_size": world, "phase": phase}


def test_ranks_that_move_together_share_a_line():
    lines = Lines(options(), start=0.0)
    assert lines.update([state(0, "started"), state(1, "started")], now=1.0) == []  # waits for ranks 2-3
    assert lines.update([state(2, "started"), state(3, "started")], now=1.2) == ["[1.0s] ranks 0-3: profiler started"]


def test_a_rank_behind_is_reported_on_its_own_line():
    lines = Lines(options(), start=0.0)
    lines.update([state(r, "recording") for r in (0, 1, 3)], now=2.0)
    # "profiler started" is not shown: every rank there has gone past it
    assert lines.due(now=3.6) == ["[2.0s] ranks 0-1, 3: recording steps 3-4"]
    assert lines.update([state(2, "recording")], now=4.0) == ["[4.0s] rank 2: recording steps 3-4"]


def test_a_phase_every_rank_has_passed_is_not_shown():
    lines = Lines(options(mode="run"), start=0.0)
    assert lines.update([state(0, "started", world=1)], now=0.5) == ["[0.5s] profiler started, recording the whole run"]
    assert lines.update([state(0, "written", world=1)], now=0.9) == ["[0.9s] trace written"]  # writing: too quick


def test_the_start_line_names_the_job():
    pipeline = {"name": "pipeline", "stages": 4, "schedule": "1f1b", "microbatches": 8, "device": "cpu"}
    assert describe(["python", "-m", "x"], options(), pipeline, "out/") == (
        "capturing 4 ranks of pipeline 1f1b (8 micro-batches, cpu): optimizer steps 3-4, into out/")
    torchrun = ["torchrun", "--nproc-per-node=2", "train.py"]
    assert describe(torchrun, options(mode="run"), None, "t/") == (
        "capturing 2 ranks of `torchrun --nproc-per-node=2 train.py`: the whole run, into t/")
    serve = {"name": "serve", "requests": 3, "chunked_prefill": 0, "device": "cpu", "async": False}
    assert describe([], options(mode="run"), serve, "s/") == (
        "capturing serve (3 requests, whole prompts, cpu): the whole run, into s/")
    assert describe(["python", "t.py"], options(wait=0, warmup=0, active=1), None, "o/") == (
        "capturing `python t.py`: optimizer step 1, into o/")
