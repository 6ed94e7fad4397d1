"""The executors' registry: one executor per job kind, and the run path that picks it.
Kept apart from the package's `__init__` so that the kind modules, which register
themselves here, and the package, which imports them, do not import each other."""
from __future__ import annotations

from typing import Callable

from backfill_portal.backends import Marker, WarehouseBackend
from backfill_portal.catalog import kinds
from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.registry import NotRegistered, Registry
from backfill_portal.execution.executors.base import ExecutionContext, ExecutionError, pin_inputs
from backfill_portal.execution.choices import RunType
from backfill_portal.execution.models import Run

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
    pins = pin_inputs(run, warehouse, first_attempt=attempt_no == 1 and run.run_type != RunType.VERIFICATION)
    definition = run.code_version.definition
    executor = executor_for(definition.get("kind", job.kind))
    return executor(ExecutionContext(run=run, attempt_no=attempt_no, warehouse=warehouse, pins=pins,
                                     definition=definition, spec=spec, should_stop=should_stop))

