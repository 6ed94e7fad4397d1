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


# A check that raises one of these has a bug or a setting it cannot use (a plugin's, a
# tolerance of the wrong kind): running it again gives the same answer, so it is a
# failed blocking result naming the error, not a verification sent back to `staged` for
# ever. Anything else (the warehouse or the database refusing) may pass later: raised.
DETERMINISTIC_ERRORS = (ValueError, TypeError, KeyError, AttributeError, ArithmeticError, LookupError)


def run_checks(run, warehouse) -> list[Check]:
    """Every registered check's results for the run's staged version, in order."""
    ctx = CheckContext(run, warehouse)
    results: list[Check] = []
    for check in registered_checks():
        try:
            results.extend(check.run(ctx))
        except DETERMINISTIC_ERRORS as exc:
            results.append(check.result(False, blocking=True, observed={"error": type(exc).__name__},
                                        message=f"the check could not run: {type(exc).__name__}: {exc}"[:500]))
    return results

