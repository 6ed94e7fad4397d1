"""Low-level connection to the warehouse database named by WAREHOUSE_URL.

Two dialects: `sqlite` (the embedded default, a file beside the metadata database) and
`postgresql` (psycopg 3). Everything above this module speaks through `WarehouseDB`:
`execute`, `executemany`, `bulk_insert`, `query`, `stream`, `transaction()`, and
`ts(dt)` to turn an aware datetime into the dialect's parameter value. Timestamps are
stored in UTC: SQLite keeps them as text `YYYY-MM-DD HH:MM:SS` (which sorts and
compares correctly), PostgreSQL as `timestamptz`.
"""
from __future__ import annotations

import contextlib
import sqlite3
import threading
from datetime import datetime, timezone
from urllib.parse import unquote, urlparse

from backfill_portal.core.errors import Unavailable, ValidationError

SQLITE_TS_FORMAT = "%Y-%m-%d %H:%M:%S"


class WarehouseUnavailable(Unavailable):
    """The warehouse refused the connection or the statement could not run."""


class WarehouseLockTimeout(Exception):
    """A lock the statement needed stayed held past the session's lock timeout (the
    warehouse is up; another session holds it)."""


def parse_url(url: str) -> tuple[str, str]:
    """Return (dialect, target): a file path for sqlite, a conninfo for postgresql."""
    parsed = urlparse(url)
    scheme = parsed.scheme.split("+")[0]
    if scheme == "sqlite":
        # As dj-database-url reads them: sqlite:////abs/path, sqlite:///relative/path
        path = unquote(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else ""
        return "sqlite", path or ":memory:"
    if scheme in {"postgres", "postgresql", "pgsql"}:
        return "postgresql", url.replace(parsed.scheme + "://", "postgresql://", 1)
    raise ValidationError(f"unsupported warehouse URL scheme {parsed.scheme!r}", field="WAREHOUSE_URL")


class WarehouseDB:
    """One connection per thread per URL. Not shared across processes."""

    def __init__(self, url: str, *, lock_timeout_seconds: int = 0, idle_in_transaction_timeout_seconds: int = 0):
        """PostgreSQL sessions get both timeouts (0: the server's default, none): no
        statement waits on a lock for ever, and a session left open in a transaction
        by a frozen or vanished client is ended by the server, releasing its locks.
        SQLite's equivalent of the first is its busy timeout (30 s)."""
        self.url = url
        self.dialect, self.target = parse_url(url)
        self.lock_timeout_seconds = lock_timeout_seconds
        self.idle_in_transaction_timeout_seconds = idle_in_transaction_timeout_seconds
        self._local = threading.local()

    # -- connection management -------------------------------------------------
    def _connect(self):
        try:
            if self.dialect == "sqlite":
                conn = sqlite3.connect(self.target, timeout=30, isolation_level=None, check_same_thread=False)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.execute("PRAGMA busy_timeout=30000")
                return conn
            import psycopg
            from django.conf import settings

            # A bounded wait: an unreachable host must not hold a worker for the
            # operating system's TCP timeout (minutes).
            conn = psycopg.connect(self.target, autocommit=True, connect_timeout=settings.WAREHOUSE_CONNECT_TIMEOUT)
            timeouts = [f"SET {name} = '{int(seconds)}s'" for name, seconds in (
                ("lock_timeout", self.lock_timeout_seconds),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout_seconds)) if seconds]
            if timeouts:
                conn.execute("; ".join(timeouts))
            return conn
        except Exception as exc:
            raise WarehouseUnavailable(f"cannot connect to the warehouse: {exc}") from exc

    def probe(self) -> None:
        """Open a fresh connection and run `SELECT 1` on it; raise WarehouseUnavailable
        if the warehouse refuses. The thread's own connection is neither used nor
        touched: it may be the very one that just broke, or be in a transaction."""
        conn = self._connect()
        try:
            conn.execute("SELECT 1").fetchall()
        except Exception as exc:
            raise WarehouseUnavailable(f"the warehouse does not answer: {exc}") from exc
        finally:
            with contextlib.suppress(Exception):
                conn.close()

    @property
    def conn(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None and self.dialect == "postgresql" and conn.closed and not getattr(self._local, "depth", 0):
            conn = None  # broken (the server went away): a new one, not the same error again
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            self._local.depth = 0
        return conn

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
            self._local.conn = None

    @property
    def placeholder(self) -> str:
        return "?" if self.dialect == "sqlite" else "%s"

    def sql(self, statement: str) -> str:
        """Statements are written with `?` placeholders; PostgreSQL gets `%s`."""
        if self.dialect == "sqlite":
            return statement
        return statement.replace("%", "%%").replace("?", "%s")

    # -- statements -------------------------------------------------------------
    def execute(self, statement: str, params: tuple | list = ()) -> int:
        try:
            cur = self.conn.execute(self.sql(statement), tuple(params))
            return cur.rowcount
        except WarehouseUnavailable:
            raise
        except Exception as exc:
            self._reraise(exc)

    def executemany(self, statement: str, rows) -> None:
        try:
            if self.dialect == "sqlite":
                self.conn.executemany(statement, rows)
            else:
                with self.conn.cursor() as cur:
                    cur.executemany(self.sql(statement), rows)
        except Exception as exc:
            self._reraise(exc)

    def query(self, statement: str, params: tuple | list = ()) -> list[tuple]:
        try:
            cur = self.conn.execute(self.sql(statement), tuple(params))
            return list(cur.fetchall())
        except Exception as exc:
            self._reraise(exc)

    def stream(self, statement: str, params: tuple | list = (), *, batch_size: int = 4096):
        """Yield the result in lists of at most `batch_size` rows, so that reading a
        large version does not hold all of it in memory at once."""
        try:
            cur = self.conn.execute(self.sql(statement), tuple(params))
            while batch := cur.fetchmany(batch_size):
                yield batch
        except Exception as exc:
            self._reraise(exc)

    def bulk_insert(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        """Insert many rows into `table` (identifiers already quoted by the caller).
        PostgreSQL uses COPY, several times faster than a batched INSERT; SQLite has
        no COPY and its executemany is already a tight loop in C."""
        if not rows:
            return
        try:
            if self.dialect == "sqlite":
                marks = ", ".join("?" * len(columns))
                self.conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
            else:
                with self.conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
        except Exception as exc:
            self._reraise(exc)

    def query_dicts(self, statement: str, params: tuple | list = ()) -> list[dict]:
        try:
            cur = self.conn.execute(self.sql(statement), tuple(params))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]
        except Exception as exc:
            self._reraise(exc)

    def columns_of(self, select_sql: str) -> list[str]:
        """The output column names of a SELECT, without reading its rows."""
        try:
            cur = self.conn.execute(f"SELECT * FROM ({select_sql}) AS q LIMIT 0")
            return [d[0] for d in cur.description]
        except Exception as exc:
            self._reraise(exc)

    def _reraise(self, exc: Exception):
        import psycopg

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
    def transaction(self):
        """A write transaction. SQLite takes the write lock at BEGIN (IMMEDIATE) so
        two writers queue on the busy timeout instead of deadlocking on upgrade."""
        conn = self.conn
        depth = getattr(self._local, "depth", 0)
        if depth:
            self._local.depth = depth + 1
            try:
                yield self
            finally:
                self._local.depth = depth
            return
        self._local.depth = 1
        try:
            if self.dialect == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
                try:
                    yield self
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                else:
                    conn.execute("COMMIT")
            else:
                import psycopg

                try:
                    with conn.transaction():
                        yield self
                except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                    self._reraise(exc)  # e.g. the connection lost at COMMIT
        finally:
            self._local.depth = 0

    # -- values -----------------------------------------------------------------
    def ts(self, value: datetime):
        """An aware datetime as this dialect stores it (UTC)."""
        if value.tzinfo is None:
            raise ValueError("warehouse timestamps must be timezone-aware")
        value = value.astimezone(timezone.utc)
        if self.dialect == "sqlite":
            return value.strftime(SQLITE_TS_FORMAT)
        return value

    def ts_literal(self, value: datetime) -> str:
        """An aware datetime as a SQL literal, for rendered templates."""
        if value.tzinfo is None:
            # astimezone() would silently read a naive value as the server's local time.
            raise ValueError("warehouse timestamps must be timezone-aware")
        value = value.astimezone(timezone.utc)
        if self.dialect == "sqlite":
            return "'" + value.strftime(SQLITE_TS_FORMAT) + "'"
        return "TIMESTAMPTZ '" + value.strftime(SQLITE_TS_FORMAT) + "+00'"

    def table_exists(self, name: str) -> bool:
        if self.dialect == "sqlite":
            rows = self.query("SELECT 1 FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,))
        else:
            # Only relations on the search path: a same-named table in another schema
            # is not the one an unqualified statement would reach.
            rows = self.query(
                "SELECT 1 FROM pg_catalog.pg_class WHERE relname = ? AND relkind IN ('r', 'v', 'p')"
                " AND pg_catalog.pg_table_is_visible(oid)",
                (name,),
            )
        return bool(rows)


_instances: dict[str, WarehouseDB] = {}
_lock = threading.Lock()


def get_warehouse_db(url: str | None = None) -> WarehouseDB:
    from django.conf import settings

    url = url or settings.WAREHOUSE_URL
    with _lock:
        db = _instances.get(url)
        if db is None:
            db = _instances[url] = WarehouseDB(
                url, lock_timeout_seconds=settings.WAREHOUSE_LOCK_TIMEOUT_SECONDS,
                idle_in_transaction_timeout_seconds=settings.WAREHOUSE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS)
        return db
