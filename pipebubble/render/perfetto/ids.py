"""The process and thread ids the export writes into its process and thread track descriptors.

Perfetto keeps one process per process descriptor and one thread per thread descriptor, keyed by pid and tid
(its trace processor takes a second descriptor of one pid or tid for a reused one: a new process or thread). So
each group of the export (a rank, else a process, else a file) gets one pid and each of its CPU threads one tid,
unique in its process: the recorded id where it is one Perfetto can hold (1 to 2³¹ − 1: pid and tid 0 are the
kernel's idle task, and the trace processor reads both as unsigned 32-bit) and no earlier group or thread took
it; else an id of the export's own, counted up from above every recorded one, so it never stands for a real
process or thread. The name a track shows keeps the recorded ids (``thread 123``).
"""

from __future__ import annotations

from collections.abc import Iterable

LIMIT = 2**31  # ProcessDescriptor.pid is int32; trace processor reads tids as uint32


def usable(value: int | None) -> bool:
    return value is not None and 0 < value < LIMIT


class Ids:
    """Hands out pids (unique in the trace) and tids (unique in their process), recorded ones first."""

    def __init__(self, recorded: Iterable[int | None]) -> None:
        self.recorded = {v for v in recorded if usable(v)}
        self.next = max(self.recorded, default=0) + 1
        self.pids: set[int] = set()
        self.tids: dict[int, set[int]] = {}

    def process(self, pids: set[int]) -> int:
        """The pid of a group whose spans name ``pids``: the one it names, else one of the export's own."""
        only = next(iter(pids)) if len(pids) == 1 else None
        pid = only if usable(only) and only not in self.pids else self.own()
        self.pids.add(pid)
        return pid

    def thread(self, pid: int, tid: int | None) -> int:
        """The tid of a thread of process ``pid`` recorded as ``tid``."""
        taken = self.tids.setdefault(pid, set())
        tid = tid if usable(tid) and tid not in taken else self.own()
        taken.add(tid)
        return tid

    def own(self) -> int:
        """An id no recorded pid or tid has, and none given before."""
        while self.next in self.recorded or self.next >= LIMIT:
            self.next = 1 if self.next >= LIMIT else self.next + 1
        self.next += 1
        return self.next - 1
