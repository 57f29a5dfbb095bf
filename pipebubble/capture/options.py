"""What a capture is asked for: where its traces go, and which steps of the program the profiler records.

The runner, capture.json (``metadata``) and the progress lines (``progress``) all read these; the profiling
hook in the child gets them as JSON (``runner``'s ``PIPEBUBBLE_CAPTURE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MODES = ("steps", "run")


@dataclass(frozen=True)
class CaptureOptions:
    out: Path
    mode: str = "steps"  # steps: a few optimizer steps after warm-up; run: the whole run
    wait: int = 1
    warmup: int = 1
    active: int = 2
    record_shapes: bool = True  # operators' input shapes and torch's FLOPs counts (with_flops): FLOPs and MFU
    profile_memory: bool = True  # allocator [memory] events (Total Allocated, Bytes, ...)
    only_ranks: bool = False  # profile only processes with RANK set (the command is a launcher)
