"""Shared fixtures: the real traces beside the project (skipped cleanly where they are absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI runs the same examples every time (a failure there reproduces); a local run explores afresh.
settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def shared(*parts: str) -> Path:
    """A path under ../shared/traces, or a skip when that folder is not beside the project."""
    path = SHARED_TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"real traces not available ({path} is absent)")
    return path


def shared_files(folder: str, pattern: str = "*") -> list[Path]:
    """Parametrisation helper: the files, or an empty list (tests then skip through `shared`)."""
    base = SHARED_TRACES / folder
    return sorted(base.glob(pattern)) if base.exists() else []


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own span cache, so no test sees another's (or the user's) cached tables."""
    monkeypatch.setenv("PIPEBUBBLE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    from pipebubble.ingest.cache import folder

    # The cache state of this process (the folder chosen, its warnings) starts afresh for every test too.
    monkeypatch.setattr(folder, "_places", {})
    monkeypatch.setattr(folder, "_warnings", [])
    monkeypatch.delenv("NO_COLOR", raising=False)
    os.environ.setdefault("COLUMNS", "120")
