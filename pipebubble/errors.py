"""The error hierarchy. Only ``cli.main`` turns these into exit codes (2 for bad input or output)."""

from __future__ import annotations


class PipebubbleError(Exception):
    """Base class: a one-line message a user can act on."""


class TraceFormatError(PipebubbleError):
    """A trace that cannot be read: the message names the file and what was wrong."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):  # raised in worker processes, so it must survive pickling
        return (type(self), (self.path, self.reason))


class StageSpecError(PipebubbleError):
    """A stage mapping or label rule that does not fit the trace."""


class ConfigError(PipebubbleError):
    """A config file that cannot be read or has keys this version does not know."""


class CaptureError(PipebubbleError):
    """Profiling a command failed before it could produce a trace."""


class OutputError(PipebubbleError):
    """An output path that cannot be written: the message names it and why."""

    def __init__(self, path: object, reason: str) -> None:
        super().__init__(f"{path}: cannot write output: {reason}")
        self.path = path
        self.reason = reason


class ReaderLeft(Exception):  # noqa: N818 - not an error: the reader of stdout went away
    """stdout's reader left before the output was written (``pipebubble analyze ... | head``): exit 0.
    Raised instead of ``BrokenPipeError``, which the command-line framework turns into exit 1."""
