"""Verification checks: each a class registered here, run against a staged version by
the verification service in a stable order (by `order`, then name). A blocking failure
keeps the version from being published; a warning is recorded and shown.

    @register_check
    class NoFutureRows(VerificationCheck):
        name = "no_future_rows"
        order = 850

        def run(self, ctx: CheckContext):
            ...
            yield self.result(passed, observed={...}, message="...")

The built-ins (in the order they run): row_count_positive, row_count_baseline,
unique_business_key, no_null_business_key (rows.py); declared_schema (schema.py);
inputs_not_rolled_back (inputs.py); measure_vs_source (measure.py); then the catalog's
SQL assertions, which stay data in the catalog and are run by one check class
(assertions.py). Execution's AppConfig imports this package (through verify).
"""
from __future__ import annotations

from backfill_portal.execution.checks.base import Check, CheckContext, VerificationCheck
from backfill_portal.execution.checks.registry import (
    register_check,
    registered_checks,
    registry,
    run_checks,
    unregister_check,
)

__all__ = ["Check", "CheckContext", "VerificationCheck", "register_check", "registered_checks", "registry",
           "run_checks", "unregister_check"]

# The built-in checks register themselves in checks/registry.py on import.
from backfill_portal.execution.checks import assertions, inputs, measure, rows, schema  # noqa: E402,F401
