"""The embedded default: the warehouse in one SQLite file beside the metadata database.

Timestamps are stored in UTC as text `YYYY-MM-DD HH:MM:SS` (which sorts and compares
correctly); numbers as REAL (SQLite has no decimal type, so the fingerprint rounds
them); dates as ISO text, booleans as 0/1. Writers take the database's single write
lock at BEGIN (IMMEDIATE) and queue on the busy timeout: that lock is also what
serialises two attempts of one run, so the advisory locks of PostgreSQL are not needed.
"""
from __future__ import annotations

import contextlib
import hashlib
import operator
import re
import sqlite3
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import (
    FINGERPRINT_DECIMALS,
    MAX_DATASET_NAME,
    ColumnSpec,
    DatasetSpec,
    Estimate,
    Marker,
    VersionNumbers,
    WarehouseUnavailable,
    identifier,
)
from backfill_portal.backends.sql import SqlWarehouse, _quote
from backfill_portal.core.errors import ValidationError

SQLITE_TS_FORMAT = "%Y-%m-%d %H:%M:%S"
# How the current table's `_partition` is declared when a partition column holds the key.
_GENERATED_PARTITION = re.compile(r'"_partition" TEXT GENERATED ALWAYS AS \("([^"]+)"\) VIRTUAL')
# The busy timeout: how long a writer queues for the write lock (SQLite's lock timeout).
BUSY_TIMEOUT_SECONDS = 30


