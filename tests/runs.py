"""The command line as a user runs it: ``python -m pipebubble`` in a process of its own (``run_cli``), on the
bundled sample trace (``SAMPLE``) or any other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_traces" / "toy_train"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipebubble", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
