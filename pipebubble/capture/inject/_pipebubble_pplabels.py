"""Compute-only, per-micro-batch labels for pipelining schedules that lack them.

In torch 2.13 the runtime schedules (interleaved 1F1B, zero bubble) record `PP:{stage}{F|I|B|W}{mb}`
around each compute action (their sends and receives are separate `PP:` actions). The single-stage 1F1B
schedule (and the plain multi-stage base) records nothing per micro-batch, and GPipe's `Forward {mb}` /
`Backward {mb}` ranges also hold the blocking receive, so waiting would look like work. While one of
those schedules runs, the stage's compute calls are wrapped to record the runtime schedules' `PP:` names.
"""

import functools
import sys
import threading

_inside = threading.local()


def install(schedules) -> None:
    stage = sys.modules["torch.distributed.pipelining.stage"]
    for cls in (schedules.Schedule1F1B, schedules.ScheduleGPipe, schedules.PipelineScheduleMulti):
        if "_step_microbatches" in cls.__dict__:
            cls._step_microbatches = _marking(cls.__dict__["_step_microbatches"])
    base = stage._PipelineStageBase
    base.forward_one_chunk = _labelled(base.forward_one_chunk, _forward)
    base.backward_one_chunk = _labelled(base.backward_one_chunk, _backward)
    base.backward_weight_one_chunk = _labelled(base.backward_weight_one_chunk, _weight)


def _forward(args, kwargs) -> str:
    return "F"


def _backward(args, kwargs) -> str:
    # backward_one_chunk(bwd_chunk_id, loss=None, full_backward=True, ...): B is the full backward,
    # I the input-gradient half that zero-bubble schedules split off (torch's own action letters).
    full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
    return "B" if full else "I"


def _weight(args, kwargs) -> str:
    return "W"


def _marking(step):
    @functools.wraps(step)
    def wrapper(*args, **kwargs):
        depth = getattr(_inside, "depth", 0)
        _inside.depth = depth + 1
        try:
            return step(*args, **kwargs)
        finally:
            _inside.depth = depth

    return wrapper


def _labelled(method, letter):
    from torch.profiler import record_function

    @functools.wraps(method)
    def wrapper(self, chunk_id, *args, **kwargs):
        if not getattr(_inside, "depth", 0):
            return method(self, chunk_id, *args, **kwargs)
        with record_function(f"PP:{self.stage_index}{letter(args, kwargs)}{chunk_id}"):
            return method(self, chunk_id, *args, **kwargs)

    return wrapper