@register_backend("sqlite")
class SQLiteWarehouse(SqlWarehouse):
    dialect = "sqlite"
    PHYSICAL_TYPES = {
        "text": "TEXT",
        "integer": "INTEGER",
        "numeric": "REAL",
        "timestamp": "TEXT",
        "date": "TEXT",
        "boolean": "INTEGER",
    }
    # AUTOINCREMENT: history ids never reuse a deleted id.
    SERIAL_PRIMARY_KEY = "INTEGER PRIMARY KEY AUTOINCREMENT"
    NATIVE_VALUES = False
    ENGINE = "SQLite"

    @classmethod
    def target_of(cls, url: str) -> str:
        # As dj-database-url reads them: sqlite:////abs/path, sqlite:///relative/path
        path = unquote(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else ""
        return path or ":memory:"

    def _connect(self, *, timeout: float | None = None, probe: bool = False):
        try:
            if probe and self.target != ":memory:":
                # mode=rw: a missing file is an unavailable warehouse, not a new empty one.
                return sqlite3.connect(f"file:{quote(self.target)}?mode=rw", uri=True,
                                       timeout=BUSY_TIMEOUT_SECONDS if timeout is None else timeout)
            conn = sqlite3.connect(self.target, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA cache_size=-65536")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_SECONDS * 1000}")
            return conn
        except Exception as exc:
            raise WarehouseUnavailable(f"cannot connect to the warehouse: {exc}") from exc

    @contextlib.contextmanager
    def _transaction_block(self, conn):
        """BEGIN IMMEDIATE takes the write lock at once, so two writers queue on the
        busy timeout instead of deadlocking on upgrade."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    # -- values -----------------------------------------------------------------------

    def ts(self, value: datetime) -> str:
        return self._utc(value).strftime(SQLITE_TS_FORMAT)

    def ts_literal(self, value: datetime) -> str:
        return "'" + self._utc(value).strftime(SQLITE_TS_FORMAT) + "'"

    def _from_ts(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc)
        return datetime.strptime(value, SQLITE_TS_FORMAT).replace(tzinfo=timezone.utc)

    # -- the catalog ------------------------------------------------------------------

    def table_exists(self, name: str) -> bool:
        return bool(self.query("SELECT 1 FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,)))

    def _relation_kind(self, name: str) -> str | None:
        rows = self.query("SELECT type FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,))
        return rows[0][0] if rows else None

    def _columns_of(self, relation: str) -> dict[str, str]:
        """The stored columns (pragma table_info leaves generated ones out)."""
        rows = self.query("SELECT name, type FROM pragma_table_info(?) ORDER BY cid", (relation,))
        return {name: kind for name, kind in rows}

    # -- the current table ------------------------------------------------------------

    def _partition_key_of(self, name: str) -> str | None:
        rows = self.query("SELECT sql FROM sqlite_master WHERE name = ? AND type = 'table'", (name,))
        if not rows:
            return None
        if "_partition" in self._columns_of(name):
            return "_partition"
        generated = _GENERATED_PARTITION.search(rows[0][0] or "")
        return generated.group(1) if generated else None

    def _is_reader_table(self, name: str) -> bool:
        return self._partition_key_of(name) is not None

    def _refuse_foreign_relation(self, spec: DatasetSpec) -> None:
        super()._refuse_foreign_relation(spec)
        key = self._partition_key_of(spec.name)
        if key not in (None, "_partition", spec.partition_key_column):
            raise ValidationError(
                f"{spec.name!r} holds its partitions by {key!r} but the catalog names {spec.partition_key_column!r}; "
                "`manage.py upgrade_warehouse_layout` rebuilds it", field="partition_column")

    def read_partition(self, name: str, partition: str) -> list[dict]:
        """The published rows of one partition as readers see them, with the run the
        pointer names as `_run_id` (the current table does not store it per row; an
        earlier wide one does): one statement, so one consistent version."""
        identifier(name, what="dataset", max_length=MAX_DATASET_NAME)
        key = self._partition_key_of(name) or "_partition"
        if "_run_id" in self._columns_of(name):
            return self.query_dicts(f'SELECT * FROM {_quote(name)} WHERE {_quote(key)} = ?', (partition,))
        return self.query_dicts(
            f'SELECT t.*, c."run_id" AS "_run_id" FROM {_quote(name)} AS t JOIN "_bf_current" AS c '
            f'ON c."dataset" = ? AND c."partition" = ? WHERE t.{_quote(key)} = ?', (name, partition, partition))

    # -- the marker's numbers -----------------------------------------------------------

    def _finish_version(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str) -> None:
        """Nothing here: whether every row holds its partition is counted in the
        marker's own aggregate (`_commit_marker`), not in a scan of its own."""

    def _commit_marker(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                       taken: tuple[VersionNumbers, str] | None = None) -> Marker:
        """The numbers and the rows outside their partition in one grouped scan; a row
        outside it is refused (the whole stage rolls back), else the fingerprint."""
        if taken is None:
            if spec.partition_column:
                column = _quote(spec.partition_column)
                row = self.query(self._numbers_statement(spec, run_id, also=f"{column} IS NULL OR {column} <> ?"),
                                 (partition, run_id))[0]
                if row[4]:
                    super()._finish_version(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)  # names the value
                    raise ValidationError(f"{spec.name}.{spec.partition_column}: {row[4]} rows are not in their "
                                          f"partition {partition!r}", field="partition_column")
                numbers = self._to_numbers(row)
            else:
                numbers = self._numbers(spec, run_id)
            taken = (numbers, self._fingerprint(spec, run_id))
        return super()._commit_marker(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition,
                                      taken=taken)

    # -- fingerprint ------------------------------------------------------------------

    def _explain(self, select_sql: str) -> Estimate:
        plan = tuple(str(row[-1]) for row in self.query("EXPLAIN QUERY PLAN " + select_sql))
        return Estimate(engine=self.ENGINE, plan=plan,
                        note="SQLite's planner gives no row or cost estimate; the past runs' durations are the estimate")

    def _fingerprint(self, spec: DatasetSpec, run_id: str) -> str:
        """blake2b over the version's rows in a canonical order.

        SQLite has no hash function. SQLite encodes each normalised row as a JSON array
        and sorts those texts (in C, spilling to disk for a large version); Python only
        streams them into one hash. The alternatives (a Python function called per row,
        per-row quote()/printf text, fetching tuples and hashing them in Python) do more
        of the per-row work in Python and were slower (docs/performance.md). Sorting
        makes insertion order irrelevant; every copy of a row is hashed, so a duplicate changes the result.
        JSON quotes and escapes strings, so NULL, '' and 'a,b' cannot be confused.

        Numbers are compared as whole millionths (round half away from zero), computed
        with plain arithmetic, which is cheap in SQLite where round() is not; values
        beyond 1e12 are kept as they are."""
        scale = 10**FINGERPRINT_DECIMALS

        def normalised(col: ColumnSpec) -> str:
            c = _quote(col.name)
            if col.type != "numeric":
                return c
            return (
                f"CASE WHEN typeof({c}) IN ('integer', 'real') AND abs({c}) < 1e12 "
                f"THEN CAST({c} * {scale}.0 + (CASE WHEN {c} < 0 THEN -0.5 ELSE 0.5 END) AS INTEGER) "
                f"ELSE {c} END"
            )

        values = ", ".join(normalised(c) for c in spec.columns)
        digest = hashlib.blake2b(digest_size=16)
        first = operator.itemgetter(0)
        for batch in self.stream(
            f"""SELECT json_array({values}) AS line FROM {_quote(spec.versions_table)}
            WHERE "_run_id" = ? ORDER BY line""",
            (run_id,),
        ):
            # Each line ends in a newline, so the digest does not depend on the batch
            # size; one join a batch, not a new string a row.
            digest.update(("\n".join(map(first, batch)) + "\n").encode())
        return digest.hexdigest()
