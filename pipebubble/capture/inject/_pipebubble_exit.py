"""How a profiled program ended, in the words the runner reports (loaded by the hook).

Standard library only, and no pipebubble import: this runs in the profiled program's interpreter.
"""

import signal
import traceback

LIMIT = 300  # characters of an error line kept


def from_status(status):
    """(exit code, error line or None) of ``sys.exit(status)`` / ``os._exit(status)``."""
    if status is None or isinstance(status, int):
        return status or 0, None
    return 1, first_line(str(status))  # sys.exit("message"): Python prints the message and exits 1


def from_exception(kind, value):
    """(exit code, error line) of an uncaught exception: the line its traceback ends with
    (`ModuleNotFoundError: No module named 'numpy'`); Ctrl-C exits as SIGINT does."""
    code = 128 + int(signal.SIGINT) if issubclass(kind, KeyboardInterrupt) else 1
    lines = traceback.format_exception_only(kind, value)
    # A SyntaxError's lines start with the file and the caret; the first unindented one names the error.
    return code, first_line(next((line for line in lines if not line[:1].isspace()), lines[-1]))


def first_line(text: str) -> str:
    line = (text.strip().splitlines() or [""])[0].strip()
    return line if len(line) <= LIMIT else line[: LIMIT - 1] + "…"
