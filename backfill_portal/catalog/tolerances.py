"""How far a dataset's numbers may move before verification and reconciliation say so.

A dataset's `tolerances` (catalog YAML) may set `row_band` (the row count's allowed
relative distance from its baseline), `row_band_blocking` and `measure_rel` (the core
measure's allowed relative distance from the source); these are the defaults, and the
baseline's window, for both the verification checks (execution) and reconciliation.
"""
from __future__ import annotations

# A baseline is the median row count of this many published partitions before one.
BASELINE_WINDOW = 7
DEFAULT_ROW_BAND = 0.5
DEFAULT_MEASURE_REL = 0.001
