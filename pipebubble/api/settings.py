"""The analysis and scale settings of the Python API, named as the command line's flags, and what they become.

``Settings`` holds every setting ``pipebubble analyze`` takes (``--pp-size 4`` is ``pp_size=4``, ``--no-cache``
is ``cache=False``); ``options`` lays them over the ``[stages]`` table of pipebubble.toml as the CLI does
(given settings win) and ``scale`` says where the per-file work runs, so a call and a command line with the
same settings get the same ``Options``, the same report cache entry and the same numbers.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from pipebubble.errors import PipebubbleError
from pipebubble.options import EXECUTORS, STAGE_BY, Options, Scale, merge

PathLike = str | os.PathLike
Paths = PathLike | Iterable[PathLike]
F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Settings:
    """Every analysis and scale setting, as ``pipebubble analyze --help`` describes its flag (None: the
    default, or the settings file's). ``stage`` takes ``"NAME=REGEX"`` texts, or a mapping of name to regex;
    ``memory_limit`` and ``memory_budget`` take bytes or a size such as ``"80GiB"``; ``peak_flops`` and
    ``peak_bandwidth`` a rate per second or a text such as ``"989T"``; ``align=False`` (or
    ``no_align=True``) keeps each rank's recorded clock; ``cache=False`` decodes again, as ``--no-cache``."""

    stage_by: str | None = None
    stage: str | list[str] | Mapping[str, str] | None = None
    pp_size: int | None = None
    rank_order: str | None = None
    microbatch_regex: str | None = None
    wait_threshold: float | None = None
    gpu_cost: float | None = None
    memory_limit: int | str | None = None
    peak_flops: float | str | None = None
    peak_bandwidth: float | str | None = None
    step_regex: str | None = None
    tbt_slo: float | None = None
    align: bool | None = None
    no_align: bool = False
    executor: str = "local"
    ray_address: str | None = None
    workers: int | None = None
    memory_budget: int | str | None = None
    cache: bool = True

    def options(self, config: PathLike | None = None) -> Options:
        """The analysis options: the settings file's ``[stages]`` table with these settings on top."""
        from pipebubble import config as configuration

        _one_of("stage_by", self.stage_by, STAGE_BY)
        if self.no_align and self.align:
            raise PipebubbleError("align=True and no_align=True contradict each other: give one")
        given = {f.name: getattr(self, f.name) for f in fields(self) if f.name in ANALYSIS}
        given["stage"] = _rules(self.stage)
        given["align"] = False if self.no_align else self.align
        table = configuration.load(Path(config) if config is not None else None).stages
        return Options.from_settings(merge(table, **given))

    def scale(self) -> Scale:
        """Where the per-file work runs, and whether the span and report caches are used."""
        from pipebubble import budget

        _one_of("executor", self.executor, EXECUTORS)
        if self.workers is not None and (isinstance(self.workers, bool) or not isinstance(self.workers, int)
                                         or self.workers < 1):
            raise PipebubbleError(f"workers={self.workers!r}: expected a whole number of processes, at least 1")
        size = None if self.memory_budget is None else budget.parse(str(self.memory_budget))
        return Scale(self.executor, self.workers, self.ray_address, use_cache=self.cache, memory_budget=size)


#: The settings that are analysis options (the rest say where and how the work runs).
ANALYSIS = ("stage_by", "stage", "pp_size", "rank_order", "microbatch_regex", "wait_threshold", "gpu_cost",
            "memory_limit", "peak_flops", "peak_bandwidth", "step_regex", "tbt_slo")
NAMES = tuple(f.name for f in fields(Settings))


def settings(given: Mapping[str, Any]) -> Settings:
    """``Settings`` from keyword arguments; a name it does not know is a PipebubbleError with the nearest one."""
    unknown = [name for name in given if name not in NAMES]
    if unknown:
        near = difflib.get_close_matches(unknown[0], NAMES, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (expected one of {', '.join(NAMES)})"
        raise PipebubbleError(f"unknown setting {unknown[0]!r}{hint}")
    return Settings(**given)


def with_settings(func: F) -> F:
    """Show ``func``'s ``**settings`` as the keyword arguments they are (``help()``, a notebook's signature
    pop-up), each with its default."""
    own = [p for p in inspect.signature(func).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
             for f in fields(Settings)]
    func.__signature__ = inspect.Signature([*own, *extra])  # type: ignore[attr-defined]
    return func


def public(func: F) -> F:
    """A function of the API: a PipebubbleError it raises ends its traceback here (a one-line message that
    names the file, not the modules it came through), as ``pipebubble`` on the command line shows it."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PipebubbleError as exc:
            raise exc.with_traceback(None) from None

    return call  # type: ignore[return-value]


def path_list(given: Paths) -> list[Path]:
    """A path, or a list of them, as the list of Paths ``run`` takes; none is a PipebubbleError."""
    found = [Path(given)] if isinstance(given, str | os.PathLike) else [Path(p) for p in given]
    if not found:
        raise PipebubbleError("no paths given: name trace files, folders of per-rank traces or a saved report")
    return found


def _rules(stage: str | list[str] | Mapping[str, str] | None) -> list[str] | None:
    """``stage`` as the CLI's ``--stage NAME=REGEX`` texts, in order."""
    if stage is None or isinstance(stage, str):
        return None if stage is None else [stage]
    if isinstance(stage, Mapping):
        return [f"{name}={regex}" for name, regex in stage.items()]
    return list(stage)


def _one_of(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise PipebubbleError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
