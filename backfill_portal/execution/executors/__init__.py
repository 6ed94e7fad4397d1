"""Executors: turn one run into one staged version in the warehouse, one module per
job kind, each registered under its kind's name (`catalog/kinds.py` says what a kind
needs; this package says how it runs).

    @register_executor("shell")
    def execute_shell(ctx: ExecutionContext) -> Marker:
        return ctx.stage_rows(run_command(ctx.definition["command"]))

Execution's AppConfig imports this package, which imports the built-in kinds' modules
below; the start-up check (`registry_problems`) refuses a kind without an executor and
an executor without a kind.
"""
from __future__ import annotations

from backfill_portal.execution.executors.base import (
    ExecutionContext,
    ExecutionError,
    LazyPins,
    PinnedInputs,
    covered_partitions,
    pin_inputs,
    pins_recorded,
    reader,
    render,
    source_sql,
    source_watermark,
    upstreams_of,
)
from backfill_portal.execution.executors.registry import (
    Executor,
    execute,
    executor_for,
    register_executor,
    registry,
    registry_problems,
    unregister_executor,
)

__all__ = [
    "ExecutionContext", "ExecutionError", "Executor", "LazyPins", "PinnedInputs", "covered_partitions", "execute",
    "executor_for", "pin_inputs", "pins_recorded", "reader", "register_executor", "registry", "registry_problems",
    "render", "source_sql", "source_watermark", "unregister_executor", "upstreams_of",
]

# The built-in kinds register themselves in executors/registry.py on import.
from backfill_portal.execution.executors import dbt, python, side_effect, sql  # noqa: E402,F401
from backfill_portal.execution.executors.side_effect import deliver_side_effect  # noqa: E402,F401
