"""FLOPs, bytes and MFU: per operator from the ``flops`` arg or the recorded shapes (``model``), the devices'
peaks (``peaks``), the map side's part (``part``) and the reduce to the report's ``flops`` section
(``summary``)."""

from pipebubble.analysis.flops.part import FlopsPart, flops_part

__all__ = ["FlopsPart", "flops_part"]
