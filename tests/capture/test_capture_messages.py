"""What `pipebubble capture` says on the terminal: its own lines, the program's output and nothing else; why a run
failed; what is missing, up front. Real captures of tiny CPU scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="capture needs torch")

CLI = "from pipebubble.cli import main; main()"

TRAIN = """
    import sys, time, torch
    print("the program's own line", flush=True)
    print("the program's own error line", file=sys.stderr, flush=True)
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        time.sleep(0.4)  # steps slow enough for each phase to be seen (a phase passed in a blink is not shown)
"""

# Two ranks the way a launcher starts them (RANK/WORLD_SIZE set), without torch.distributed: rank 1 dies
# as a rank does when torch.distributed's object collectives cannot import numpy.
LAUNCHER = """
    import os, subprocess, sys
    ranks = [subprocess.Popen([sys.executable, sys.argv[1]], env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2"})
             for r in range(2)]
    sys.exit(max(p.wait() for p in ranks))
"""
RANK = """
    import os, torch
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if os.environ["RANK"] == "1":
        raise ModuleNotFoundError("No module named 'numpy'")
    for _ in range(5):
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
"""


def write(folder: Path, name: str, body: str) -> str:
    path = folder / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def capture(cwd: Path, *args: str, prelude: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", prelude + CLI, "capture", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("pipebubble: ")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    cwd = tmp_path_factory.mktemp("train")
    write(cwd, "train.py", TRAIN)
    return capture(cwd, "-o", "out", "--", sys.executable, "train.py"), cwd


def test_profiler_chatter_goes_to_the_log_not_the_terminal(trained):
    proc, cwd = trained
    assert proc.returncode == 0, proc.stderr
    assert "USDT" not in proc.stdout + proc.stderr and "profiler_st" not in proc.stdout + proc.stderr
    log = (cwd / "out" / "capture.log").read_text()
    assert "profiler_start" in log and "profiler_stop" in log
    assert ours(proc.stderr)[-1].endswith("the profiler's messages are in out/capture.log")


def test_the_programs_own_output_still_reaches_the_user(trained):
    proc, _ = trained
    assert proc.stdout == "the program's own line\n"
    assert "the program's own error line\n" in proc.stderr


def test_one_line_says_what_is_captured_then_progress_follows(trained):
    proc, _ = trained
    lines = ours(proc.stderr)
    assert lines[0] == "pipebubble: capturing `python train.py`: optimizer steps 3-4, into out/"
    progress = [line.split("] ", 1)[1] for line in lines[1:-1]]
    # "writing the trace" gets a line of its own only when the write outlasts a poll of the rank's state
    # (a loaded machine): the line is there or not, never in another place.
    assert progress in (["profiler started", "recording steps 3-4", "trace written"],
                        ["profiler started", "recording steps 3-4", "writing the trace", "trace written"])
    assert all(line.startswith("pipebubble: [") and "s] " in line for line in lines[1:-1])
    assert lines[-1].startswith("pipebubble: wrote 1 trace (") and " and capture.json to out/" in lines[-1]


def test_quiet_leaves_only_the_programs_output(tmp_path):
    proc = capture(tmp_path, "--quiet", "--out", "out", "--", sys.executable, write(tmp_path, "train.py", TRAIN))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "the program's own error line\n"
    assert (tmp_path / "out" / "rank0.pt.trace.json.gz").exists()  # --out still names the folder


def test_a_crashed_rank_is_named_and_no_schedule_is_advised(tmp_path):
    rank = write(tmp_path, "rank.py", RANK)
    proc = capture(tmp_path, "-o", "out", "--", sys.executable, write(tmp_path, "launch.py", LAUNCHER), rank)
    assert proc.returncode == 1
    assert "pipebubble: warning: rank 1 exited with code 1: ModuleNotFoundError: No module named 'numpy'" in (
        ours(proc.stderr)), proc.stderr
    assert "--wait" not in proc.stderr and "--warmup" not in proc.stderr
    assert "Traceback" in proc.stderr  # the rank's own traceback, as it printed it
    assert (tmp_path / "out" / "rank0.pt.trace.json.gz").exists()


def test_a_crashed_program_says_its_error(tmp_path):
    body = "import torch\nmodel = torch.nn.Linear(2, 2)\nraise RuntimeError('bad batch 7')\n"
    proc = capture(tmp_path, "-o", "out", "--", sys.executable, write(tmp_path, "crash.py", body))
    assert proc.returncode == 1
    assert ours(proc.stderr)[-2:-1] == ["pipebubble: warning: the program exited with code 1: RuntimeError: "
                                        "bad batch 7"], proc.stderr
    assert "--wait" not in proc.stderr


def test_a_program_that_exits_with_a_message_is_quoted(tmp_path):
    body = "import sys, torch\nsys.exit('no data in /data/train')\n"
    proc = capture(tmp_path, "-o", "out", "--", sys.executable, write(tmp_path, "quit.py", body))
    assert proc.returncode == 1
    assert "pipebubble: warning: the program exited with code 1: no data in /data/train" in ours(proc.stderr)


def test_a_failure_before_torch_quotes_the_last_error_line(tmp_path):
    body = "raise ValueError('the config names no model')\n"
    proc = capture(tmp_path, "-o", "out", "--", sys.executable, write(tmp_path, "early.py", body))
    assert proc.returncode == 1
    assert ours(proc.stderr)[-2].endswith("before any process of it reported a profile: ValueError: the config "
                                          "names no model"), proc.stderr


def cuda_present() -> bool:
    import torch

    return torch.cuda.device_count() >= 2


@pytest.mark.skipif(cuda_present(), reason="this machine has the GPUs --device cuda asks for")
@pytest.mark.parametrize("workload", [["--workload", "pipeline", "--stages", "2"], ["--workload", "serve"]])
def test_device_cuda_without_cuda_fails_once_up_front(tmp_path, workload):
    proc = capture(tmp_path, *workload, "--device", "cuda", "-o", "out")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("pipebubble: error: --device cuda: ")
    assert "torch sees 0" in proc.stderr and "--wait" not in proc.stderr
    assert not (tmp_path / "out").exists()  # nothing started


@pytest.mark.parametrize("workload, why", [("pipeline", "recv_object_list"), ("serve", "serve workload")])
def test_missing_numpy_is_named_before_anything_runs(tmp_path, workload, why):
    no_numpy = "import sys; sys.modules['numpy'] = None; "  # what find_spec sees where numpy is not installed
    proc = capture(tmp_path, "--workload", workload, "-o", "out", prelude=no_numpy)
    assert proc.returncode == 2
    assert proc.stderr.startswith("pipebubble: error: numpy is not installed") and why in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "out").exists()


def test_a_program_that_is_not_there_is_one_line(tmp_path):
    proc = capture(tmp_path, "-o", "out", "--", "no-such-program-anywhere")
    assert proc.returncode == 2
    assert proc.stderr == "pipebubble: error: cannot start 'no-such-program-anywhere': not found on PATH\n"


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_on_a_terminal_the_program_still_sees_one(tmp_path):
    import pty

    body = "import sys, torch\nprint('tty', sys.stdout.isatty(), sys.stderr.isatty())\ntorch.ones(2).sum()\n"
    master, slave = pty.openpty()
    command = [sys.executable, "-c", CLI, "capture", "--mode", "run", "-o", "out", "--", sys.executable,
               write(tmp_path, "tty.py", body)]
    proc = subprocess.Popen(command, cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    seen = b""
    while chunk := _read(master):
        seen += chunk
    assert proc.wait(timeout=120) == 0
    text = seen.decode()
    assert "tty True True\r\n" in text and "\r\r\n" not in text  # one newline translation, ours
    assert "USDT" not in text and "pipebubble: wrote 1 trace" in text


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 16)
    except OSError:  # EIO: every end of the terminal is closed
        return b""
