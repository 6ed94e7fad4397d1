"""The catalog's SQL assertions (a dataset's `checks:`): data, not code. Each is a
SELECT of the rows that violate it; any row returned is a failure, blocking unless the
catalog says `blocking: false`. One check class runs them all, in catalog order."""
from __future__ import annotations

from backfill_portal.execution.checks.registry import register_check
from backfill_portal.execution.checks.base import Check, CheckContext, VerificationCheck


@register_check
class CatalogAssertions(VerificationCheck):
    name = "catalog_assertions"
    order = 800

    def run(self, ctx: CheckContext):
        declared = ctx.dataset.checks or []
        rendered: list[str | Exception] = []
        for custom in declared:
            try:
                rendered.append(ctx.render(custom["sql"]))
            except Exception as exc:
                rendered.append(exc)
        for custom, rows in zip(declared, failing_rows(ctx.warehouse, rendered)):
            blocking = custom.get("blocking", True)
            if isinstance(rows, Exception):
                yield Check(custom["name"], False, blocking=blocking, message=f"could not run: {rows}")
            else:
                yield Check(custom["name"], rows == 0, blocking=blocking, observed={"failing_rows": rows},
                            message="" if rows == 0 else f"{rows} row(s) violate the assertion")


def failing_rows(warehouse, assertions: list[str | Exception]) -> list[int | Exception]:
    """How many rows each assertion's SELECT returns (an Exception stays as it is).

    All of them in one statement, one round trip; if that statement fails, each runs
    alone so that the error is reported against the assertion that caused it."""
    runnable = [(i, sql) for i, sql in enumerate(assertions) if isinstance(sql, str)]
    results: list[int | Exception] = list(assertions)
    if not runnable:
        return results
    try:
        counts = warehouse.query("SELECT " + ", ".join(
            f"(SELECT COUNT(*) FROM ({sql}) AS q{i})" for i, sql in runnable))[0]
        for (i, _), n in zip(runnable, counts):
            results[i] = int(n)
    except Exception:
        for i, sql in runnable:
            try:
                results[i] = int(warehouse.query(f"SELECT COUNT(*) FROM ({sql}) AS q")[0][0])
            except Exception as exc:
                results[i] = exc
    return results
