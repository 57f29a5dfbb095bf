"""The local executor: several files are shared between this process and a pool, results in job order, every
job reported done once, errors raised as they are, and no process left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pipebubble import executor
from pipebubble.errors import TraceFormatError
from pipebubble.options import Scale


def where(path: str, position: int, workers: int = 1) -> tuple[str, int, int, int]:
    """A job that says which process ran it (and that it was given one worker)."""
    return path, position, os.getpid(), workers


def surroundings(path: str, position: int, workers: int = 1) -> tuple[str | None, str, int, int]:
    """A job that says what it runs in: a variable of the environment, the working folder, polars' threads."""
    import polars as pl

    return os.environ.get("PIPEBUBBLE_TEST_MARK"), os.getcwd(), pl.thread_pool_size(), os.getpid()


def fails_on_three(path: str, position: int, workers: int = 1) -> int:
    if position == 3:
        raise TraceFormatError(path, "bad trace")
    return position


@pytest.fixture
def jobs(tmp_path) -> list[tuple[str, int]]:
    out = []
    for i in range(9):
        path = tmp_path / f"rank{i}.json"
        path.write_bytes(b"x" * (100 * (i + 1)))
        out.append((str(path), i))
    return out


def test_results_come_back_in_job_order_from_this_process_and_the_pool(jobs):
    done: list[str] = []
    out = executor.each(jobs, where, Scale(workers=2), done.append)
    assert [(p, i) for p, i, _, _ in out] == jobs and all(w == 1 for *_, w in out)
    assert sorted(done) == sorted(p for p, _ in jobs)  # each reported once, in the order they finished
    pids = {pid for *_, pid, _ in out}
    assert os.getpid() in pids and len(pids) == 2  # this process mapped some, the one worker the rest


def test_one_core_or_one_file_runs_here(jobs):
    assert {pid for *_, pid, _ in executor.each(jobs, where, Scale(workers=1))} == {os.getpid()}
    (lone,) = executor.each(jobs[:1], where, Scale(workers=4))
    assert lone[2] == os.getpid() and lone[3] == 4  # a lone file gets every core for its blocks


def test_an_error_in_any_job_is_raised_as_it_is(jobs):
    with pytest.raises(TraceFormatError, match="bad trace"):
        executor.each(jobs, fails_on_three, Scale(workers=2))


def test_no_process_outlives_a_pooled_run(tmp_path):
    """The pool's workers are joined and multiprocessing's resource tracker is stopped with it."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from pipebubble import executor
        from pipebubble.options import Scale
        from test_executor import where
        jobs = [({str(tmp_path)!r}, i) for i in range(4)]
        executor.each(jobs, where, Scale(workers=2))
        children = [p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{{p}}/stat").read()
                    .rsplit(")", 1)[1].split()[1] == str(os.getpid())]
        print(len(children))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"


def test_the_pipebubble_script_runs_as_the_module_so_workers_skip_the_cli(monkeypatch, tmp_path):
    """A run started by the console script names ``pipebubble.__main__`` as its main module, which spawned
    workers skip (else each would import the whole command line interface first)."""
    import types

    from pipebubble import cli

    script = types.ModuleType("__main__")
    script.__file__ = str(tmp_path / "bin" / "pipebubble")
    script.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", script)
    cli._as_module()
    assert script.__spec__.name == "pipebubble.__main__"
    other = types.ModuleType("__main__")
    other.__file__, other.__spec__ = str(tmp_path / "train.py"), None
    monkeypatch.setitem(sys.modules, "__main__", other)
    cli._as_module()
    assert other.__spec__ is None  # anyone else's main module is left as it is


def _children_after(script_body: str, tmp_path) -> list[str]:
    """The lines a script prints, run in a fresh interpreter that can import this module."""
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from pipebubble import executor
        from pipebubble.options import Scale
        from test_executor import surroundings, where
        def children():
            return len([p for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{{p}}/stat").read()
                        .rsplit(")", 1)[1].split()[1] == str(os.getpid())])
    """) + textwrap.dedent(script_body)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


@pytest.mark.skipif(executor._start_method() != "forkserver", reason="no fork server on this platform")
def test_workers_of_a_server_warmed_earlier_see_the_command_as_the_pool_opens(tmp_path):
    """The fork server is started ahead (``warm``), before the command changes its environment and working
    folder; the workers it forks still start in both as they are when the pool opens, on one polars thread,
    and the server is stopped with the pool."""
    folder = tmp_path / "ranks"
    folder.mkdir()
    for i in range(3):
        (folder / f"rank{i}.json").write_text("{}")
    (tmp_path / "elsewhere").mkdir()
    lines = _children_after(f"""
        executor.warm()
        warmed = children()
        os.environ["PIPEBUBBLE_TEST_MARK"] = "set later"
        os.chdir("elsewhere")
        out = executor.each([({str(folder)!r}, i) for i in range(4)], surroundings, Scale(workers=2))
        theirs = [o for o in out if o[3] != os.getpid()]
        print(warmed, len(theirs), *{{(mark, cwd == os.getcwd(), threads) for mark, cwd, threads, _ in theirs}},
              children(), sep="|")
    """, tmp_path)
    warmed, pooled, seen, left = lines[0].split("|")
    assert int(warmed) >= 1  # the server (and the resource tracker) started by warm
    assert int(pooled) >= 1 and seen == "('set later', True, 1)"
    assert left == "0"


def test_only_paths_that_look_like_work_for_a_pool_warm_one(tmp_path, monkeypatch):
    """A folder of two traces or more, or a file that might be decoded in blocks, asks for the fork server
    ahead; a small lone file, a folder of one trace (beside files that are not traces), a name that is not
    there, or a flag does not."""
    from pipebubble import ingest
    from pipebubble.ingest import readers

    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "rank0.json").write_text("{}")
    (tmp_path / "one" / "capture.json").write_text("{}")
    (tmp_path / "one" / ".rank1.json").write_text("{}")
    (tmp_path / "two").mkdir()
    for i in range(2):
        (tmp_path / "two" / f"rank{i}.json").write_text("{}")
    (tmp_path / "small.json").write_text("{}")
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 2048)
    monkeypatch.setattr(readers, "SPLIT_FLOOR_BYTES", 1024)
    asked = {name: ingest.may_need_a_pool(str(tmp_path / name))
             for name in ("one", "two", "small.json", "big.json", "missing")}
    assert asked == {"one": False, "two": True, "small.json": False, "big.json": True, "missing": False}
    assert not ingest.may_need_a_pool("--format")


def test_a_line_that_asks_for_one_process_or_another_executor_warms_no_server(tmp_path, monkeypatch):
    """``--workers 1`` (or ``=1``) maps in this process and ``--executor ray`` elsewhere: neither starts the
    local pool's fork server ahead; the same line with more workers or the local executor does."""
    from pipebubble import cli

    (tmp_path / "two").mkdir()
    for i in range(2):
        (tmp_path / "two" / f"rank{i}.json").write_text("{}")
    started = []
    monkeypatch.setattr(executor, "warm", lambda: started.append(True))
    folder = str(tmp_path / "two")
    lines = {"plain": [], "one": ["--workers", "1"], "one=": ["--workers=1"], "ray": ["--executor", "ray"],
             "two": ["--workers", "2"], "local": ["--executor=local"], "last wins": ["--workers", "1", "--workers=3"]}
    warmed = {}
    for name, flags in lines.items():
        started.clear()
        cli._warm(["analyze", folder, *flags])
        warmed[name] = bool(started)
    assert warmed == {"plain": True, "one": False, "one=": False, "ray": False, "two": True, "local": True,
                      "last wins": True}
