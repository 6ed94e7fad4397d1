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
import sqlite3
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import FINGERPRINT_DECIMALS, ColumnSpec, DatasetSpec, Estimate, WarehouseUnavailable
from backfill_portal.backends.sql import SqlWarehouse, _quote

SQLITE_TS_FORMAT = "%Y-%m-%d %H:%M:%S"
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
        rows = self.query("SELECT name, type FROM pragma_table_info(?) ORDER BY cid", (relation,))
        return {name: kind for name, kind in rows}

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
        for batch in self.stream(
            f"""SELECT json_array({values}) AS line FROM {_quote(spec.versions_table)}
            WHERE "_run_id" = ? ORDER BY line""",
            (run_id,),
        ):
            # One line per row, so the digest does not depend on the batch size.
            digest.update("".join([line + "\n" for (line,) in batch]).encode())
        return digest.hexdigest()
