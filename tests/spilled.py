"""What a spilled trace's report is compared with its in-memory one on."""

from __future__ import annotations


def comparable(report: dict) -> dict:
    """A report without what a spilled trace not read whole leaves out (``analysis.job.UNBINNED``): its per-GPU
    timeline, its critical path, why a rank is late (its findings name a late rank from the collectives
    alone), its FLOPs, its GPU annotations, launch queues and launch delays (``analysis.launch.summary.SKIPPED``)
    and the notes that say so."""
    body = {k: v for k, v in report.items() if k not in ("strips", "critical_path", "findings", "gpu_annotations",
                                                         "launch_queue", "launch_delays", "flops")}
    body["notes"] = [n for n in report["notes"] if not n.startswith(("per-GPU timeline, critical path",
                                                                     "GPU annotations, launch queues"))]
    return body
