"""Capture: profile an unmodified script or torchrun job with torch.profiler, and bundled workloads.

torch is imported only by the profiled program (and the bundled workloads), never here; but capture is
pointless without it, so importing this package without torch says so plainly.
"""

from __future__ import annotations

import importlib.util

from pipebubble.errors import CaptureError

if importlib.util.find_spec("torch") is None:
    raise CaptureError("capture needs PyTorch, which is not installed: pip install 'pipebubble[capture]'")

from pipebubble.capture.options import CaptureOptions  # noqa: E402
from pipebubble.capture.runner import CaptureResult, capture  # noqa: E402

__all__ = ["CaptureOptions", "CaptureResult", "capture"]
