"""The verification checks' registry, and the run of every registered check in order.
Kept apart from the package's `__init__` so that the check modules, which register
themselves here, and the package, which imports them, do not import each other."""
from __future__ import annotations

from backfill_portal.core.registry import Registry
from backfill_portal.execution.checks.base import Check, CheckContext, VerificationCheck

registry: Registry[VerificationCheck] = Registry("verification check")


def register_check(cls: type[VerificationCheck]) -> type[VerificationCheck]:
    registry.register(cls.name, cls())
    return cls


def unregister_check(name: str) -> None:
    registry.unregister(name)


def registered_checks() -> list[VerificationCheck]:
    return sorted(registry, key=lambda c: (c.order, c.name))


def run_checks(run, warehouse) -> list[Check]:
    """Every registered check's results for the run's staged version, in order."""
    ctx = CheckContext(run, warehouse)
    return [result for check in registered_checks() for result in check.run(ctx)]

