"""Pure analyses over the span table: functions of (frame, options) returning frames or dataclasses."""
