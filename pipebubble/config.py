"""Settings from ``pipebubble.toml`` or ``[tool.pipebubble]`` in ``pyproject.toml``; command-line flags win.

    [check]                      # thresholds, named as the flags (max-bubble or max_bubble)
    max-bubble = 0.30
    max-wait-ms = 50
    [diff]
    tolerance = 0.05             # or "5%"
    [stages]                     # any analysis setting, named as analyze's flags
    stage-by = "rank"
    stage = ["embed=rank0", "head=rank3"]
    microbatch-regex = 'PP:(?P<phase>[FB])(?P<mb>\\d+)'

The file is the one given, else the first found from the current directory upward (``pipebubble.toml`` before
a ``pyproject.toml`` that has a ``[tool.pipebubble]`` table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipebubble.errors import ConfigError
from pipebubble.options import SETTINGS

__all__ = ["Config", "ConfigError", "find", "load"]


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    tolerance: float | None = None
    stages: dict[str, Any] = field(default_factory=dict)


def find(start: Path) -> Path | None:
    """The config file that applies in ``start``: nearest directory first."""
    for folder in (start, *start.parents):
        if (folder / "pipebubble.toml").is_file():
            return folder / "pipebubble.toml"
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file() and "pipebubble" in _read(pyproject).get("tool", {}):
            return pyproject
    return None


def load(path: Path | None = None, start: Path | None = None) -> Config:
    """The settings in ``path`` (or the file ``find`` finds from ``start``, default the current directory)."""
    path = path or find((start or Path.cwd()).resolve())
    if path is None:
        return Config()
    table = _read(path)
    if path.name == "pyproject.toml" and "pipebubble" in table.get("tool", {}):
        table = table["tool"]["pipebubble"]
    return _parse(path, table)


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            raise ConfigError("reading pipebubble.toml needs Python 3.11+ or the tomli package") from None
    return tomllib


def _read(path: Path) -> dict[str, Any]:
    tomllib = _toml()
    try:
        with open(path, "rb") as file:
            return tomllib.load(file)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def _parse(path: Path, table: dict[str, Any]) -> Config:
    from pipebubble.gates.specs import GATES, parse_threshold, parse_tolerance  # only a settings file loads them

    _known(path, "", table, {"check", "diff", "stages"})
    check = _keys(table.get("check", {}))
    _known(path, "check.", check, set(GATES))
    diff = _keys(table.get("diff", {}))
    _known(path, "diff.", diff, {"tolerance"})
    stages = _keys(table.get("stages", {}))
    _known(path, "stages.", stages, set(SETTINGS))
    try:
        thresholds = {k: parse_threshold(k, v, f"check.{k.replace('_', '-')}") for k, v in check.items()}
        tolerance = None if "tolerance" not in diff else parse_tolerance(diff["tolerance"], "diff.tolerance")
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return Config(path, thresholds, tolerance, stages)


def _keys(table: dict[str, Any]) -> dict[str, Any]:
    return {key.replace("-", "_"): value for key, value in table.items()}


def _known(path: Path, prefix: str, table: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key {prefix}{unknown[0]} (expected one of "
                          f"{', '.join(prefix + k for k in sorted(known))})")
