"""Pure analyses over the span table: functions of (frame, options) returning frames or dataclasses.

The per-file analyses (lanes, stage part, serving steps, collectives, GPU breakdown, strips, critical-path
part, requests, memory) share one signature, ``f(spans, options, meta=None, **reads) -> part``, and are
registered in ``analysis.registry.ANALYSES`` (kept in its own module so that importing a polars-free analysis,
such as ``schedules`` or ``whatif``, does not load them all). The reduce side (``job.reduce_job``) takes their
parts. Layering: analyses import ``spans``, ``options``, ``errors`` and ``report`` (the result
dataclasses), never ``render``, ``cli`` or ``run``.
"""
