"""pipebubble: how much of every GPU millisecond holds useful work, stage by stage.

The command line is ``pipebubble``; in Python (a notebook, a script) the same analysis is a function call
whose report gives each table as a polars DataFrame::

    >>> import pipebubble as pb
    >>> r = pb.analyze("sample_traces/pipeline_1f1b")   # same settings, cache and numbers as the CLI
    >>> r.stages.select("stage", "utilization")         # a polars DataFrame
    >>> bool(pb.check(r, max_bubble=0.05))              # False: the 1F1B sample's bubble is larger
    >>> pb.diff("baseline.json", r).regressions         # [] when nothing worsened beyond 5 %

``import pipebubble`` loads nothing else (not even ``typing``): the API loads on the first use of a name below,
polars on the first table asked for.
"""

__version__ = "0.1.0"

#: The public names, each loaded from ``pipebubble.api`` on first use (module ``__getattr__``, PEP 562).
__all__ = ["Check", "Diff", "PipebubbleError", "Report", "Settings", "analyze", "check", "diff"]


def __getattr__(name: str) -> object:
    if name in __all__:
        from pipebubble import api

        value = getattr(api, name)
        globals()[name] = value  # the next look-up is a plain attribute
        return value
    raise AttributeError(f"module 'pipebubble' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
