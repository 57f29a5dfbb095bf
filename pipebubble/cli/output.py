"""Where CLI output goes: stdout or a file, with colour only on a terminal that wants it; notes, warnings
and the reading progress on stderr."""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pipebubble.errors import OutputError, ReaderLeft

if TYPE_CHECKING:  # rich loads only to print to a console (a terminal's report, the reading progress)
    from rich.console import Console

    from pipebubble.render.formats import OutputFormat

#: Names that fit any text format (a log, a CI artifact), and names of what no text format is.
GENERIC_TEXT = (".txt", ".log", ".out")
NOT_TEXT = (".pdf", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp", ".xlsx", ".xls", ".docx", ".doc", ".pptx",
            ".zip", ".gz", ".tar", ".parquet", ".pftrace")


def console_wants_color() -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ


def console(output: Path | None = None, width: int | None = None) -> Console:
    """A console for stdout (plain when piped or NO_COLOR is set) or for a file (always plain)."""
    from rich.console import Console

    if output is not None:
        return Console(file=open(output, "w"), width=width or 120, no_color=True, highlight=False)
    plain = not sys.stdout.isatty() or "NO_COLOR" in os.environ
    return Console(width=width or (120 if plain else None), no_color=plain, highlight=False,
                   force_terminal=None if not plain else False)


def check_output(command: str, fmt: OutputFormat, output: Path | None) -> None:
    """Refuse, before any work, an output name that does not fit the format: `-f json -o out.html`,
    `-o out.pdf`. A name without a suffix, or a plain-text one (.txt, .log), fits every text format."""
    if output is None:
        return
    from pipebubble.render import formats

    name = output.name.lower()
    asks = formats.from_suffix(output, command)
    if asks is not None and asks.name != fmt.name and not (name.endswith(GENERIC_TEXT) and not fmt.binary):
        raise OutputError(output, f"the name asks for {asks.name}, but the output is {fmt.name}; name it "
                          f"{_suffix_hint(fmt)} or drop --format")
    if asks is None and not fmt.binary and name.endswith(NOT_TEXT):
        raise OutputError(output, f"{Path(name).suffix} is not a format of {command}; the output is "
                          f"{fmt.name}: name it {_suffix_hint(fmt)}")


def _suffix_hint(fmt: OutputFormat) -> str:
    return " or ".join(fmt.suffixes) if fmt.suffixes else "without a suffix, or .txt"


def write_text(text: str | bytes, output: Path | None, quiet: bool = False) -> None:
    """Text (or bytes) to stdout, or to ``output``, then `wrote PATH (N KB)` on stderr: a path that cannot be
    written is bad input (exit 2), not a traceback. The file is written whole or not at all."""
    if output is None:
        try:
            sys.stdout.write(text if isinstance(text, str) else text.decode())
            sys.stdout.flush()
        except BrokenPipeError:  # the reader left (`| head`): the command line ends quietly
            raise ReaderLeft from None
        except OSError as exc:  # stdout on a full disk, say
            raise OutputError("<stdout>", exc.strerror or str(exc)) from None
        return
    if isinstance(text, str) and output.name.lower().endswith(NOT_TEXT):  # every command: `check -o out.pdf`
        raise OutputError(output, f"{Path(output.name.lower()).suffix} is not a text format, and this output is "
                          "text: name it .txt, or as its --format")
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
    if not quiet:
        note([f"wrote {output} ({human_bytes(len(data))})"], prefix="")


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def human_bytes(n: float) -> str:
    """`812 bytes`, `41 KB`, `12.3 MB`, `120 MB`, `1.2 GB` (powers of 1024)."""
    units = ["bytes", "KB", "MB", "GB", "TB"]
    while n >= 1024 and len(units) > 1:
        n /= 1024
        units.pop(0)
    unit = units[0]
    return f"{n:.0f} {unit}" if unit in ("bytes", "KB") or n >= 100 else f"{n:.1f} {unit}"


def read_warnings(report, paths: list[Path]) -> list[str]:
    """The warnings of reading ``paths`` now: none when they are one saved report (its warnings were shown
    when it was made, about traces this run does not read)."""
    from pipebubble.report import is_saved_report

    return ([] if len(paths) == 1 and is_saved_report(paths[0]) else list(report.ingest.warnings)) + executor_notes()


def executor_notes() -> list[str]:
    """Where the work ran other than ``--executor`` asked, and why (``executor.notes``: one file on Ray is mapped
    here, a cached report maps nothing); none when no executor was loaded."""
    executor = sys.modules.get("pipebubble.executor")
    return executor.notes() if executor is not None else []


def warn(lines: list[str]) -> None:
    """Warnings go to stderr whatever the output format, so `--format json | jq` and `-o` users see them."""
    for line in lines:
        print(f"pipebubble: warning: {line}", file=sys.stderr)


def note(lines: list[str], prefix: str = "note: ") -> None:
    """What pipebubble did that the user may want to know (`--quiet` is for the caller to honour)."""
    for line in lines:
        print(f"pipebubble: {prefix}{line}", file=sys.stderr, flush=True)


