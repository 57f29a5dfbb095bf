"""capture.json: what was run and how each rank went, with secret-looking arguments redacted."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from pipebubble.capture.options import CaptureOptions
from pipebubble.errors import CaptureError

METADATA_NAME = "capture.json"
SECRET_WORDS = re.compile(r"key|token|password|passwd|secret", re.IGNORECASE)
REDACTED = "***"


def portable(command: Sequence[str]) -> list[str]:
    # The bundled workloads run under this interpreter; its install path says nothing about the capture.
    return ["python" if arg == sys.executable else arg for arg in command]


def redact(command: Sequence[str]) -> list[str]:
    """The command with the values of secret-looking arguments replaced by ***, for capture.json.

    capture.json is meant to be shared with the traces, and training commands carry API keys and
    tokens: `--api-key V`, `--api-key=V`, `HF_TOKEN=V` (as given to env) and `https://user:V@host`.
    Everything else is kept as typed."""
    redacted, hide_next = [], False
    for arg in command:
        if hide_next and not arg.startswith("--"):
            redacted.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        option, eq, _ = arg.partition("=")
        if option.startswith("--") and SECRET_WORDS.search(option):
            hide_next = not eq
            redacted.append(f"{option}={REDACTED}" if eq else arg)
        elif eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", option) and SECRET_WORDS.search(option):
            redacted.append(f"{option}={REDACTED}")
        else:
            redacted.append(re.sub(r"(://[^/\s:@]+:)[^/\s@]+@", rf"\g<1>{REDACTED}@", arg))
    return redacted


def write_metadata(path: Path, metadata: dict) -> None:
    """Write capture.json whole or not at all (temporary name, then rename)."""
    partial = path.with_name(f".{path.name}.tmp")
    try:
        partial.write_text(json.dumps(metadata, indent=2) + "\n")
        os.replace(partial, path)
    except OSError as exc:
        with suppress(OSError):
            partial.unlink(missing_ok=True)
        raise CaptureError(f"cannot write {path}: {exc.strerror or exc}") from exc


def build_metadata(
    command: Sequence[str], options: CaptureOptions, exit_code: int, statuses: list[dict], about: dict | None
) -> dict:
    """capture.json's content: the (redacted) command, the schedule, and each rank's status."""
    first = statuses[0] if statuses else {}
    return {
        "tool": "pipebubble capture",
        "command": redact(portable(command)),
        "exit_code": exit_code,
        "mode": options.mode,
        "schedule": {"wait": options.wait, "warmup": options.warmup, "active": options.active},
        "record_shapes": options.record_shapes,
        "profile_memory": options.profile_memory,
        "torch": first.get("torch"),
        "world_size": first.get("world_size", len(statuses) or None),
        "python": sys.version.split()[0],
        "ranks": [{k: s.get(k) for k in ("rank", "devices", "optimizer_steps", "trace", "problem")} for s in statuses],
        **({"workload": about} if about else {}),
    }
