"""Where CLI output goes: stdout or a file, with colour only on a terminal that wants it."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pipebubble.errors import OutputError


def console_wants_color() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def console(output: Path | None = None, width: int | None = None) -> Console:
    """A console for stdout (plain when piped or NO_COLOR is set) or for a file (always plain)."""
    if output is not None:
        return Console(file=open(output, "w"), width=width or 120, no_color=True, highlight=False)
    plain = not sys.stdout.isatty() or "NO_COLOR" in os.environ
    return Console(width=width or (120 if plain else None), no_color=plain, highlight=False,
                   force_terminal=None if not plain else False)


def write_text(text: str | bytes, output: Path | None) -> None:
    """Text (or bytes) to stdout, or to ``output``: a path that cannot be written is bad input (exit 2), not a
    traceback. The file is written whole or not at all."""
    if output is None:
        sys.stdout.write(text if isinstance(text, str) else text.decode())
        return
    data = text.encode() if isinstance(text, str) else text
    tmp = output.with_name(f".{output.name}.tmp-{os.getpid()}")
    try:
        if output.is_dir():
            raise IsADirectoryError(21, "is a directory")
        tmp.write_bytes(data)
        os.replace(tmp, output)
    except OSError as exc:
        _remove(tmp)
        raise OutputError(output, exc.strerror or str(exc)) from None


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def read_warnings(report, paths: list[Path]) -> list[str]:
    """The warnings of reading ``paths`` now: none when they are one saved report (its warnings were shown
    when it was made, about traces this run does not read)."""
    from pipebubble.report import is_saved_report

    return [] if len(paths) == 1 and is_saved_report(paths[0]) else list(report.ingest.warnings)


def warn(lines: list[str]) -> None:
    """Warnings go to stderr whatever the output format, so `--format json | jq` and `-o` users see them."""
    for line in lines:
        print(f"pipebubble: warning: {line}", file=sys.stderr)


@contextmanager
def progress(paths: list[Path], quiet: bool):
    """A progress bar over trace files on stderr, when it is a terminal; yields the callback to advance it."""
    if quiet or not sys.stderr.isatty():
        yield lambda _: None
        return
    from pipebubble.ingest import find_traces

    columns = (TextColumn("reading traces"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("read", total=len(find_traces(paths)))
        yield lambda _: bar.advance(task)
