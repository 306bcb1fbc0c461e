"""Detection without anyone asking: per-rank signals every interval, a job-wide outlier test
with hysteresis, and the hang verdict (see docs/detection.md)."""
