"""The scale-out test's job: cheap, but long enough (0.3 s) that a cut link catches an
attempt in the middle."""
from __future__ import annotations

import time

ROWS = 5


def scale_items(context):
    time.sleep(0.3)
    for n in range(ROWS):
        yield {"n": n, "label": f"{context.partition_key}-{n}"}
