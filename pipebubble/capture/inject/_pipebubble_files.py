"""What the hook leaves for the runner, written whole or not at all (loaded by the hook).

Every file is written under a hidden temporary name and renamed into place: a trace or status name only
ever holds a whole file. The pid in the temporary names keeps two processes that claim the same rank from
mixing their halves. Standard library only, and no pipebubble import: this runs in the profiled program.
"""

import json
import os


def trace_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank{rank}.pt.trace.json.gz")


def write_trace(export, out: str, rank: int, pid: int, path: str) -> None:
    """Have `export(temporary_path)` write the trace, then rename it to `path`; raises when that fails."""
    _replace_whole(export, os.path.join(out, f".rank{rank}.{pid}.partial.json.gz"), path)


def write_status(status: dict, out: str, rank: int, pid: int) -> None:
    """Write one rank's status for the runner to collect; raises when that fails."""
    _write_json(status, out, rank, pid, "status")


def write_progress(progress: dict, out: str, rank: int, pid: int) -> None:
    """Say how far this rank has got (the runner polls these files to show progress); raises when that fails."""
    _write_json(progress, out, rank, pid, "progress")


def _write_json(value: dict, out: str, rank: int, pid: int, what: str) -> None:
    """``value`` as ``.rank{rank}.{what}.json`` in ``out``, written whole or not at all."""

    def dump(partial: str) -> None:
        with open(partial, "w") as f:
            json.dump(value, f)

    _replace_whole(
        dump, os.path.join(out, f".rank{rank}.{pid}.{what}.tmp"), os.path.join(out, f".rank{rank}.{what}.json")
    )


def _replace_whole(write, partial: str, path: str) -> None:
    try:
        write(partial)
        os.replace(partial, path)
    except Exception:
        _remove(partial)
        raise


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