@contextmanager
def progress(paths: list[Path], quiet: bool):
    """Notes on what a folder holds besides traces, then, on a terminal, the reading progress on stderr: bytes
    done of all files with rate and time left, or, for one file, how much of it has been read so far. Yields
    the callback that marks a file done."""
    from pipebubble.ingest import find_traces

    notes: list[str] = []
    files = find_traces(paths, notes)
    if not quiet:
        note(notes)
    if quiet or not sys.stderr.isatty() or not files:
        yield lambda _: None
        return
    with _Reading(files) as reading:
        yield reading.done


class _Reading:
    """A rich progress line over the files' bytes, moved by finished files and, where /proc tells, by how far
    the files still being read have been read (a high-water mark: a file's map goes once it is decoded)."""

    def __init__(self, files: list[Path]) -> None:
        from rich import progress as rp
        from rich.console import Console

        self.sizes = {str(f): _size(f) for f in files}
        self.finished: set[str] = set()
        self.seen: dict[str, int] = {}
        self.moved = 0.0  # when the high-water mark last rose
        self.one = len(files) == 1
        label = f"reading {files[0].name}" if self.one else f"reading {len(files)} traces"
        # One file: its size and, while the figure moves, how much of it has been read; no rate or ETA (when its
        # bytes are read, decoding goes on, and a parallel decode reads its blocks out of sight of /proc).
        columns = ((rp.SpinnerColumn(), rp.TextColumn(label), rp.TextColumn("{task.fields[read]}"),
                    rp.TimeElapsedColumn()) if self.one else
                   (rp.TextColumn(label), rp.BarColumn(), rp.DownloadColumn(), rp.TransferSpeedColumn(),
                    rp.TextColumn("{task.fields[files]}, eta"), rp.TimeRemainingColumn()))
        self.bar = rp.Progress(*columns, console=Console(stderr=True), transient=True)
        self.task = self.bar.add_task("read", total=sum(self.sizes.values()) or None, files=self._files(),
                                      read=self._read_text(0.0))
        self._stop = threading.Event()
        self._probe = threading.Thread(target=self._watch, daemon=True, name="pipebubble-progress")

    def __enter__(self) -> _Reading:
        self.bar.start()
        self._probe.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._probe.join()
        self.bar.stop()

    def done(self, path: str | Path) -> None:
        self.finished.add(str(path))
        self._update({})

    def _files(self) -> str:
        return f"{len(self.finished)}/{len(self.sizes)} files"

    def _read_text(self, now: float) -> str:
        size = sum(self.sizes.values())
        read = sum(self.seen.values())
        live = read and now - self.moved < 2.0
        return f"{human_bytes(read)} of {human_bytes(size)} read" if live else human_bytes(size)

    def _update(self, reading: dict[str, int], now: float = 0.0) -> None:
        for path, n in reading.items():
            if n > self.seen.get(path, 0):
                self.seen[path], self.moved = n, now
        done = sum(size for path, size in self.sizes.items() if path in self.finished)
        # A file being read counts no more than 99% until it is done.
        going = sum(min(n, self.sizes[p] * 99 // 100) for p, n in self.seen.items() if p not in self.finished)
        self.bar.update(self.task, completed=done + going, files=self._files(), read=self._read_text(now))

    def _watch(self) -> None:
        import time

        while not self._stop.wait(0.5):
            self._update(bytes_read([p for p in self.sizes if p not in self.finished]), time.monotonic())


def _size(path: Path) -> int:
    try:
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size
    except OSError:
        return 0


def bytes_read(paths: list[str]) -> dict[str, int]:
    """How far this process and its children have read each of ``paths``, from Linux's /proc (empty
    elsewhere): the offset of a descriptor open on it (a gzip stream), or its pages mapped in (a decoder
    reading a memory map). The decoders need not say; the figure is a lower bound."""
    wanted = {os.path.realpath(p): p for p in paths}
    offsets: dict[str, int] = {}
    mapped: dict[str, int] = {}
    for pid in _family(os.getpid()):
        for fd_path, offset in _offsets(pid, wanted):
            offsets[fd_path] = max(offsets.get(fd_path, 0), offset)
        for map_path, resident in _resident(pid, wanted):
            mapped[map_path] = mapped.get(map_path, 0) + resident
    return {p: max(offsets.get(p, 0), mapped.get(p, 0)) for p in {*offsets, *mapped}}


def _family(pid: int) -> list[int]:
    """``pid`` and its descendants (the pool workers reading files for it)."""
    found, queue = [], [pid]
    while queue:
        pid = queue.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    queue.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            continue
    return found


def _offsets(pid: int, wanted: dict[str, str]) -> list[tuple[str, int]]:
    found = []
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = wanted.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            if target is not None:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    found.append((target, int(f.readline().split()[1])))  # "pos:\t<offset>"
    except (OSError, ValueError, IndexError):
        pass
    return found


def _resident(pid: int, wanted: dict[str, str]) -> list[tuple[str, int]]:
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        if not any(path in maps for path in wanted):
            return []
        with open(f"/proc/{pid}/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found, current = [], None
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            current = wanted.get(head[5].strip()) if len(head) == 6 else None
        elif current is not None and line.startswith("Rss:"):
            found.append((current, int(line.split()[1]) * 1024))
    return found
