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

from typing import Callable

from backfill_portal.backends import Marker, WarehouseBackend
from backfill_portal.catalog import kinds
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.registry import NotRegistered, Registry
from backfill_portal.execution.executors.base import (
    ExecutionContext,
    ExecutionError,
    LazyPins,
    PinnedInputs,
    covered_partitions,
    pin_inputs,
    reader,
    render,
    source_sql,
    source_watermark,
    upstreams_of,
)
from backfill_portal.execution.models import Run

__all__ = [
    "ExecutionContext", "ExecutionError", "Executor", "LazyPins", "PinnedInputs", "covered_partitions", "execute",
    "executor_for", "pin_inputs", "reader", "register_executor", "registry", "registry_problems", "render",
    "source_sql", "source_watermark", "unregister_executor", "upstreams_of",
]

Executor = Callable[[ExecutionContext], Marker]
registry: Registry[Executor] = Registry("executor")


def register_executor(kind: str) -> Callable[[Executor], Executor]:
    """`@register_executor("sql")` on a function (or a class whose instances are called)
    taking an ExecutionContext and returning the staged version's marker."""

    def register(executor):
        registry.register(kind, executor() if isinstance(executor, type) else executor)
        return executor

    return register


def unregister_executor(kind: str) -> None:
    registry.unregister(kind)


def executor_for(kind: str) -> Executor:
    try:
        return registry.get(kind)
    except NotRegistered:
        raise ExecutionError(f"unknown job kind {kind!r}") from None


def registry_problems() -> list[str]:
    """One line per job kind without an executor and per executor without a kind."""
    known, runnable = set(kinds.kind_names()), set(registry.names())
    return ([f"job kind {k!r} has no executor registered (backfill_portal.execution.executors)"
             for k in kinds.kind_names() if k not in runnable]
            + [f"executor {k!r} is registered for a job kind that does not exist (backfill_portal.catalog.kinds)"
               for k in registry.names() if k not in known])


def execute(run: Run, attempt_no: int, warehouse: WarehouseBackend, *,
            should_stop: Callable[[], bool] = lambda: False) -> Marker:
    """Stage the run's version with its kind's executor; the marker commits with the rows."""
    job = run.job
    spec = spec_for(job.dataset)  # staging ensures its tables, once per process and spec
    pins = pin_inputs(run, warehouse)
    definition = run.code_version.definition
    executor = executor_for(definition.get("kind", job.kind))
    return executor(ExecutionContext(run=run, attempt_no=attempt_no, warehouse=warehouse, pins=pins,
                                     definition=definition, spec=spec, should_stop=should_stop))


# The built-in kinds register themselves on import (after the registry above exists).
from backfill_portal.execution.executors import python, side_effect, sql  # noqa: E402,F401
from backfill_portal.execution.executors.side_effect import deliver_side_effect  # noqa: E402,F401
