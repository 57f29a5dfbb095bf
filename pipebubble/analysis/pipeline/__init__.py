"""A pipeline's analysis: which rank is which stage and which span which micro-batch pass (map side:
``part``), then the stages numbered as one job, their metrics, waits and timeline (reduce side: ``report``,
``summary``)."""
