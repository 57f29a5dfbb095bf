"""Start-up of pool worker processes, and the memory setting they share with the command's own process.
Imports nothing heavy, so it runs before polars is loaded."""

import ctypes
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


def init(cwd: str | None = None, environ: dict[str, str] | None = None) -> None:
    """A worker's start: the command's working folder and environment as they are when its pool opens
    (a worker forked from a fork server started earlier would otherwise have the server's), on one polars
    thread (workers already run one per core; polars' own thread pool on top of that only adds
    contention)."""
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)
    if cwd is not None:
        os.chdir(cwd)
    os.environ["POLARS_MAX_THREADS"] = "1"
    keep_freed_memory()


def keep_freed_memory() -> None:
    """glibc gives every freed block over 128 KB back to the system at once, so each decoded block's lists
    and texts fault their pages in anew (a third of a big trace's CPU time went to the kernel). Blocks up
    to 32 MB stay in the heap, and up to 256 MB of free heap is kept, for the next block to reuse. Other C
    libraries: nothing to do."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)
