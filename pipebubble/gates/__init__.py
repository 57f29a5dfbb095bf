"""CI gates over the JSON report (a dict, so a saved report works as well as a fresh one).

``check`` compares metrics with fixed thresholds; ``diff`` compares two reports metric by metric and calls a
metric regressed (or improved) when it moved the worse (or better) way by more than a tolerance relative to
the baseline's value. Pure functions: no I/O, no printing.

Two reports are matched only by what a second recording of the same job keeps: stage numbers, ranks, GPU
device numbers, the order of a process's threads and the order of waits; never a PID or a TID (every run gets
new ones). A GPU's streams match by number, and those whose numbers differ (CUDA hands a new run other ids)
by their order of first use.

The room: ``specs`` (the gates and how a threshold or tolerance is written), ``check`` (each gate against
one report), ``diff`` (two reports metric by metric), ``ops`` (two reports operator by operator, ``diff --by
op``), ``names`` (the names a lane keeps across recordings) and ``requests`` (the served requests' gates and
percentiles).
"""

from pipebubble.gates.check import METRICS, CheckResult, Gate, check
from pipebubble.gates.diff import Delta, DiffResult, diff, judge
from pipebubble.gates.names import lane_names, paired_names, streams_note
from pipebubble.gates.specs import (
    DEFAULT_TOLERANCE,
    GATES,
    GateSpec,
    parse_fraction,
    parse_threshold,
    parse_tolerance,
    thresholds,
    tolerance,
)

__all__ = [
    "DEFAULT_TOLERANCE", "GATES", "METRICS", "CheckResult", "Delta", "DiffResult", "Gate", "GateSpec", "check",
    "diff", "judge", "lane_names", "paired_names", "parse_fraction", "parse_threshold", "parse_tolerance",
    "streams_note", "thresholds", "tolerance",
]
