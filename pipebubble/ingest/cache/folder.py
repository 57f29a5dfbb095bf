"""Where the cache lives: its folder, and where work goes instead when it cannot be written.

The cache folder is ``$PIPEBUBBLE_CACHE_DIR``, else ``$XDG_CACHE_HOME/pipebubble``, else
``~/.cache/pipebubble``. Once it proves unusable, work moves to a temporary folder (removed at exit),
then to memory, with one warning. This module holds the process's cache state: the folder chosen for
work and the warnings.
"""

from __future__ import annotations

import atexit
import errno
import os
import shutil
import tempfile
from pathlib import Path

_FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
_NO_ACCESS = (errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EEXIST, errno.ENOENT, errno.EISDIR)
_DISK_TEXTS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "os error 28")

#: Cache folder -> where work goes instead (itself, a temporary folder, or None for memory).
_places: dict[str, Path | None] = {}
_warnings: list[str] = []
_cleanup_registered = False


def directory() -> Path:
    """Where the cache is meant to be (it may not exist yet, or be unusable: see ``work_dir``)."""
    explicit = os.environ.get("PIPEBUBBLE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pipebubble"


# --- where work goes when the cache cannot be written ---


def warnings() -> list[str]:
    """Warnings about the cache in this process (the CLI prints them on stderr)."""
    return list(_warnings)


def is_cache_warning(text: str) -> bool:
    """Whether ``text`` is one of ours: such warnings describe one run, so a cached report drops them."""
    return text.startswith("cache ") and " unusable (" in text


def work_dir() -> Path | None:
    """A writable folder for spilled span tables and gunzipped scratch: the cache, or once it proves
    unusable a temporary folder; None when not even that can be had (then work stays in memory)."""
    home = directory()
    name = str(home)
    if name not in _places:
        reason = _probe(home)
        if reason is None:
            _places[name] = home
        else:
            unusable(home, reason)
    return _places[name]


def _probe(folder: Path) -> str | None:
    """Why ``folder`` cannot hold files (a file in the way, no permission, a full or read-only volume)."""
    if folder.exists() and not folder.is_dir():
        return "not a folder"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return _reason(exc)
    return None


def unusable(folder: Path | None, reason: str) -> None:
    """``folder`` failed to hold work: use the next place (cache, then a temporary folder, then memory).
    The first failure of the cache is warned about, once."""
    home = directory()
    name = str(home)
    current = _places.get(name, home)
    if folder is None or current is None or Path(folder) != current:
        return  # already moved on
    if current == home:
        _places[name] = fallback = _fallback()
        instead = "using a temporary folder" if fallback is not None else "working in memory"
        _warnings.append(f"cache {home} unusable ({reason}); {instead}")
    else:
        _places[name] = None  # the temporary folder failed too: work in memory


def usable() -> bool:
    """Whether the cache itself still takes writes (not yet found unusable in this process)."""
    home = directory()
    return _places.get(str(home), home) == home


def disk_error(exc: BaseException, folder: Path | None) -> str | None:
    """Why ``exc`` is a failure to write into ``folder`` (a full or read-only volume, a path that cannot be
    created there), or None when it is something else: the trace's own problem stays the trace's."""
    if folder is None:
        return None
    if isinstance(exc, OSError):
        if exc.errno in _FULL_DISK:
            return _reason(exc)
        named = isinstance(exc.filename, (str, bytes, os.PathLike))
        inside = named and _is_within(Path(os.fsdecode(exc.filename)), folder)
        return _reason(exc) if exc.errno in _NO_ACCESS and inside else None
    if type(exc).__module__.startswith("polars"):  # polars reports a failed write as ComputeError
        text = str(exc)
        if any(t in text for t in _DISK_TEXTS) or (str(folder) in text and "ermission denied" in text):
            return text.splitlines()[0] if text else type(exc).__name__
    return None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _is_within(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(Path(folder).resolve())
    except (OSError, ValueError):
        return False


def _fallback() -> Path | None:
    """A temporary folder for this run's work, removed at exit. A worker's is named after the main process,
    which removes it too: a worker exits before the main process reads the spill folders it made."""
    try:
        folder = Path(tempfile.mkdtemp(prefix=f"pipebubble-{_main_pid()}-"))
    except OSError:
        return None
    clean_at_exit()
    return folder


def _main_pid() -> int:
    from multiprocessing import parent_process

    parent = parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()


def clean_at_exit() -> None:
    """Remove, at exit, the temporary folders this process (or its workers) fell back to."""
    global _cleanup_registered
    if not _cleanup_registered and _main_pid() == os.getpid():
        _cleanup_registered = True
        atexit.register(_remove_fallbacks, os.getpid())


def _remove_fallbacks(pid: int) -> None:
    for folder in Path(tempfile.gettempdir()).glob(f"pipebubble-{pid}-*"):
        shutil.rmtree(folder, ignore_errors=True)
