"""The `python` kind: call the job's dotted-path callable with a RunContext and stage the
rows it yields."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from datetime import datetime
from typing import Callable

from backfill_portal.backends import Marker
from backfill_portal.execution.executors.registry import register_executor
from backfill_portal.execution.executors.base import ExecutionContext, ExecutionError, reader


@dataclass
class RunContext:
    """What a python job receives."""

    run_id: str
    partition_key: str
    data_interval_start: datetime
    data_interval_end: datetime
    params: dict
    read: Callable[[str], list[dict]]


def resolve(dotted: str) -> Callable:
    module, _, attr = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ExecutionError(f"cannot import {dotted}: {exc}") from None


@register_executor("python")
def execute_python(ctx: ExecutionContext) -> Marker:
    return ctx.stage_rows(python_rows(ctx))


def python_rows(ctx: ExecutionContext):
    run, definition = ctx.run, ctx.definition
    fn = resolve(definition["callable"])
    spec_columns = [c["name"] for c in run.job.dataset.columns]
    context = RunContext(run_id=run.run_id, partition_key=run.partition_key,
                         data_interval_start=run.data_interval_start, data_interval_end=run.data_interval_end,
                         params=definition.get("params", {}), read=reader(ctx.warehouse, ctx.pins, run))
    seen: set[str] = set()
    for i, row in enumerate(fn(context)):
        if i % 1000 == 0 and ctx.should_stop():
            raise ExecutionError("stopped: the attempt was fenced or the run cancelled")
        if isinstance(row, dict):
            seen.update(row)
            yield tuple(row.get(c) for c in spec_columns)
        else:
            yield tuple(row)
    ctx.record_output_columns(sorted(seen) if seen else spec_columns)
