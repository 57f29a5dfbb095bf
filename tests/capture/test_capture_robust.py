"""capture under failure: killed captures, half-written files, secrets in the command, crashing children."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="capture needs torch")

from pipebubble.capture import CaptureOptions, capture, metadata, runner  # noqa: E402
from pipebubble.errors import CaptureError  # noqa: E402

CLI = "from pipebubble.cli import main; main()"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", CLI, *args]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody has reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def pid_in(path: Path, proc: subprocess.Popen | None = None) -> int:
    """The pid a child wrote to `path`, once it has (the capture must still be running meanwhile)."""
    assert wait_for(lambda: path.exists() and path.read_text().strip() or (proc and proc.poll() is not None))
    assert proc is None or proc.poll() is None, "the capture ended before its child started"
    return int(path.read_text())


def sleeper(pidfile: Path, seconds: int = 60) -> str:
    return f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); time.sleep({seconds})"


@pytest.fixture
def reap():
    """Kill, at the end of a test, whatever it started that is still running."""
    pids: list[int] = []
    yield pids.append
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@linux_only
def test_sigkilled_capture_takes_its_child_along(tmp_path, reap):
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(cli("capture", "-o", str(tmp_path / "out"), "--", *python(sleeper(pidfile))))
    reap(proc.pid)
    child = pid_in(pidfile, proc)
    reap(child)
    proc.kill()
    proc.wait(timeout=10)
    assert wait_for(lambda: not alive(child), timeout=5), "the child outlived the killed capture"


@linux_only
def test_sigkilled_capture_takes_grandchildren_along(tmp_path, reap):
    # As torchrun does: a Python parent that starts a Python worker and waits for it.
    pidfile = tmp_path / "worker.pid"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {sleeper(pidfile)!r}])"
    proc = subprocess.Popen(cli("capture", "-o", str(tmp_path / "out"), "--", *python(parent)))
    reap(proc.pid)
    worker = pid_in(pidfile, proc)
    reap(worker)
    proc.kill()
    assert wait_for(lambda: not alive(worker), timeout=5), "the worker outlived the killed capture"


@linux_only
def test_a_detached_grandchild_is_left_to_live(tmp_path, reap):
    # A program that starts a helper in a session of its own means it to outlive it: not ours to kill.
    pidfile = tmp_path / "helper.pid"
    parent = f"""
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {sleeper(pidfile)!r}], start_new_session=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while not os.path.exists({str(pidfile)!r}):  # the helper is up: it chose not to die with us
            time.sleep(0.05)
    """
    proc = subprocess.run(cli("capture", "-o", str(tmp_path / "out"), "--", *python(parent)), capture_output=True)
    helper = pid_in(pidfile)
    reap(helper)
    assert proc.returncode == 2  # nothing imported torch: a clean error, and the helper untouched
    time.sleep(0.5)
    assert alive(helper)


def test_sigterm_reaches_the_whole_process_group(tmp_path, reap):
    pidfile = tmp_path / "sleep.pid"
    child = f"""
        import subprocess, time
        sleep = subprocess.Popen(["sleep", "60"])
        open({str(pidfile)!r}, "w").write(str(sleep.pid))
        sleep.wait()
    """
    proc = subprocess.Popen(
        cli("capture", "-o", str(tmp_path / "out"), "--", *python(child)), stderr=subprocess.PIPE, text=True
    )
    reap(proc.pid)
    grandchild = pid_in(pidfile, proc)
    reap(grandchild)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert wait_for(lambda: not alive(grandchild), timeout=5)
    assert "Traceback" not in proc.stderr.read()


def test_a_second_signal_kills_a_program_that_ignores_the_first(tmp_path, reap):
    pidfile = tmp_path / "child.pid"
    child = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + sleeper(pidfile)
    proc = subprocess.Popen(
        cli("capture", "-o", str(tmp_path / "out"), "--", *python(child)), stderr=subprocess.DEVNULL
    )
    reap(proc.pid)
    reap(pid_in(pidfile, proc))
    proc.send_signal(signal.SIGTERM)
    with pytest.raises(subprocess.TimeoutExpired):  # forwarded, ignored: capture keeps waiting
        proc.wait(timeout=0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGKILL


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["train.py", "--api-key", "sk-123", "--epochs", "2"], ["train.py", "--api-key", "***", "--epochs", "2"]),
        (["train.py", "--API_KEY=sk-123", "--lr=0.1"], ["train.py", "--API_KEY=***", "--lr=0.1"]),
        (
            ["x", "--hf-token", "hf_abc", "--db-password=p", "--client-secret", "s"],
            ["x", "--hf-token", "***", "--db-password=***", "--client-secret", "***"],
        ),
        (
            ["env", "WANDB_API_KEY=abc", "HF_TOKEN=t", "OMP_NUM_THREADS=4", "python", "t.py"],
            ["env", "WANDB_API_KEY=***", "HF_TOKEN=***", "OMP_NUM_THREADS=4", "python", "t.py"],
        ),
        (["t.py", "--token", "--verbose"], ["t.py", "--token", "--verbose"]),  # a flag, not a value, follows
        (["t.py", "--data", "https://user:hunter2@host/x"], ["t.py", "--data", "https://user:***@host/x"]),
        (
            ["torchrun", "--nproc-per-node", "2", "t.py", "--epochs", "1"],
            ["torchrun", "--nproc-per-node", "2", "t.py", "--epochs", "1"],
        ),
    ],
)
def test_secrets_are_redacted(command, expected):
    assert metadata.redact(command) == expected


def test_capture_json_holds_no_secret(tmp_path):
    command = python("import sys") + ["--api-key", "sk-live-123", "--password=hunter2", "--epochs", "3"]
    with pytest.raises(CaptureError):  # nothing imported torch; capture.json is written all the same
        capture(command, CaptureOptions(out=tmp_path / "out"))
    text = (tmp_path / "out" / "capture.json").read_text()
    assert "sk-live-123" not in text and "hunter2" not in text
    assert json.loads(text)["command"][-5:] == ["--api-key", "***", "--password=***", "--epochs", "3"]


def test_stale_and_half_written_files_are_cleaned_up(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stale = [".rank0.status.json", ".rank3.partial.json.gz", "rank7.pt.trace.json.gz", ".rank1.5.status.tmp"]
    for name in stale:
        (out / name).write_text("{}")
    # A rank that died mid-write leaves its temporary files: hidden, never a trace name, and removed.
    child = f"""
        import os
        for name in (".rank0.42.partial.json.gz", ".rank0.42.status.tmp"):
            open(os.path.join({str(out)!r}, name), "w").write("half")
        raise SystemExit(1)
    """
    result = capture(python(child), CaptureOptions(out=out))
    assert result.exit_code == 1 and not result.traces
    assert sorted(p.name for p in out.iterdir()) == ["capture.json"]
    assert len(result.warnings) == 1 and result.warnings[0].startswith("the command failed (exit code 1) before")


def test_an_unreadable_status_is_a_warning_not_a_traceback(tmp_path):
    out = tmp_path / "out"
    child = f"""
        import os
        open(os.path.join({str(out)!r}, ".rank0.status.json"), "w").write('{{"rank": 0, "pro')
    """
    with pytest.raises(CaptureError, match=r"\.rank0\.status\.json could not be read"):
        capture(python(child), CaptureOptions(out=out))
    assert sorted(p.name for p in out.iterdir()) == ["capture.json"]


def test_statuses_are_read_in_rank_order(tmp_path):
    for rank in (10, 2, 0):
        status = {"rank": rank, "devices": ["cpu"], "optimizer_steps": 0, "trace": None, "problem": None}
        (tmp_path / f".rank{rank}.status.json").write_text(json.dumps(status))
    statuses, unreadable = runner._collect_statuses(tmp_path)
    assert [s["rank"] for s in statuses] == [0, 2, 10] and not unreadable
    assert not list(tmp_path.iterdir())


def test_a_crashing_child_keeps_its_exit_code(tmp_path):
    result = capture(
        python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), CaptureOptions(out=tmp_path / "out")
    )
    assert result.exit_code == 128 + signal.SIGSEGV
    assert "(killed by SIGSEGV)" in result.warnings[0]


def test_failures_reach_the_user_as_one_line(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    for args in (
        ["-o", str(not_a_folder), "--", sys.executable, "-c", "pass"],
        ["-o", str(tmp_path / "out"), "--", str(tmp_path / "no-such-program")],
    ):
        proc = subprocess.run(cli("capture", *args), capture_output=True, text=True)
        assert proc.returncode == 2
        assert proc.stderr.startswith("pipebubble: error: ") and proc.stderr.count("\n") == 1, proc.stderr


# The hook runs in the profiled program; here its trace writer is driven with a stand-in profiler.


def load_hook():
    path = Path(runner.INJECT_DIR) / "_pipebubble_hook.py"
    spec = importlib.util.spec_from_file_location("_pipebubble_hook_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def session(tmp_path: Path):
    hook = load_hook()
    config = {"out": str(tmp_path), "wait": 0, "warmup": 0, "active": 1, "mode": "run", "record_shapes": False,
              "profile_memory": True}
    return hook._Session(None, config)


def files(folder: Path) -> list[str]:
    """What is in ``folder`` but the rank's progress file (the runner's to remove)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".progress.json"))


