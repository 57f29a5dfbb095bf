"""Pipeline schedules as action orders, their replay on measured pass times, its calibration and the
what-if rows built on it."""
