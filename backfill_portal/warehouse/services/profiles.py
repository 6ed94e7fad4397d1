"""The numbers of many versions at once.

A committed version's numbers are in its marker, taken with its rows: reconciling a
2,000-interval request reads markers, a few hundred per query, and scans no version.
Versions whose marker lacks them (written before markers kept them, or counted for
another key or measure than the catalog's now) are counted by grouping on `_run_id`
over those runs, a chunk at a time, so the database does one pass per chunk.
"""
from __future__ import annotations

from collections.abc import Iterable

from backfill_portal.warehouse.adapter import DatasetSpec, VersionNumbers, Warehouse, rounded_measure

CHUNK = 500


def _chunks(items: list[str], size: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _q(name: str) -> str:
    return f'"{name}"'  # names come from a validated DatasetSpec


def profile_statements(spec: DatasetSpec, count: int) -> list[str]:
    """The aggregate statements for `count` run ids (`?` placeholders). Public so the
    benchmark can time exactly the SQL reconciliation needs, bare."""
    table = _q(spec.versions_table)
    keys = [_q(k) for k in spec.business_key]
    marks = ", ".join("?" * count)
    any_null = " OR ".join(f"{k} IS NULL" for k in keys)
    measure = f"SUM({_q(spec.core_measure)})" if spec.core_measure else "NULL"
    if len(keys) == 1:
        # One key column: COUNT(DISTINCT) ignores NULLs, which is what distinct_keys means.
        return [f"""SELECT "_run_id", COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0),
                {measure}, COUNT(DISTINCT {keys[0]})
            FROM {table} WHERE "_run_id" IN ({marks}) GROUP BY "_run_id\""""]
    all_set = " AND ".join(f"{k} IS NOT NULL" for k in keys)
    # A composite key needs DISTINCT over the tuple (a || b would confuse 'ab'+'c' and 'a'+'bc').
    return [
        f"""SELECT "_run_id", COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0), {measure}
            FROM {table} WHERE "_run_id" IN ({marks}) GROUP BY "_run_id\"""",
        f"""SELECT "_run_id", COUNT(*) FROM (
                SELECT DISTINCT "_run_id", {', '.join(keys)} FROM {table}
                WHERE "_run_id" IN ({marks}) AND {all_set}) AS d
            GROUP BY "_run_id\"""",
    ]


def _from_markers(warehouse: Warehouse, spec: DatasetSpec,
                  ids: list[str]) -> tuple[dict[str, VersionNumbers], list[str]]:
    """The numbers the markers hold, and the ids they do not answer for."""
    out: dict[str, VersionNumbers] = {}
    for chunk in _chunks(ids):
        for run_id, marker in warehouse.markers(chunk).items():
            if (numbers := marker.numbers_for(spec)) is not None:
                out[run_id] = numbers
    return out, [r for r in ids if r not in out]


def profile_many(warehouse: Warehouse, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, VersionNumbers]:
    """{run_id: VersionNumbers} for the runs that have rows in `spec`'s versions table."""
    ids = sorted({r for r in run_ids if r})
    if not ids or not warehouse.db.table_exists(spec.versions_table):
        return {}
    out, ids = _from_markers(warehouse, spec, ids)
    for chunk in _chunks(ids):
        statements = profile_statements(spec, len(chunk))
        main = warehouse.db.query(statements[0], chunk)
        distinct = dict(warehouse.db.query(statements[1], chunk)) if len(statements) > 1 else None
        for row in main:
            run_id, rows, null_keys, measure = row[0], int(row[1]), int(row[2] or 0), row[3]
            keys = int(row[4]) if distinct is None else int(distinct.get(run_id, 0))
            out[run_id] = VersionNumbers(row_count=rows, null_keys=null_keys, distinct_keys=keys,
                                         measure_sum=rounded_measure(measure))
    return out


def measure_statement(spec: DatasetSpec, count: int) -> str:
    marks = ", ".join("?" * count)
    return (f'SELECT "_run_id", SUM({_q(spec.core_measure)}) FROM {_q(spec.versions_table)} '
            f'WHERE "_run_id" IN ({marks}) GROUP BY "_run_id"')


def measure_many(warehouse: Warehouse, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, float | None]:
    """{run_id: core-measure sum}; empty when the dataset declares no core measure."""
    ids = sorted({r for r in run_ids if r})
    if not ids or not spec.core_measure or not warehouse.db.table_exists(spec.versions_table):
        return {}
    numbers, ids = _from_markers(warehouse, spec, ids)
    out: dict[str, float | None] = {run_id: n.measure_sum for run_id, n in numbers.items()}
    for chunk in _chunks(ids):
        for run_id, total in warehouse.db.query(measure_statement(spec, len(chunk)), chunk):
            out[run_id] = rounded_measure(total)
    return out


def current_many(warehouse: Warehouse, *, name: str, partitions: list[str]) -> dict[str, str]:
    """Warehouse.current_many, a chunk at a time (SQLite caps bound parameters)."""
    out: dict[str, str] = {}
    for chunk in _chunks(list(dict.fromkeys(partitions))):
        out.update(warehouse.current_many(name, chunk))
    return out
