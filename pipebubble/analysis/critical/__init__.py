"""The critical path of each step across ranks: the longest dependent chain through stream order, launch →
kernel, a host call's wait on the GPU, a host thread's wait on another thread of its process, each
collective's last arrival and send → recv, whose length is the step's duration (the step as the GPU lives
it); and each rank's share of it (compute, memory, exposed communication, host, waiting).

HolisticTraceAnalysis builds one rank's critical path from its kernels, launches and syncs; across ranks the
links are the ones this project already measures: a collective's members are released by its last arrival
(``collectives.match``), a receive by its send (``p2p.pair``).

Map (one file, ``part.critical_part``): each stream's work as runs that stream order explains, every
communication kernel on its own, the host calls blocked on the GPU and what released them, each host
thread's busy stretches, the steps as the GPU lives them (``idle.steps``); bounded per step
(``part.RUNS_PER_STEP``). Reduce (``path.critical_paths``): the parts on the job's clock
(``CriticalPart.shifted``), walked back from each step's end.
"""

from pipebubble.analysis.critical.part import CriticalPart, critical_part, empty_part
from pipebubble.analysis.critical.path import CriticalPath, PathSegment, PathShare, critical_paths, median_path

__all__ = ["CriticalPart", "CriticalPath", "PathSegment", "PathShare", "critical_part", "critical_paths",
           "empty_part", "median_path"]