def test_a_trace_appears_under_its_name_only_once_whole(tmp_path):
    s = session(tmp_path)

    class Profiler:
        def export_chrome_trace(self, path):
            assert not os.path.exists(s.trace) and Path(path).name.startswith(".")
            Path(path).write_text("whole")

    s._write(Profiler())
    assert s.written and files(tmp_path) == ["rank0.pt.trace.json.gz"]


def test_a_failed_export_is_recorded_not_raised(tmp_path):
    s = session(tmp_path)

    class Profiler:
        def export_chrome_trace(self, path):
            Path(path).write_text("half")
            raise OSError(28, "No space left on device")

    s._write(Profiler())
    assert not s.written and s.problem.startswith("flush_failed: ")
    assert not files(tmp_path)


@linux_only
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_sigkilled_capture_takes_torchrun_workers_along(tmp_path, reap):
    # torchrun puts each worker in a session of its own, out of reach of any process-group signal.
    worker = tmp_path / "worker.py"
    worker.write_text(
        f"import os, time\nopen(os.path.join({str(tmp_path)!r}, os.environ['RANK'] + '.pid'), 'w')"
        ".write(str(os.getpid()))\ntime.sleep(60)\n"
    )
    command = ["torchrun", "--standalone", "--nproc-per-node", "2", str(worker)]  # a free port
    proc = subprocess.Popen(cli("capture", "-o", str(tmp_path / "out"), "--", *command), stderr=subprocess.DEVNULL)
    reap(proc.pid)
    workers = [pid_in(tmp_path / f"{rank}.pid", proc) for rank in range(2)]
    for pid in workers:
        reap(pid)
    proc.kill()
    assert wait_for(lambda: not any(alive(pid) for pid in workers), timeout=10), "torchrun's workers outlived it"
