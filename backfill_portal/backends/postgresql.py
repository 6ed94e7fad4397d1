"""PostgreSQL (14 or newer) through psycopg 3: the warehouse of real deployments.

Timestamps are `timestamptz`, numbers exact `numeric` (the core measure sums the same
whatever the row order), and the fingerprint is computed in the database
(`hash_record_extended`). Writers of one run or one dataset's DDL queue on advisory
locks; sessions get a lock timeout and an idle-in-transaction timeout, so no statement
waits for ever and a frozen client's locks are released by the server.
"""
from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlparse

import psycopg

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import (
    FINGERPRINT_DECIMALS,
    DatasetSpec,
    VersionNumbers,
    WarehouseLockTimeout,
    WarehouseUnavailable,
)
from backfill_portal.backends.sql import SqlWarehouse, _quote

logger = logging.getLogger(__name__)

_TS_FORMAT = "%Y-%m-%d %H:%M:%S"


@register_backend("postgresql", "postgres", "pgsql")
class PostgreSQLWarehouse(SqlWarehouse):
    dialect = "postgresql"
    # The names format_type() reports back, so `ensure_dataset` compares them directly.
    PHYSICAL_TYPES = {
        "text": "text",
        "integer": "bigint",
        "numeric": "numeric",
        "timestamp": "timestamp with time zone",
        "date": "date",
        "boolean": "boolean",
    }
    SERIAL_PRIMARY_KEY = "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
    SHARE_LOCK = " FOR SHARE"
    NATIVE_VALUES = True

    @classmethod
    def target_of(cls, url: str) -> str:
        scheme = urlparse(url).scheme
        return url.replace(scheme + "://", "postgresql://", 1)

    # -- connections ------------------------------------------------------------------

    def _connect(self, *, timeout: float | None = None, probe: bool = False):
        from django.conf import settings

        try:
            # A bounded wait: an unreachable host must not hold a worker for the
            # operating system's TCP timeout (minutes).
            conn = psycopg.connect(self.target, autocommit=True,
                                   connect_timeout=settings.WAREHOUSE_CONNECT_TIMEOUT if timeout is None else timeout)
            timeouts = [f"SET {name} = '{int(seconds)}s'" for name, seconds in (
                ("lock_timeout", self.lock_timeout_seconds),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout_seconds)) if seconds]
            if timeouts:
                conn.execute("; ".join(timeouts))
            return conn
        except Exception as exc:
            raise WarehouseUnavailable(f"cannot connect to the warehouse: {exc}") from exc

    def _connection_is_broken(self, conn) -> bool:
        return conn.closed

    def sql(self, statement: str) -> str:
        """`?` placeholders become psycopg's `%s` (and a literal `%` is doubled)."""
        return statement.replace("%", "%%").replace("?", "%s")

    def _executemany(self, statement: str, rows) -> None:
        with self.conn.cursor() as cur:
            cur.executemany(self.sql(statement), rows)

    def _bulk_insert(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        """COPY: several times faster than a batched INSERT."""
        with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)

    def _reraise(self, exc: Exception):
        if isinstance(exc, psycopg.errors.LockNotAvailable):
            raise WarehouseLockTimeout(f"{exc} (waited WAREHOUSE_LOCK_TIMEOUT_SECONDS={self.lock_timeout_seconds})") from exc
        conn = getattr(self._local, "conn", None)
        # A connection the server ended (restart, idle-in-transaction timeout, a
        # terminated backend) is broken whatever class its last error has.
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)) or getattr(conn, "broken", False):
            self.close()
            raise WarehouseUnavailable(str(exc)) from exc
        raise exc

    @contextlib.contextmanager
    def _transaction_block(self, conn):
        try:
            with conn.transaction():
                yield
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._reraise(exc)  # e.g. the connection lost at COMMIT

    def _check_server(self) -> None:
        (version,) = self.query("SELECT current_setting('server_version_num')::int")[0]
        if int(version) < 140000:
            raise WarehouseUnavailable("the warehouse needs PostgreSQL 14 or newer (hash_record_extended)")

    # -- values -----------------------------------------------------------------------

    def ts(self, value: datetime) -> datetime:
        return self._utc(value)

    def ts_literal(self, value: datetime) -> str:
        return "TIMESTAMPTZ '" + self._utc(value).strftime(_TS_FORMAT) + "+00'"

    def _from_ts(self, value: Any) -> datetime:
        return value.astimezone(timezone.utc)

    # -- the catalog ------------------------------------------------------------------

    def table_exists(self, name: str) -> bool:
        # Only relations on the search path: a same-named table in another schema
        # is not the one an unqualified statement would reach.
        return bool(self.query(
            "SELECT 1 FROM pg_catalog.pg_class WHERE relname = ? AND relkind IN ('r', 'v', 'p')"
            " AND pg_catalog.pg_table_is_visible(oid)",
            (name,),
        ))

    def _relation_kind(self, name: str) -> str | None:
        rows = self.query("SELECT relkind FROM pg_catalog.pg_class WHERE oid = to_regclass(?)", (_quote(name),))
        if not rows:
            return None
        return "view" if rows[0][0] == "v" else "table"  # anything else in the way counts as a table

    def _columns_of(self, relation: str) -> dict[str, str]:
        # pg_attribute rather than information_schema, whose views join far more than
        # this needs; to_regclass resolves the name through the search path as a
        # statement would.
        rows = self.query(
            """SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
            FROM pg_catalog.pg_attribute AS a
            WHERE a.attrelid = to_regclass(?) AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""",
            (_quote(relation),),
        )
        return {name: kind for name, kind in rows}

    # -- locks ------------------------------------------------------------------------

    def _lock(self, key: str) -> None:
        """Serialise writers of one key until the transaction ends: two attempts of one
        run (or two DDL runs) queue instead of racing."""
        self.query("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (f"backfill:{key}",))

    def _lock_ending_other_holders(self, key: str) -> bool:
        """Take the advisory lock of `key` if it is free (True: taken, one statement as
        `_lock`); otherwise end the other sessions of this role holding it and return
        False (the caller then waits for it, within the lock timeout). Sessions of
        another role are left to the lock and idle-in-transaction timeouts: ending
        them needs a privilege."""
        if self.query("SELECT pg_try_advisory_xact_lock(hashtextextended(?, 0))", (f"backfill:{key}",))[0][0]:
            return True
        ended = self.query(
            """WITH k AS (SELECT hashtextextended(?, 0) AS h)
            SELECT l.pid, pg_terminate_backend(l.pid)
            FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid, k
            WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid()
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.objsubid = 1 AND l.classid = ((k.h >> 32) & 4294967295)::oid
              AND l.objid = (k.h & 4294967295)::oid AND a.usename = current_user""",
            (f"backfill:{key}",),
        )
        if ended:
            logger.warning("ended warehouse session(s) %s holding %s for a dead or frozen writer",
                           ", ".join(str(pid) for pid, _ in ended), key)
        return False

    # -- numbers and fingerprint ------------------------------------------------------

    def _numbers_and_fingerprint(self, spec: DatasetSpec, run_id: str) -> tuple[VersionNumbers, str]:
        """Both at commit, in one pass over the run's rows."""
        run_rows = f'{_quote(spec.versions_table)} WHERE "_run_id" = ?'
        row = self.query(
            f"""SELECT {self._numbers_sql(spec, run_rows)}, {self._hash_lanes_sql()}
            FROM (SELECT *, {self._row_hash_sql(spec)} AS h FROM {run_rows} OFFSET 0) AS r""",
            (run_id, run_id),
        )[0]
        return self._to_numbers(row), self._lanes_hex(row[4], row[5])

    def _fingerprint(self, spec: DatasetSpec, run_id: str) -> str:
        high, low = self.query(
            f"""SELECT {self._hash_lanes_sql()} FROM (
                SELECT {self._row_hash_sql(spec)} AS h FROM {_quote(spec.versions_table)}
                WHERE "_run_id" = ? OFFSET 0) AS r""",
            (run_id,),
        )[0]
        return self._lanes_hex(high, low)

    @staticmethod
    def _row_hash_sql(spec: DatasetSpec) -> str:
        """A 64-bit hash of a row's declared columns (PostgreSQL 14+).

        hash_record_extended hashes each field with its type's own hash function: no
        text rendering (five times faster than md5 of the row's text, measured), no
        dependence on session settings (TimeZone, DateStyle), NULL distinct from ''.
        Numbers are rounded to the sixth decimal first, so float noise below it does
        not count; numeric hashing already ignores trailing zeros."""
        places = FINGERPRINT_DECIMALS
        values = ", ".join(
            f"round({_quote(c.name)}, {places})" if c.type == "numeric" else _quote(c.name) for c in spec.columns
        )
        return f"hash_record_extended(ROW({values}), 0)"

    @staticmethod
    def _hash_lanes_sql() -> str:
        """Two order-independent 64-bit sums over the rows' hashes `h`: the hashes
        themselves, and a bit-mixed copy of them (shifts and XOR, which cannot
        overflow), so that rows whose hashes happen to add up alike still differ in
        the second lane. A sum, unlike XOR, counts every copy of a row."""
        return "COALESCE(SUM(h), 0), COALESCE(SUM(h # (h >> 29) # (h << 17)), 0)"

    @staticmethod
    def _lanes_hex(high: Any, low: Any) -> str:
        return f"{int(high) % 2**64:016x}{int(low) % 2**64:016x}"
