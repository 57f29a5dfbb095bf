"""Copies the GPU waits on: memcpy time no compute or communication hides (``exposed_copy``).

Worth, per step: the busiest GPU's exposed memory time (``Breakdown.memory_exposed_ns``: copies and memsets
under no compute or communication) times the copies' share of that GPU's memory-operation time (memsets
are not copies), the mean over steps. It is what taking the copies off the GPU's critical path gives back:
all of it where the data stays on the GPU (weights kept resident, a batch built on the device); overlapping
the copies with compute hides at most the compute beside them (``hideable_ns``: the busiest GPU's compute a
step, where that is less).

The copies' direction and host memory are their names' (``HtoD pageable``: Kineto's ``Memcpy HtoD
(Pageable -> Device)``; Nsight names the direction only), over the busiest GPUs' whole windows. The span
table keeps no copy sizes, so no bandwidth is given (``bytes`` null).
"""

from __future__ import annotations

from pipebubble.analysis.findings import framework as fw
from pipebubble.analysis.findings.common import finding, gpu_step, gpus, mean, ms, step_rows
from pipebubble.analysis.findings.per_lane import busiest, by_lane, lanes_of
from pipebubble.report import Report
from pipebubble.report.findings import Finding, Where

#: A share of pageable copies from which the finding says the copies come from pageable memory.
PAGEABLE = 0.5


def findings(report: Report) -> list[Finding]:
    """The exposed-copy finding (none without copies, or where no copy is exposed)."""
    groups = step_rows(report)
    step = gpu_step(groups)
    if step is None or report.host is None:
        return []
    streams = report.host.facts.streams
    copies = by_lane(streams, lambda s: s.kind == "memcpy")
    memory = by_lane(streams, lambda s: s.kind in ("memcpy", "memset"))
    share = {lane: copies[lane] / memory[lane] for lane in copies if memory.get(lane)}
    top = busiest(groups)
    worth = mean([round(b.memory_exposed_ns * share.get(b.lane, 0.0)) for b in top])
    if worth <= 0:
        return []
    lanes = lanes_of(groups)
    directions = _directions([s for s in streams if s.kind == "memcpy" and s.lane in lanes])
    total = sum(d["total_ns"] for d in directions.values())
    pageable = sum(d["total_ns"] for tag, d in directions.items() if tag.endswith("pageable")) / total
    main = max(directions, key=lambda tag: directions[tag]["total_ns"])
    direction = main.split()[0]
    evidence = {
        "memory_exposed_ns": mean([b.memory_exposed_ns for b in top]),
        "copy_share_of_memory_time": {lane: share.get(lane, 0.0) for lane in lanes},
        "by_direction": directions,
        "pageable_share": pageable,
        "hideable_ns": min(worth, mean([b.compute_ns for b in top])),
        "busiest_gpus": lanes,
        "bytes": None,
        "bandwidth": "unknown: the span table keeps no copy sizes",
        "frameworks": fw.seen(report),
    }
    words = _WORDS.get(direction, _WORDS["other"])
    source = f" {_PREPOSITION.get(direction, 'through')} pageable memory" if pageable >= PAGEABLE else ""
    return [finding(
        "exposed_copy",
        f"copies not hidden under compute: {ms(worth)} {step.per_words} on {', '.join(lanes)}, mostly {direction}"
        f"{source} ({directions[main]['total_ns'] / total:.0%} of copy time)",
        Where(gpus=lanes), words[0] + (PAGEABLE_WHY if source else ""), evidence, worth, gpus(report), step,
        _action(direction, directions, fw.framework(report)),
        f"per {step.per}, the busiest GPU's exposed memory time (under no compute or communication) times the copies'"
        f" share of its memory-operation time; mean over {step.per}s. What keeping the data on the GPU gives back;"
        " overlapping the copies hides at most the compute beside them (hideable_ns)",
    )]


def _directions(copies: list) -> dict[str, dict]:
    """Per tag (direction and host memory), the copies' count and time, biggest first."""
    out: dict[str, dict] = {}
    for s in copies:
        d = out.setdefault(s.tag or "other", {"count": 0, "total_ns": 0})
        d["count"] += s.count
        d["total_ns"] += s.total_ns
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["total_ns"]))


def _action(direction: str, directions: dict[str, dict], frameworks: set[str]) -> str:
    """The direction's action; for host-to-device copies the names say are mostly from pinned memory, no
    advice to pin it."""
    action = _WORDS.get(direction, _WORDS["other"])[1]
    pinned = sum(d["total_ns"] for tag, d in directions.items() if tag == "HtoD pinned")
    if direction == "HtoD" and pinned >= PAGEABLE * sum(d["total_ns"] for d in directions.values()):
        action = PINNED_HTOD
    if direction == "DtoD" and "ddp" in frameworks:
        action += "; DDP: gradient_as_bucket_view=True drops the copies between gradients and buckets"
    return action


_PREPOSITION = {"HtoD": "from", "DtoH": "to"}
PINNED_HTOD = ("the copies already come from pinned memory: issue them with non_blocking=True and prefetch the next"
               " batch on a side stream (torch.cuda.Stream, wait_stream) so they overlap compute; weights or tables"
               " copied every step: keep them resident on the GPU")
PAGEABLE_WHY = (": from pageable memory the driver stages each copy through a pinned buffer, at a fraction of the"
                " link's speed and in step with the host, and it cannot overlap compute")

#: direction -> (cause, action)
_WORDS = {
    "HtoD": ("host-to-device copies run while the GPU has nothing else to do",
             "copy from pinned memory (DataLoader(pin_memory=True), tensor.pin_memory()) with"
             " .to(device, non_blocking=True), and prefetch the next batch on a side stream (torch.cuda.Stream,"
             " wait_stream) so the copy overlaps compute; weights or tables copied every step: keep them resident"
             " on the GPU"),
    "DtoH": ("device-to-host copies (results read back in the step) run while the GPU has nothing else to do",
             "read results back less often, into pinned buffers with non_blocking=True, waiting on an event only"
             " where the value is needed"),
    "DtoD": ("device-to-device copies (contiguous(), clone(), cat, buffer copies) run while nothing else does",
             "avoid needless device copies: views instead of .contiguous() and clone(), preallocated outputs"
             " instead of cat, in-place updates"),
    "PtoP": ("peer-to-peer copies between GPUs run while nothing else does",
             "overlap peer copies with compute on a side stream, or move the data with NCCL collectives"),
    "other": ("copies run while the GPU has nothing else to do",
              "overlap copies with compute on a side stream, from pinned memory with non_blocking=True, or keep the"
              " data on the GPU"),
}
