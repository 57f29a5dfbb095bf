"""Pure analyses over the span table: functions of (frame, options) returning frames or dataclasses.

The per-file analyses (lanes, stage part, serving steps) share one signature,
``f(spans: pl.DataFrame, options: Options, meta: dict | None = None) -> part``, and are registered in
``analysis.registry.ANALYSES`` (kept in its own module so that importing a polars-free analysis, such as
``schedules`` or ``whatif``, does not load them all). The reduce side (``pipeline.report.reduce_stages``)
takes their parts. Layering: analyses import ``spans``, ``options``, ``errors`` and ``report`` (the result
dataclasses), never ``render``, ``cli`` or ``run``.
"""
