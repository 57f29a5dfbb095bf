"""pipebubble as a library: ``analyze`` gives a ``Report`` whose tables are polars DataFrames and which a
notebook shows as the HTML report; ``check`` and ``diff`` give the CI gates' verdicts, truthy when they pass.

Each takes the command line's settings as keyword arguments (``Settings``) and reads the same settings file and
report cache, so its numbers are those of ``pipebubble analyze``. Errors are ``PipebubbleError``: one line that
names the file and what was wrong.

    >>> import pipebubble as pb
    >>> r = pb.analyze("sample_traces/pipeline_1f1b")
    >>> r.stages                                   # polars DataFrame, one row per stage
    >>> pb.check(r, max_bubble=0.05).passed        # False
    >>> pb.diff(r, r).regressions                  # []
"""

from pipebubble.api.gating import Check, Diff, check, diff
from pipebubble.api.reports import Report, analyze
from pipebubble.api.settings import Settings
from pipebubble.errors import PipebubbleError

__all__ = ["Check", "Diff", "PipebubbleError", "Report", "Settings", "analyze", "check", "diff"]
