"""What the SQL backends share: isolated versions, commit markers, the publication
pointer, in one database reached through a DB-API driver.

Layout. The bookkeeping is the same in every SQL backend:

    _bf_current           the pointer (dataset, partition) -> run_id. Moving it is the
                          only way data becomes visible (DESIGN invariant 2).
    _bf_publications      the history of pointer moves, `publish` and `rollback`.
    _bf_markers           one commit marker per run, written in the same transaction
                          as the run's rows (invariant 4).

and `<dataset>` is a real table to readers, holding exactly the published version of
each partition, with the dataset's declared indexes (issue #15: readers pay nothing
for the safety). Where the versions live, and how a pointer move changes what
`<dataset>` holds, is the engine's:

    SQLite (this module's default): every run's rows in `<dataset>__versions`, tagged
        `_run_id`, `_partition`, `_attempt`; `<dataset>` is a current table whose
        partition's rows are replaced by the published version's in the pointer's
        transaction.
    PostgreSQL: one table per version, `<dataset>__v<hash of the run id>`, with a
        validated CHECK that it holds one partition; `<dataset>` is partitioned by LIST
        on the partition key and its attached partitions are exactly the published
        versions; the pointer's transaction detaches the old one and attaches the new.

Either way the pointer's compare-and-set and the change readers see commit together,
so any one SELECT sees the whole old version or the whole new one, never an empty or
half-written partition; a rollback is the same move pointing back. A warehouse of the
earlier layout (`<dataset>` a view joining `<dataset>__versions` to `_bf_current`) is
converted by `upgrade_layout` (`manage.py upgrade_warehouse_layout`).

Staging is one transaction: a crash anywhere before the marker leaves nothing behind,
and a marker proves the rows are complete. Callers retry with `marker()` first:
committed -> verify; absent -> stage again (which first clears the run's leftovers).

`SqlWarehouse` holds all of that once; what differs between engines (connecting,
placeholders, transactions, timestamps, types, locks, catalog lookups, the
fingerprint) is a method or class attribute of `SQLiteWarehouse` and
`PostgreSQLWarehouse`. Statements are written with `?` placeholders. Beyond the
interface, a SQL backend offers the plain statements (`execute`, `executemany`,
`bulk_insert`, `stream`, `transaction()`, `table_exists`) that code managing a
warehouse's *source* tables needs (the demo loader), and `execute_wrapper()` to
observe every statement (benchmarks).
"""
from __future__ import annotations

import abc
import contextlib
import dataclasses
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import date, datetime, timezone
from typing import Any

from backfill_portal.backends.base import (
    ACTIONS,
    BOOKKEEPING_COLUMNS,
    MAX_DATASET_NAME,
    AlreadyCommitted,
    ColumnSpec,
    DatasetSpec,
    Estimate,
    Marker,
    PointerMove,
    Profile,
    PublicationRecord,
    PublishConflict,
    PurgeRefused,
    VersionNotCommitted,
    VersionNumbers,
    WarehouseBackend,
    WarehouseLockTimeout,
    WarehouseUnavailable,
    convert_row,
    fingerprint_kind,
    identifier,
    rounded_measure,
)
from backfill_portal.core.errors import ValidationError

logger = logging.getLogger(__name__)

__all__ = ["FLUSH_SECONDS", "SqlWarehouse"]

# A staging transaction writes what it has at least this often while rows come slowly.
FLUSH_SECONDS = 5.0
_META_TABLES = ("_bf_current", "_bf_publications", "_bf_markers")
SOURCE_LOADS = "_bf_source_loads"  # the keyed loads of sources (load_source)
# Marker columns added after the first release, with their logical types.
_MARKER_NUMBERS = {"null_keys": "integer", "distinct_keys": "integer", "measure_sum": "numeric", "numbers_of": "text"}
# Run ids per many-versions query: SQLite caps bound parameters.
CHUNK = 500
# Lines of a query plan an estimate keeps.
PLAN_LINES = 40


def _quote(name: str) -> str:
    """Names are validated before they get here; quoting keeps keywords such as
    `partition`, `order` or `date` usable as column names."""
    return f'"{name}"'


def _literal(value: str) -> str:
    """A string as a SQL literal, for SQL that is rendered rather than parameterised.
    `?` is refused because `SqlWarehouse.sql` may turn every `?` into a driver
    placeholder, even inside quotes."""
    if not isinstance(value, str) or any(ch == "?" or ord(ch) < 32 for ch in value):
        raise ValidationError(f"{value!r} cannot be rendered as a SQL literal")
    return "'" + value.replace("'", "''") + "'"


def _now() -> datetime:
    # Whole seconds: SQLite stores timestamps at that precision, and a record returned
    # by a write should equal the same record read back.
    return datetime.now(timezone.utc).replace(microsecond=0)


def _chunks(items: list[str], size: int = CHUNK) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _index_name(table: str, columns: Sequence[str]) -> str:
    """A declared index's name on `table`: index names share one namespace (a schema,
    a database file), and `<table>_<columns>` could pass 63 bytes."""
    digest = hashlib.blake2b(f"{table}({','.join(columns)})".encode(), digest_size=10).hexdigest()
    return f"bfi_{digest}"


class SqlWarehouse(WarehouseBackend):
    """A warehouse in one SQL database. Stateless apart from caching which tables it
    has already ensured; safe to share between threads (one connection per thread)."""

    #: logical column type -> the engine's physical type, as its catalog reports it
    #: back (so `ensure_dataset` can compare them directly).
    PHYSICAL_TYPES: dict[str, str] = {}
    #: the history table's id: never reuses a deleted id, so "newest first" is id order.
    SERIAL_PRIMARY_KEY = ""
    #: appended to the marker read of a publish, locking it against a concurrent purge.
    SHARE_LOCK = ""
    #: the driver takes Decimal, date and bool as they are (else: float, ISO text, 0/1).
    NATIVE_VALUES = False
    #: the engine's name as people write it (an estimate says whose it is).
    ENGINE = ""
    #: the staging INSERT writes `_run_id`, `_partition` and `_attempt` in every row
    #: (False: the engine stores them once per version, in `_finish_version`).
    BOOKKEEPING_PER_ROW = True

    def __init__(self, url: str, *, lock_timeout_seconds: int = 0, idle_in_transaction_timeout_seconds: int = 0,
                 publish_lock_timeout_seconds: float = 1.0, publish_wait_seconds: float = 300.0):
        """Database sessions get both timeouts where the engine has them (0: the
        server's default, none): no statement waits on a lock for ever, and a session
        left open in a transaction by a frozen or vanished client is ended by the
        server, releasing its locks."""
        super().__init__(url, lock_timeout_seconds=lock_timeout_seconds,
                         idle_in_transaction_timeout_seconds=idle_in_transaction_timeout_seconds,
                         publish_lock_timeout_seconds=publish_lock_timeout_seconds,
                         publish_wait_seconds=publish_wait_seconds)
        self.target = self.target_of(url)
        self._local = threading.local()
        self._wrappers: list[Callable] = []
        self._meta_ready = False
        self._ready: set[DatasetSpec] = set()

    # -- what each engine defines ----------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def target_of(cls, url: str) -> str:
        """What the driver connects to, from the URL: a file path, a conninfo."""

    @abc.abstractmethod
    def _connect(self, *, timeout: float | None = None, probe: bool = False):
        """A new DB-API connection in autocommit mode, with the session settings;
        WarehouseUnavailable if refused. `probe`: a check that creates nothing, its
        connect bounded by `timeout` seconds if given."""

    @abc.abstractmethod
    def _transaction_block(self, conn):
        """A context manager: one database transaction on `conn`."""

    def _connection_is_broken(self, conn) -> bool:
        return False

    def _reraise(self, exc: Exception):
        """Map a driver error to the portal's (WarehouseUnavailable, WarehouseLockTimeout)
        where it means one; otherwise raise it as it is."""
        raise exc

    def _check_server(self) -> None:
        """Refuse a server too old for the statements used here."""

    def _lock(self, key: str) -> None:
        """Serialise writers of one key until the transaction ends."""

    def _lock_ending_other_holders(self, key: str) -> bool:
        """Take the lock of `key` if free (True); otherwise end other sessions that
        hold it and return False (the caller then waits for it, within the lock
        timeout). False where the transaction itself is the lock."""
        return False

    @abc.abstractmethod
    def table_exists(self, name: str) -> bool:
        """Whether a table or view of that name is what an unqualified statement reaches."""

    @abc.abstractmethod
    def _relation_kind(self, name: str) -> str | None:
        """"table", "view" or None."""

    @abc.abstractmethod
    def _columns_of(self, relation: str) -> dict[str, str]:
        """{column: physical type} of a table or view, in column order; {} if absent."""

    @abc.abstractmethod
    def _from_ts(self, value: Any) -> datetime:
        """A stored timestamp as an aware UTC datetime."""

    @abc.abstractmethod
    def _fingerprint(self, spec: DatasetSpec, run_id: str) -> str:
        """`fingerprint`, computed now."""

    def _numbers_and_fingerprint(self, spec: DatasetSpec, run_id: str) -> tuple[VersionNumbers, str]:
        """Both at commit (an engine may do them in one pass)."""
        return self._numbers(spec, run_id), self._fingerprint(spec, run_id)

    # -- connection management -------------------------------------------------------

    def probe(self, *, timeout: float | None = None) -> None:
        conn = self._connect(timeout=timeout, probe=True)
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
        if conn is not None and not getattr(self._local, "depth", 0) and self._connection_is_broken(conn):
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

    def sql(self, statement: str) -> str:
        """Statements are written with `?` placeholders; an engine whose driver wants
        another style translates them here."""
        return statement

    @contextlib.contextmanager
    def execute_wrapper(self, wrapper: Callable[[Callable[[], Any], str], Any]):
        """While the block runs, every statement of this warehouse (any thread) goes
        through `wrapper(call, statement)`, which must return `call()`: Django's
        `connection.execute_wrapper`, for timing or counting warehouse SQL."""
        self._wrappers.append(wrapper)
        try:
            yield
        finally:
            self._wrappers.remove(wrapper)

    def _run(self, statement: str, call: Callable[[], Any]) -> Any:
        for wrapper in reversed(self._wrappers):
            call = functools.partial(wrapper, call, statement)
        return call()

    # -- statements -------------------------------------------------------------------

    def execute(self, statement: str, params: tuple | list = ()) -> int:
        """Run a statement; return the rows it changed."""
        try:
            return self._run(statement, lambda: self.conn.execute(self.sql(statement), tuple(params)).rowcount)
        except WarehouseUnavailable:
            raise
        except Exception as exc:
            self._reraise(exc)

    def executemany(self, statement: str, rows) -> None:
        try:
            self._run(statement, lambda: self._executemany(statement, rows))
        except Exception as exc:
            self._reraise(exc)

    def _executemany(self, statement: str, rows) -> None:
        self.conn.executemany(self.sql(statement), rows)

    def query(self, statement: str, params: Sequence = ()) -> list[tuple]:
        try:
            return self._run(statement, lambda: list(self.conn.execute(self.sql(statement), tuple(params)).fetchall()))
        except Exception as exc:
            self._reraise(exc)

    def stream(self, statement: str, params: Sequence = (), *, batch_size: int = 4096):
        """Yield the result in lists of at most `batch_size` rows, so that reading a
        large version does not hold all of it in memory at once."""
        def batches():
            cur = self.conn.execute(self.sql(statement), tuple(params))
            while batch := cur.fetchmany(batch_size):
                yield batch

        try:
            if self._wrappers:  # observed: the statement's whole work inside the wrapper
                yield from self._run(statement, lambda: list(batches()))
            else:
                yield from batches()
        except Exception as exc:
            self._reraise(exc)

    def bulk_insert(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        """Insert many rows into `table` (identifiers already quoted by the caller)."""
        if not rows:
            return
        statement = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        try:
            self._run(statement, lambda: self._bulk_insert(table, columns, rows))
        except Exception as exc:
            self._reraise(exc)

    def _bulk_insert(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        marks = ", ".join("?" * len(columns))
        self._executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def query_dicts(self, statement: str, params: Sequence = ()) -> list[dict]:
        def run():
            cur = self.conn.execute(self.sql(statement), tuple(params))
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]

        try:
            return self._run(statement, run)
        except Exception as exc:
            self._reraise(exc)

    def columns_of(self, select_sql: str) -> list[str]:
        statement = f"SELECT * FROM ({select_sql}) AS q LIMIT 0"
        try:
            return self._run(statement, lambda: [d[0] for d in self.conn.execute(statement).description])
        except Exception as exc:
            self._reraise(exc)

    def explain(self, select_sql: str) -> Estimate:
        try:
            estimate = self._explain(select_sql)
        except Exception as exc:  # noqa: BLE001 - an estimate is advice: a refusal is shown, never raised
            return Estimate(engine=self.ENGINE or self.dialect, error=str(exc).strip().split("\n")[0][:300])
        return dataclasses.replace(estimate, plan=estimate.plan[:PLAN_LINES])

    def _explain(self, select_sql: str) -> Estimate:
        """`explain` from the engine's planner (which may refuse: raise)."""
        return super().explain(select_sql)

    @contextlib.contextmanager
    def transaction(self):
        """A write transaction; nested blocks join the outer one."""
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
            with self._transaction_block(conn):
                yield self
        finally:
            self._local.depth = 0

    # -- values -----------------------------------------------------------------------

    @staticmethod
    def _utc(value: datetime) -> datetime:
        if value.tzinfo is None:
            # astimezone() would silently read a naive value as the server's local time.
            raise ValueError("warehouse timestamps must be timezone-aware")
        return value.astimezone(timezone.utc)

    # -- schema -----------------------------------------------------------------------

    def ensure_meta(self) -> None:
        """Create the pointer, history and marker tables if missing. Idempotent.

        Checks read-only first: callers make a fresh `Warehouse` per request, and on
        SQLite the DDL transaction would take the database's single write lock."""
        self._check_server()
        if all(self.table_exists(name) for name in _META_TABLES) and not self._missing_marker_columns():
            self._meta_ready = True
            return
        ts = self._physical("timestamp")
        text = self._physical("text")
        integer = self._physical("integer")
        # AUTOINCREMENT: history ids never reuse a deleted id, so "newest first" is
        # simply id order.
        serial = self.SERIAL_PRIMARY_KEY
        statements = [
            f"""CREATE TABLE IF NOT EXISTS "_bf_current" (
                "dataset" {text} NOT NULL,
                "partition" {text} NOT NULL,
                "run_id" {text} NOT NULL,
                "published_at" {ts} NOT NULL,
                PRIMARY KEY ("dataset", "partition"))""",
            'CREATE INDEX IF NOT EXISTS "_bf_current_run" ON "_bf_current" ("run_id")',
            f"""CREATE TABLE IF NOT EXISTS "_bf_publications" (
                "id" {serial},
                "dataset" {text} NOT NULL,
                "partition" {text} NOT NULL,
                "run_id" {text} NOT NULL,
                "previous_run_id" {text},
                "action" {text} NOT NULL CHECK ("action" IN ('publish', 'rollback')),
                "actor" {text} NOT NULL,
                "published_at" {ts} NOT NULL)""",
            'CREATE INDEX IF NOT EXISTS "_bf_publications_partition"'
            ' ON "_bf_publications" ("dataset", "partition", "id")',
            f"""CREATE TABLE IF NOT EXISTS "_bf_markers" (
                "run_id" {text} PRIMARY KEY,
                "attempt_no" {integer} NOT NULL,
                "dataset" {text} NOT NULL,
                "partition" {text} NOT NULL,
                "row_count" {integer} NOT NULL,
                "fingerprint" {text} NOT NULL,
                "committed_at" {ts} NOT NULL,
                "null_keys" {integer},
                "distinct_keys" {integer},
                "measure_sum" {self._physical("numeric")},
                "numbers_of" {text})""",
            'CREATE INDEX IF NOT EXISTS "_bf_markers_partition" ON "_bf_markers" ("dataset", "partition")',
        ]
        with self.transaction():
            self._lock("meta")
            for statement in statements:
                self.execute(statement)
            # A warehouse from before markers kept the version's numbers.
            for name in self._missing_marker_columns():
                kind = self._physical(_MARKER_NUMBERS[name])
                self.execute(f'ALTER TABLE "_bf_markers" ADD COLUMN {_quote(name)} {kind}')
        self._meta_ready = True

    def _missing_marker_columns(self) -> list[str]:
        present = self._columns_of("_bf_markers")
        return [name for name in _MARKER_NUMBERS if present and name not in present]

    def ensure_dataset(self, spec: DatasetSpec) -> None:
        """Create or evolve the dataset's storage and its reader table `<name>`.
        Idempotent; read-only when nothing is missing, as for ensure_meta.

        Columns are only ever added, never dropped or retyped: old versions must stay
        readable for rollback. The reader table has every data column the versions
        have (the declared columns unless a column was removed from the catalog), so
        two processes running an older and a newer spec during a deploy agree on it
        instead of changing it back and forth.
        """
        self._ensure_meta_once()
        if self._dataset_is_ready(spec):
            self._ready.add(spec)
            return
        with self.transaction():
            self._lock(f"dataset:{spec.name}")
            self._refuse_foreign_relation(spec)
            self._build_dataset(spec)
        self._ready.add(spec)

    def _refuse_foreign_relation(self, spec: DatasetSpec) -> None:
        """`<name>` must be ours: absent, or the reader table (an older layout's view
        is converted by the upgrade command, not behind the operator's back)."""
        kind = self._relation_kind(spec.name)
        if kind == "view":
            raise ValidationError(
                f"{spec.name!r} is a view of the earlier warehouse layout; convert the warehouse with "
                "`manage.py upgrade_warehouse_layout` first",
                field="dataset",
            )
        if kind is not None and not self._is_reader_table(spec.name):
            raise ValidationError(
                f"a table named {spec.name!r} already exists; the reader table needs that name",
                field="dataset",
            )

    def _is_reader_table(self, name: str) -> bool:
        """Whether the table `name` has the reader table's bookkeeping columns."""
        return {"_run_id", "_partition"} <= set(self._columns_of(name))

    def _evolve_columns(self, spec: DatasetSpec, table: str, present: dict[str, str]) -> None:
        """Add the declared columns `table` lacks; refuse a retyped one."""
        for col in spec.columns:
            if col.name not in present:
                self.execute(f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(col.name)} {self._physical(col.type)}")
            elif present[col.name].lower() != self._physical(col.type).lower():
                raise ValidationError(
                    f"{spec.name}.{col.name} is stored as {present[col.name]!r} but declared {col.type!r};"
                    " changing a column's type needs a migration",
                    field="columns",
                )

    def _reader_indexes(self, spec: DatasetSpec) -> list[tuple[str, ...]]:
        """The indexes of the reader table: the partition key readers filter on (the
        partition column, else `_partition`), which is also what a publish replaces a
        partition by, and the declared ones."""
        return list(dict.fromkeys([(spec.partition_key_column,), *spec.indexes]))

    def _reader_bookkeeping(self, spec: DatasetSpec) -> list[str]:
        """The current table's columns beyond the data: `_partition` only. With a
        partition column it is a VIRTUAL generated copy of it (no bytes stored, no
        index of its own); the run is not stored per row (the pointer names it;
        `read_partition` joins it), so a reader's pages hold what a plain table's
        would (issue #15: wider rows cost every scan)."""
        if spec.partition_column:
            return [f'"_partition" TEXT GENERATED ALWAYS AS ({_quote(spec.partition_column)}) VIRTUAL']
        return ['"_partition" TEXT NOT NULL']

    @abc.abstractmethod
    def _partition_key_of(self, name: str) -> str | None:
        """The column `<name>` holds a partition's key in (SQLite's current table:
        `_partition` where it is stored, else the partition column it is generated
        from); None if there is no such table."""

    def _build_dataset(self, spec: DatasetSpec) -> None:
        """The versions table `<name>__versions` (one index, on the run: a run writes
        one partition, and every index is paid for by every staging INSERT) and the
        current table `<name>` with its indexes (`_reader_bookkeeping`)."""
        table = spec.versions_table
        present = self._columns_of(table)
        if not present:
            columns = [f"{_quote(c.name)} {self._physical(c.type)}" for c in spec.columns]
            columns += ['"_run_id" TEXT NOT NULL', '"_partition" TEXT NOT NULL', '"_attempt" INTEGER']
            self.execute(f"CREATE TABLE {_quote(table)} ({', '.join(columns)})")
        else:
            self._evolve_columns(spec, table, present)
        self.execute(f"CREATE INDEX IF NOT EXISTS {_quote(table + '_run')} ON {_quote(table)} (\"_run_id\")")
        stored = {name: kind for name, kind in self._columns_of(table).items() if name not in BOOKKEEPING_COLUMNS}
        current = self._columns_of(spec.name)
        if not current:
            columns = [f"{_quote(name)} {kind}" for name, kind in stored.items()]
            self.execute(f"CREATE TABLE {_quote(spec.name)} ({', '.join(columns + self._reader_bookkeeping(spec))})")
        else:
            for name, kind in stored.items():
                if name not in current:
                    self.execute(f"ALTER TABLE {_quote(spec.name)} ADD COLUMN {_quote(name)} {kind}")
        for columns in self._reader_indexes(spec):
            self.execute(f"CREATE INDEX IF NOT EXISTS {_quote(_index_name(spec.name, columns))} "
                         f"ON {_quote(spec.name)} ({', '.join(_quote(c) for c in columns)})")

    def _dataset_is_ready(self, spec: DatasetSpec) -> bool:
        """Whether the versions table has every declared column with its type, the
        reader table every data column of the versions, and every index exists."""
        present = self._columns_of(spec.versions_table)
        if any(present.get(c.name, "").lower() != self._physical(c.type).lower() for c in spec.columns):
            return False
        data_columns = {name for name in present if name not in BOOKKEEPING_COLUMNS}
        if set(self._columns_of(spec.name)) - {"_partition", "_run_id"} != data_columns:
            return False
        wanted = {_index_name(spec.name, columns) for columns in self._reader_indexes(spec)}
        return wanted <= self._index_names(spec.name)

    def _index_names(self, table: str) -> set[str]:
        """The names of `table`'s indexes."""
        return {name for (name,) in self.query(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))}

    # -- where a version lives (SQLite's layout here; PostgreSQL overrides) -------------

    def version_table(self, spec: DatasetSpec, run_id: str) -> str:
        """The table holding `run_id`'s rows of `spec` (committed or not), each tagged
        with its `_run_id`: what tests and maintenance read a version's storage through."""
        return spec.versions_table

    def _stored_columns(self, spec: DatasetSpec, run_id: str) -> dict[str, str]:
        """The columns of the table that holds the version's rows (`_stored_table`)."""
        return self._columns_of(self._stored_table(spec, run_id))

    def _stored_table(self, spec: DatasetSpec, run_id: str) -> str:
        """`version_table`, or a table of the dataset's where `_run_id = run_id` finds
        no rows if the version has no table of its own."""
        return self.version_table(spec, run_id)

    def _prepare_version(self, *, spec: DatasetSpec, run_id: str, partition: str) -> None:
        """Before a run's rows are written: without a marker, any row under this run_id
        is a dead attempt's partial output, and a run writes one partition, so all of
        them go."""
        self.execute(f'DELETE FROM {_quote(spec.versions_table)} WHERE "_run_id" = ?', (run_id,))

    def _open_version(self, *, spec: DatasetSpec, run_id: str) -> None:
        """Before `stage_rows` writes a run's rows: where they go is ready (here, the
        versions table always is)."""

    def _written_columns(self, spec: DatasetSpec) -> tuple[str, ...]:
        """The columns the staging INSERT writes, in order: the declared ones, then
        the bookkeeping if the engine stores it per row (bound last)."""
        return (*spec.column_names, *BOOKKEEPING_COLUMNS) if self.BOOKKEEPING_PER_ROW else spec.column_names

    def _finish_version(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str) -> None:
        """After a run's rows are written, before its marker: a row whose partition
        column is not the version's partition is refused (readers filter on it)."""
        if not spec.partition_column:
            return
        column = _quote(spec.partition_column)
        wrong = self.query(
            f'SELECT {column} FROM {_quote(spec.versions_table)} WHERE "_run_id" = ? '
            f"AND ({column} IS NULL OR {column} <> ?) LIMIT 1", (run_id, partition))
        if wrong:
            raise ValidationError(
                f"{spec.name}.{spec.partition_column}: a row holds {wrong[0][0]!r}, not its partition {partition!r}",
                field="partition_column",
            )

    def _insert_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                       select_sql: str, params: Sequence) -> tuple[VersionNumbers, str] | None:
        """Write the SELECT's rows as the run's version; the numbers and fingerprint if
        the same statement computed them (None: the marker counts them after)."""
        columns = ", ".join(_quote(name) for name in self._written_columns(spec))
        selected = ", ".join(f"q.{_quote(name)}" for name in spec.column_names)
        if not self.BOOKKEEPING_PER_ROW:
            self.execute(f"INSERT INTO {_quote(self.version_table(spec, run_id))} ({columns}) "
                         f"SELECT {selected} FROM ({select_sql}) AS q", tuple(params))
            return None
        # The three run placeholders come first in the text, so first in the params.
        self.execute(
            f"INSERT INTO {_quote(self.version_table(spec, run_id))} ({columns}) "
            f"SELECT {selected}, CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER) "
            f"FROM ({select_sql}) AS q",
            (run_id, partition, attempt_no, *params))
        return None

    def _show(self, *, name: str, partition: str, run_id: str, previous_run_id: str | None) -> None:
        """Inside the pointer's transaction, after its compare-and-set: make `<name>`
        hold `run_id`'s rows for `partition` instead of `previous_run_id`'s. Here: the
        current table's rows of the partition are replaced by the version's (its
        stored columns: a generated `_partition` is not written)."""
        columns = ", ".join(_quote(c) for c in self._columns_of(name))
        key = self._partition_key_of(name) or "_partition"
        self.execute(f'DELETE FROM {_quote(name)} WHERE {_quote(key)} = ?', (partition,))
        self.execute(f'INSERT INTO {_quote(name)} ({columns}) SELECT {columns} '
                     f'FROM {_quote(name + "__versions")} WHERE "_run_id" = ?', (run_id,))

    def _drop_version(self, *, spec: DatasetSpec, run_id: str) -> int:
        """Delete a version's rows (it is current nowhere); the rows deleted."""
        return self.execute(f'DELETE FROM {_quote(spec.versions_table)} WHERE "_run_id" = ?', (run_id,))

    def _pinned_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        """`ref_sql` for at least one pin."""
        columns = ", ".join(_quote(name) for name in spec.column_names)
        # Sorted so the rendered SQL, which may be hashed or logged, is deterministic.
        matches = " OR ".join(
            f'("_partition" = {_literal(partition)} AND "_run_id" = {_literal(run_id)})'
            for partition, run_id in sorted(pins.items())
        )
        return f"(SELECT {columns} FROM {_quote(spec.versions_table)} WHERE {matches})"

    def _runs_source(self, spec: DatasetSpec, run_ids: Sequence[str]) -> str:
        """A subquery over the rows of `run_ids` (one `?` per id, bound in order), with
        the declared columns and `_run_id`."""
        columns = ", ".join(_quote(name) for name in (*spec.column_names, "_run_id"))
        return (f"(SELECT {columns} FROM {_quote(spec.versions_table)} "
                f"WHERE \"_run_id\" IN ({', '.join('?' * len(run_ids))}))")

    def _publish_try(self):
        """A context manager around one try of a pointer switch, inside its
        transaction (an engine bounds its lock waits there)."""
        return contextlib.nullcontext()

    def _with_publish_retry(self, work: Callable[[], Any]) -> Any:
        """`work()` in a transaction of its own, tried again while it meets a lock that
        readers hold (WarehouseLockTimeout), for up to `publish_wait_seconds`. Each try
        gives its locks back before the next, so readers queued behind it run in
        between. Inside a caller's transaction it is tried once (a part of a
        transaction cannot be tried again alone)."""
        if getattr(self._local, "depth", 0):
            return work()
        deadline = time.monotonic() + self.publish_wait_seconds
        # Growing pauses, up to 2 s: a try that waits on a version a pinned reader
        # holds may already hold the reader table's lock, so readers of the dataset
        # should get most of each cycle while a long pinned read lasts.
        pause = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                with self.transaction(), self._publish_try():
                    return work()
            except WarehouseLockTimeout:
                if time.monotonic() + pause > deadline:
                    raise
                logger.info("a pointer switch waited %.1fs for readers' locks (try %d); trying again",
                            self.publish_lock_timeout_seconds, tries)
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    def _reader_is_current(self, spec: DatasetSpec) -> bool:
        """Whether `<name>` is a current table of this layout for `spec`: not a view,
        not the earlier wide table (`_run_id` stored in every row), its partition key
        the catalog's."""
        return (self._relation_kind(spec.name) == "table" and "_run_id" not in self._columns_of(spec.name)
                and self._partition_key_of(spec.name) == spec.partition_key_column)

    def upgrade_layout(self, spec: DatasetSpec) -> dict[str, Any]:
        """Earlier layouts had `<name>` as a view over `<name>__versions` joined to the
        pointer, then as a current table storing `_run_id` and `_partition` in every
        row. Here the versions table stays as it is; the view or old table is
        replaced by the current table of this layout, filled with the published rows,
        with its indexes, in one transaction."""
        self._ensure_meta_once()
        if self._relation_kind(spec.name) is None or self._reader_is_current(spec):
            return {}
        with self.transaction():
            self._lock(f"dataset:{spec.name}")
            kind = self._relation_kind(spec.name)
            if kind is None or self._reader_is_current(spec):
                return {}
            if kind == "table" and not self._is_reader_table(spec.name):
                return {}  # not the portal's: ensure_dataset refuses it, naming it
            self.execute(f"DROP {'VIEW' if kind == 'view' else 'TABLE'} {_quote(spec.name)}")
            self._ready.discard(spec)
            self._build_dataset(spec)
            names = list(self._columns_of(spec.name))
            published = self.execute(
                f"INSERT INTO {_quote(spec.name)} ({', '.join(_quote(c) for c in names)}) "
                f"SELECT {', '.join('v.' + _quote(c) for c in names)} FROM {_quote(spec.versions_table)} AS v "
                'JOIN "_bf_current" AS c ON c."dataset" = ? AND c."partition" = v."_partition" '
                'AND c."run_id" = v."_run_id"', (spec.name,))
            (versions,) = self.query('SELECT COUNT(*) FROM "_bf_markers" WHERE "dataset" = ?', (spec.name,))[0]
        self._ready.add(spec)
        return {"versions": int(versions), "published_rows": published}

    # -- staging --------------------------------------------------------------------

    def stage_rows(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                   rows: Iterable[Sequence], chunk_size: int = 5000, take_over: bool = False) -> Marker:
        """Write a run's rows (in `spec.columns` order) as its version, with its marker.

        One transaction:
        1. take the run's staging lock (`take_over`: see `_begin_stage`); refuse if
           the run already has a marker (AlreadyCommitted);
        2. delete the run's own leftover rows, if an earlier writer left any;
        3. insert the rows, `chunk_size` at a time so a large iterator is never held
           in memory whole, and at least every FLUSH_SECONDS while rows come slowly,
           so that a healthy transaction is never idle for long (the server ends
           sessions idle in a transaction past WAREHOUSE_IDLE_IN_TRANSACTION_TIMEOUT);
        4. count and fingerprint the run's rows (and refuse a row whose partition
           column is not the run's partition);
        5. insert the marker.
        Anything raised (including from `rows`) rolls all of it back.
        """
        self._check_run(run_id=run_id, attempt_no=attempt_no, partition=partition)
        if chunk_size < 1:
            raise ValidationError("chunk_size must be at least 1", field="chunk_size")
        self._ensure_dataset_once(spec)
        converters = [self._converter(col) for col in spec.columns]
        width = len(converters)
        tail = (run_id, partition, attempt_no) if self.BOOKKEEPING_PER_ROW else ()
        columns = [_quote(name) for name in self._written_columns(spec)]
        target = _quote(self.version_table(spec, run_id))
        with self.transaction():
            self._begin_stage(spec=spec, run_id=run_id, partition=partition, take_over=take_over)
            self._open_version(spec=spec, run_id=run_id)
            batch: list[tuple] = []
            flush_at = time.monotonic() + FLUSH_SECONDS
            for row in rows:
                if len(row) != width:
                    raise ValidationError(
                        f"{spec.name}: a row has {len(row)} values, the dataset declares {width} columns"
                    )
                batch.append(convert_row(spec, converters, row) + tail)
                if len(batch) >= chunk_size or time.monotonic() >= flush_at:
                    self.bulk_insert(target, columns, batch)
                    batch = []
                    flush_at = time.monotonic() + FLUSH_SECONDS
            self.bulk_insert(target, columns, batch)
            self._finish_version(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)
            return self._commit_marker(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)

    def stage_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                     select_sql: str, params: Sequence = (), take_over: bool = False) -> Marker:
        """Like `stage_rows`, but the rows come from a SELECT run inside the warehouse.
        Its output columns must carry the declared column names; extra ones are ignored.
        `select_sql` uses `?` placeholders, bound from `params`. The marker's numbers
        and fingerprint are taken from the written rows in the same transaction
        (`_numbers_and_fingerprint`; an engine may return them from the INSERT itself
        by overriding `_insert_select`)."""
        self._check_run(run_id=run_id, attempt_no=attempt_no, partition=partition)
        self._ensure_dataset_once(spec)
        with self.transaction():
            self._begin_stage(spec=spec, run_id=run_id, partition=partition, take_over=take_over)
            taken = self._insert_select(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition,
                                        select_sql=select_sql, params=params)
            self._finish_version(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)
            return self._commit_marker(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition,
                                       taken=taken)

    def marker(self, run_id: str) -> Marker | None:
        self._ensure_meta_once()
        return self._marker(run_id)

    # -- verification -----------------------------------------------------------------

    def profile(self, *, spec: DatasetSpec, run_id: str) -> Profile:
        """The numbers verification compares. A committed version never changes, so
        they are its marker's, taken in the rows' own transaction; a version without
        them (no marker yet, an older marker, another key or measure since) is counted
        in the database now, and a fingerprint of an earlier kind is taken again in
        today's, so that two profiles compare whenever their versions were staged."""
        self._ensure_dataset_once(spec)
        marker = self._marker(run_id)
        numbers = (marker.numbers_for(spec) if marker else None) or self._numbers(spec, run_id)
        present = self._stored_columns(spec, run_id)
        columns = []
        for name, physical in present.items():
            if name in BOOKKEEPING_COLUMNS:
                continue
            declared = next((c for c in spec.columns if c.name == name), None)
            matches = declared is not None and physical.lower() == self._physical(declared.type).lower()
            columns.append((name, declared.type if matches else physical.lower()))
        return Profile(
            row_count=numbers.row_count,
            distinct_keys=numbers.distinct_keys,
            null_keys=numbers.null_keys,
            duplicate_keys=numbers.duplicate_keys,
            measure_sum=numbers.measure_sum,
            fingerprint=(marker.fingerprint if marker and fingerprint_kind(marker.fingerprint) == self.FINGERPRINT_KIND
                         else self._fingerprint(spec, run_id)),
            columns=columns,
        )

    def fingerprint(self, *, spec: DatasetSpec, run_id: str) -> str:
        """`WarehouseBackend.fingerprint`, of today's kind, computed now."""
        self._ensure_dataset_once(spec)
        return self._fingerprint(spec, run_id)

    # -- publication ----------------------------------------------------------------

    def publish(self, *, spec_or_name: DatasetSpec | str, partition: str, run_id: str,
                expected_run_id: str | None, actor: str, action: str = "publish") -> PublicationRecord:
        """Point (dataset, partition) at `run_id` if it still points at `expected_run_id`.

        One transaction:
        1. the run must have a marker for exactly this dataset and partition (locked
           against a concurrent purge); a rollback target must have been published
           here before;
        2. compare-and-set the pointer: expected None inserts only if there is no
           pointer yet, otherwise the UPDATE matches only the expected run. No row
           changed means someone else moved it: PublishConflict, nothing written;
        3. make the reader table show the version instead of the expected one
           (`_show`: the engine's layout);
        4. append the history row.
        A lock readers hold past the publish lock timeout rolls the try back and the
        whole transaction is tried again (`_with_publish_retry`), so a long reader
        delays the publish instead of queueing every later reader behind it.
        """
        name = spec_or_name.name if isinstance(spec_or_name, DatasetSpec) else spec_or_name
        identifier(name, what="dataset", max_length=MAX_DATASET_NAME)
        if action not in ACTIONS:
            raise ValidationError(f"action must be one of {', '.join(ACTIONS)}", field="action")
        if not actor:
            raise ValidationError("every publication needs an actor", field="actor")
        if expected_run_id == run_id:
            raise ValidationError(f"{name}/{partition}: {run_id!r} is already the expected current version")
        self._ensure_meta_once()
        return self._with_publish_retry(lambda: self._move_pointer(
            name=name, partition=partition, run_id=run_id, expected_run_id=expected_run_id, actor=actor,
            action=action))

    def _move_pointer(self, *, name: str, partition: str, run_id: str, expected_run_id: str | None, actor: str,
                      action: str) -> PublicationRecord:
        """`publish`'s steps, inside the caller's transaction."""
        now = _now()
        marker = self._marker(run_id, lock=True)
        if marker is None or (marker.dataset, marker.partition) != (name, partition):
            raise VersionNotCommitted(f"run {run_id!r} has no committed version of {name}/{partition}")
        if action == "rollback" and not self.query(
            'SELECT 1 FROM "_bf_publications" WHERE "dataset" = ? AND "partition" = ? AND "run_id" = ?',
            (name, partition, run_id),
        ):
            raise VersionNotCommitted(
                f"run {run_id!r} was never published for {name}/{partition}; only a publish can show it"
            )
        if expected_run_id is None:
            changed = self.execute(
                """INSERT INTO "_bf_current" ("dataset", "partition", "run_id", "published_at")
                VALUES (?, ?, ?, ?) ON CONFLICT ("dataset", "partition") DO NOTHING""",
                (name, partition, run_id, self.ts(now)),
            )
        else:
            changed = self.execute(
                """UPDATE "_bf_current" SET "run_id" = ?, "published_at" = ?
                WHERE "dataset" = ? AND "partition" = ? AND "run_id" = ?""",
                (run_id, self.ts(now), name, partition, expected_run_id),
            )
        if changed != 1:
            raise PublishConflict(
                dataset=name, partition=partition, run_id=run_id,
                expected_run_id=expected_run_id, current_run_id=self._current(name, partition),
            )
        self._show(name=name, partition=partition, run_id=run_id, previous_run_id=expected_run_id)
        (record_id,) = self.query(
            """INSERT INTO "_bf_publications"
            ("dataset", "partition", "run_id", "previous_run_id", "action", "actor", "published_at")
            VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING "id"
            """,
            (name, partition, run_id, expected_run_id, action, actor, self.ts(now)),
        )[0]
        return PublicationRecord(
            id=int(record_id), dataset=name, partition=partition, run_id=run_id,
            previous_run_id=expected_run_id, action=action, actor=actor, published_at=now,
        )

    def rollback_many(self, moves: Sequence[PointerMove], *, actor: str) -> list[PublicationRecord]:
        """In one warehouse transaction, each move's compare-and-set: one lost race
        rolls all of them back."""
        self._ensure_meta_once()
        return self._with_publish_retry(lambda: [
            self.rollback(name=m.name, partition=m.partition, to_run_id=m.to_run_id,
                          expected_run_id=m.expected_run_id, actor=actor) for m in moves])

    def current(self, name: str, partition: str) -> str | None:
        self._ensure_meta_once()
        return self._current(name, partition)

    def current_many(self, name: str, partitions: Sequence[str]) -> dict[str, str]:
        """{partition: run_id} for the published ones among `partitions`, one query per
        few hundred (SQLite caps bound parameters)."""
        self._ensure_meta_once()
        out: dict[str, str] = {}
        for chunk in _chunks(list(dict.fromkeys(partitions))):
            marks = ", ".join("?" * len(chunk))
            out.update(self.query(
                f'SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ? AND "partition" IN ({marks})',
                (name, *chunk),
            ))
        return out

    def history(self, name: str, partition: str) -> list[PublicationRecord]:
        """Every pointer move of one partition, newest first."""
        self._ensure_meta_once()
        rows = self.query(
            """SELECT "id", "dataset", "partition", "run_id", "previous_run_id", "action", "actor", "published_at"
            FROM "_bf_publications" WHERE "dataset" = ? AND "partition" = ? ORDER BY "id" DESC""",
            (name, partition),
        )
        return [
            PublicationRecord(
                id=int(r[0]), dataset=r[1], partition=r[2], run_id=r[3], previous_run_id=r[4],
                action=r[5], actor=r[6], published_at=self._from_ts(r[7]),
            )
            for r in rows
        ]

    def purge(self, *, spec: DatasetSpec, run_id: str) -> int:
        """Delete a version's rows and its marker; return the rows deleted. Refused
        while the version is current anywhere. Keeping the previous verified version
        for rollback is the retention policy's job, which knows what "verified" means.

        The marker goes first: on PostgreSQL that row lock makes a concurrent publish
        of the same run (which reads the marker FOR SHARE) wait, and then either see
        the marker gone or have already moved the pointer, which the check below sees.
        """
        self._ensure_dataset_once(spec)
        with self.transaction():
            self._lock(f"run:{run_id}")
            self.execute('DELETE FROM "_bf_markers" WHERE "run_id" = ? AND "dataset" = ?', (run_id, spec.name))
            visible = self.query('SELECT "dataset", "partition" FROM "_bf_current" WHERE "run_id" = ?', (run_id,))
            if visible:
                where = ", ".join(f"{d}/{p}" for d, p in visible)
                raise PurgeRefused(f"run {run_id!r} is the current version of {where}; it cannot be purged")
            return self._drop_version(spec=spec, run_id=run_id)

    # -- reading ----------------------------------------------------------------------

    def read_partition(self, name: str, partition: str) -> list[dict]:
        """The published rows of one partition, from the reader table, as readers
        see them (one statement, so one consistent version). Unordered."""
        identifier(name, what="dataset", max_length=MAX_DATASET_NAME)
        return self.query_dicts(f'SELECT * FROM {_quote(name)} WHERE "_partition" = ?', (partition,))

    def ref_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        """A parenthesised subquery over exactly the pinned versions {partition: run_id},
        with the declared columns. A downstream run selects from it instead of the
        reader view, so what it reads cannot change under it when someone publishes.
        No pins: the right columns and no rows (the table is created if nothing was ever
        staged into it, as for a depends_on_past job's first partition)."""
        if not pins:
            self._ensure_dataset_once(spec)
            columns = ", ".join(_quote(name) for name in spec.column_names)
            return f"(SELECT {columns} FROM {_quote(spec.name)} WHERE 1 = 0)"
        return self._pinned_sql(spec=spec, pins=pins)

    def source_sql(self, *, name: str, time_column: str, start: datetime, end: datetime) -> str:
        """A source is a plain table of the warehouse, read by its time column."""
        return (f'(SELECT * FROM "{name}" WHERE "{time_column}" >= {self.ts_literal(start)} '
                f'AND "{time_column}" < {self.ts_literal(end)})')

    # -- sources ------------------------------------------------------------------------

    def _ensure_source_loads(self) -> None:
        """The keyed loads of sources: `_bf_source_loads`. A warehouse whose demo was
        loaded before this seam recorded its days in `_bf_demo_loaded`; they become the
        loads of their sources (keyed by the day, as the demo keys them now)."""
        if self.table_exists(SOURCE_LOADS):
            return
        text, integer = self._physical("text"), self._physical("integer")
        with self.transaction():
            self._lock("meta")
            self.execute(f"""CREATE TABLE IF NOT EXISTS "{SOURCE_LOADS}" ("source" {text} NOT NULL,
                "load_key" {text} NOT NULL, "row_count" {integer} NOT NULL, PRIMARY KEY ("source", "load_key"))""")
            if self.table_exists("_bf_demo_loaded"):
                self.execute(f'INSERT INTO "{SOURCE_LOADS}" ("source", "load_key", "row_count") '
                             'SELECT dataset, day, row_count FROM "_bf_demo_loaded" WHERE true ON CONFLICT DO NOTHING')

    def source_loads(self, name: str) -> dict[str, int] | None:
        identifier(name, what="source", max_length=MAX_DATASET_NAME)
        if not self.table_exists(name) or self._is_reader_table(name):
            return None
        self._ensure_source_loads()
        return {key: int(n) for key, n in self.query(
            f'SELECT "load_key", "row_count" FROM "{SOURCE_LOADS}" WHERE "source" = ?', (name,))}

    def _source_values(self, spec: DatasetSpec, rows: Any) -> list[tuple]:
        """`rows` (sequences, or Arrow) as this engine's parameter tuples. Arrow is
        converted a column at a time: timestamps formatted by Arrow as this engine
        stores them (SQLite's `ts()` text; for PostgreSQL's COPY, text with +00)."""
        converters = [self._converter(col) for col in spec.columns]
        if not (hasattr(rows, "schema") and hasattr(rows, "column")):
            return [convert_row(spec, converters, row) for row in rows]
        import pyarrow as pa
        import pyarrow.compute as pc

        missing = [c.name for c in spec.columns if c.name not in rows.schema.names]
        if missing:
            raise ValidationError(f"{spec.name}: the rows have no column {missing[0]!r}", field=missing[0])
        suffix = "" if self.dialect == "sqlite" else "+00"
        columns = []
        for col, convert in zip(spec.columns, converters):
            array = rows.column(col.name)
            kind = array.type
            if col.type == "timestamp" and pa.types.is_timestamp(kind) and kind.tz is not None:
                # UTC seconds, then Arrow's own cast to text ("YYYY-MM-DD HH:MM:SS"):
                # some 30 times faster than pc.strftime, which formats value by value.
                seconds = pc.cast(array, pa.timestamp("s", tz="UTC"), safe=False).cast(pa.timestamp("s"))
                text = seconds.cast(pa.string())
                columns.append([v if v is None else v + suffix for v in text.to_pylist()] if suffix
                               else text.to_pylist())
            elif ((col.type == "text" and pa.types.is_string(kind)) or (col.type == "integer" and pa.types.is_int64(kind))
                  or (col.type == "numeric" and pa.types.is_float64(kind))):
                columns.append(array.to_pylist())
            else:
                try:
                    columns.append([convert(v) for v in array.to_pylist()])
                except (TypeError, ValueError, ArithmeticError) as exc:
                    raise ValidationError(f"{spec.name}.{col.name}: cannot store a value as {col.type}: {exc}",
                                          field=col.name) from exc
        return list(zip(*columns))

    def load_source(self, *, spec: DatasetSpec, rows: Any, time_column: str = "", load_key: str | None = None,
                    replace: bool = False) -> int:
        identifier(spec.name, what="source", max_length=MAX_DATASET_NAME)
        if time_column and time_column not in spec.column_names:
            raise ValidationError(f"{spec.name}: no column {time_column!r} to read by", field="time_column")
        values = self._source_values(spec, rows)  # refuses bad values before anything is written
        table, names = _quote(spec.name), [_quote(c) for c in spec.column_names]
        self._ensure_source_loads()
        with self.transaction():
            self._lock(f"source:{spec.name}")
            kind = self._relation_kind(spec.name)
            if kind == "view" or (kind is not None and self._is_reader_table(spec.name)):
                raise ValidationError(f"{spec.name!r} is a produced dataset's table, not a source", field="source")
            if replace:
                self.execute(f"DROP TABLE IF EXISTS {table}")
                self.execute(f'DELETE FROM "{SOURCE_LOADS}" WHERE "source" = ?', (spec.name,))
            elif load_key is not None and self.query(
                    f'SELECT 1 FROM "{SOURCE_LOADS}" WHERE "source" = ? AND "load_key" = ?', (spec.name, load_key)):
                return 0
            present = self._columns_of(spec.name)
            if not present:
                self.execute(f"CREATE TABLE {table} (" + ", ".join(
                    f"{_quote(c.name)} {self._physical(c.type)}" for c in spec.columns) + ")")
            for col in spec.columns:
                if present and col.name not in present:
                    self.execute(f"ALTER TABLE {table} ADD COLUMN {_quote(col.name)} {self._physical(col.type)}")
            if time_column:
                self.execute(f"CREATE INDEX IF NOT EXISTS {_quote(_index_name(spec.name, [time_column]))} "
                             f"ON {table} ({_quote(time_column)})")
            if load_key is not None:
                # The key's row first: a concurrent loader of the same key waits on it
                # (PostgreSQL; SQLite's BEGIN IMMEDIATE), then finds it taken.
                if self.execute(f'INSERT INTO "{SOURCE_LOADS}" ("source", "load_key", "row_count") VALUES (?, ?, ?) '
                                'ON CONFLICT DO NOTHING', (spec.name, load_key, len(values))) != 1:
                    return 0
            if self.dialect == "sqlite":
                self._insert_values(table, names, values)
            else:
                self.bulk_insert(table, names, values)
        return len(values)

    def _insert_values(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        """Multi-row VALUES, SOURCE_BATCH rows a statement: on SQLite, executemany pays a
        step/reset round per row. Full batches share one cached statement."""
        row_sql = "(" + ", ".join("?" * len(columns)) + ")"
        head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
        batch_size = max(1, 2500 // max(1, len(columns)))
        full = head + ", ".join([row_sql] * batch_size)
        for i in range(0, len(rows), batch_size):
            batch = rows[i:i + batch_size]
            statement = full if len(batch) == batch_size else head + ", ".join([row_sql] * len(batch))
            self.execute(statement, [value for row in batch for value in row])

    # -- internals --------------------------------------------------------------------

    def _ensure_meta_once(self) -> None:
        if not self._meta_ready:
            self.ensure_meta()

    def _ensure_dataset_once(self, spec: DatasetSpec) -> None:
        if spec not in self._ready:
            self.ensure_dataset(spec)

    def _physical(self, logical: str) -> str:
        return self.PHYSICAL_TYPES[logical]

    @staticmethod
    def _check_run(*, run_id: str, attempt_no: int, partition: str) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValidationError("run_id must be a non-empty string", field="run_id")
        if not isinstance(partition, str) or not partition:
            raise ValidationError("partition must be a non-empty string", field="partition")
        if not isinstance(attempt_no, int) or attempt_no < 1:
            raise ValidationError("attempt_no must be a positive integer", field="attempt_no")

    def _begin_stage(self, *, spec: DatasetSpec, run_id: str, partition: str, take_over: bool = False) -> None:
        """`take_over`: the caller is the run's only live writer (its attempt started
        after every earlier one ended or was declared lost), so a session still holding
        the run's lock belongs to a dead or frozen earlier attempt: it is ended, which
        rolls its rows back, instead of being waited for (a SIGSTOPped worker would
        hold it for ever). Without it, the wait is bounded by the lock timeout."""
        if not (take_over and self._lock_ending_other_holders(f"run:{run_id}")):
            self._lock(f"run:{run_id}")
        existing = self._marker(run_id)
        if existing is not None:
            raise AlreadyCommitted(existing)
        self._prepare_version(spec=spec, run_id=run_id, partition=partition)

    def _commit_marker(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                       taken: tuple[VersionNumbers, str] | None = None) -> Marker:
        """`taken`: the numbers and fingerprint the writing statement returned."""
        numbers, fingerprint = taken or self._numbers_and_fingerprint(spec, run_id)
        marker = Marker(
            run_id=run_id, attempt_no=attempt_no, dataset=spec.name, partition=partition,
            row_count=numbers.row_count, fingerprint=fingerprint, committed_at=_now(),
            null_keys=numbers.null_keys, distinct_keys=numbers.distinct_keys, measure_sum=numbers.measure_sum,
            numbers_of=spec.numbers_of,
        )
        self.execute(
            """INSERT INTO "_bf_markers"
            ("run_id", "attempt_no", "dataset", "partition", "row_count", "fingerprint", "committed_at",
             "null_keys", "distinct_keys", "measure_sum", "numbers_of")
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (marker.run_id, marker.attempt_no, marker.dataset, marker.partition, marker.row_count,
             marker.fingerprint, self.ts(marker.committed_at), marker.null_keys, marker.distinct_keys,
             marker.measure_sum, marker.numbers_of),
        )
        return marker

    @staticmethod
    def _to_numbers(row: Sequence) -> VersionNumbers:
        row_count, null_keys, measure_sum, distinct_keys = row[:4]
        return VersionNumbers(row_count=int(row_count), null_keys=int(null_keys or 0),
                              distinct_keys=int(distinct_keys), measure_sum=rounded_measure(measure_sum))

    def _numbers(self, spec: DatasetSpec, run_id: str) -> VersionNumbers:
        """The version's numbers in one scan: grouped by the business key (a group's
        rows share their key, NULL parts included), then summed over the groups."""
        return self._to_numbers(self.query(self._numbers_statement(spec, run_id), (run_id,))[0])

    def _numbers_statement(self, spec: DatasetSpec, run_id: str, *, also: str = "") -> str:
        """`_numbers`' statement (bound with the run id); `also`: one more per-row
        count, an expression over the row (its `?` bound before the run id), summed as
        a fifth column."""
        keys = ", ".join(_quote(k) for k in spec.business_key)
        any_null = " OR ".join(f"{_quote(k)} IS NULL" for k in spec.business_key)
        measure = f"SUM({_quote(spec.core_measure)})" if spec.core_measure else "NULL"
        outer, inner = (", COALESCE(SUM(g.also), 0)", f", SUM(CASE WHEN {also} THEN 1 ELSE 0 END) AS also") \
            if also else ("", "")
        return f"""SELECT COALESCE(SUM(g.n), 0), COALESCE(SUM(CASE WHEN g.null_key = 1 THEN g.n ELSE 0 END), 0),
                SUM(g.m), COALESCE(SUM(CASE WHEN g.null_key = 1 THEN 0 ELSE 1 END), 0){outer}
            FROM (SELECT COUNT(*) AS n, {measure} AS m, MAX(CASE WHEN {any_null} THEN 1 ELSE 0 END) AS null_key{inner}
                  FROM {_quote(self._stored_table(spec, run_id))} WHERE "_run_id" = ? GROUP BY {keys}) AS g"""

    _MARKER_COLUMNS = ('"run_id", "attempt_no", "dataset", "partition", "row_count", "fingerprint", "committed_at", '
                       '"null_keys", "distinct_keys", "measure_sum", "numbers_of"')

    def _marker(self, run_id: str, *, lock: bool = False) -> Marker | None:
        statement = f'SELECT {self._MARKER_COLUMNS} FROM "_bf_markers" WHERE "run_id" = ?'
        if lock:
            statement += self.SHARE_LOCK
        rows = self.query(statement, (run_id,))
        return self._to_marker(rows[0]) if rows else None

    def markers(self, run_ids: Sequence[str]) -> dict[str, Marker]:
        """{run_id: marker} of those runs that committed (one query; callers chunk)."""
        self._ensure_meta_once()
        if not run_ids:
            return {}
        marks = ", ".join("?" * len(run_ids))
        rows = self.query(f'SELECT {self._MARKER_COLUMNS} FROM "_bf_markers" WHERE "run_id" IN ({marks})',
                             tuple(run_ids))
        return {row[0]: self._to_marker(row) for row in rows}

    def _to_marker(self, r: Sequence) -> Marker:
        return Marker(
            run_id=r[0], attempt_no=int(r[1]), dataset=r[2], partition=r[3], row_count=int(r[4]),
            fingerprint=r[5], committed_at=self._from_ts(r[6]),
            null_keys=None if r[7] is None else int(r[7]), distinct_keys=None if r[8] is None else int(r[8]),
            measure_sum=None if r[9] is None else float(r[9]), numbers_of=r[10],
        )

    def _current(self, name: str, partition: str) -> str | None:
        rows = self.query(
            'SELECT "run_id" FROM "_bf_current" WHERE "dataset" = ? AND "partition" = ?', (name, partition)
        )
        return rows[0][0] if rows else None

    # -- values -------------------------------------------------------------------------

    def _converter(self, col: ColumnSpec) -> Callable[[Any], Any]:
        """Python value -> parameter for this engine: the column's canonical value
        (ColumnSpec.parser), then this engine's representation of it. Normalising here
        (UTC text for SQLite timestamps, ISO dates, 0/1 booleans) is what makes the same
        data stored twice byte-identical, and so fingerprint-identical."""
        parse = col.parser()
        if col.type == "timestamp":
            represent = self.ts  # refuses naive datetimes
        elif self.NATIVE_VALUES or col.type in ("text", "integer"):
            return parse
        else:
            represent = {"numeric": float, "date": date.isoformat, "boolean": int}[col.type]

        def convert(v):
            v = parse(v)
            return None if v is None else represent(v)
        return convert

    # -- fingerprint ----------------------------------------------------------------------


    # -- many versions at once ------------------------------------------------------------
    #
    # A committed version's numbers are in its marker, taken with its rows: reconciling a
    # 2,000-interval request reads markers, a few hundred per query, and scans no version.
    # Versions whose marker lacks them (written before markers kept them, or counted for
    # another key or measure than the catalog's now) are counted by grouping on `_run_id`
    # over those runs, a chunk at a time, so the database does one pass per chunk.

    def profile_statements(self, spec: DatasetSpec, run_ids: Sequence[str]) -> list[str]:
        """The aggregate statements over the versions of `run_ids`, each bound with
        `run_ids` in that order (`?` placeholders). Public so the benchmark can time
        exactly the SQL reconciliation needs, bare."""
        source = self._runs_source(spec, run_ids)
        keys = [_quote(k) for k in spec.business_key]
        any_null = " OR ".join(f"{k} IS NULL" for k in keys)
        measure = f"SUM({_quote(spec.core_measure)})" if spec.core_measure else "NULL"
        if len(keys) == 1:
            # One key column: COUNT(DISTINCT) ignores NULLs, which is what distinct_keys means.
            return [f"""SELECT "_run_id", COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0),
                    {measure}, COUNT(DISTINCT {keys[0]})
                FROM {source} AS v GROUP BY \"_run_id\""""]
        all_set = " AND ".join(f"{k} IS NOT NULL" for k in keys)
        # A composite key needs DISTINCT over the tuple (a || b would confuse 'ab'+'c' and 'a'+'bc').
        return [
            f"""SELECT "_run_id", COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0), {measure}
                FROM {source} AS v GROUP BY \"_run_id\"""",
            f"""SELECT "_run_id", COUNT(*) FROM (
                    SELECT DISTINCT "_run_id", {', '.join(keys)} FROM {source} AS v
                    WHERE {all_set}) AS d
                GROUP BY \"_run_id\"""",
        ]

    def measure_statement(self, spec: DatasetSpec, run_ids: Sequence[str]) -> str:
        """The core-measure sums of `run_ids` (bound in that order; public for the
        benchmark, as above)."""
        return (f'SELECT "_run_id", SUM({_quote(spec.core_measure)}) FROM {self._runs_source(spec, run_ids)} AS v '
                f'GROUP BY "_run_id"')

    def _from_markers(self, spec: DatasetSpec, ids: list[str]) -> tuple[dict[str, VersionNumbers], list[str]]:
        """The numbers the markers hold, and the ids they do not answer for."""
        out: dict[str, VersionNumbers] = {}
        for chunk in _chunks(ids):
            for run_id, marker in self.markers(chunk).items():
                if (numbers := marker.numbers_for(spec)) is not None:
                    out[run_id] = numbers
        return out, [r for r in ids if r not in out]

    def profile_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, VersionNumbers]:
        ids = sorted({r for r in run_ids if r})
        if not ids or not self.table_exists(spec.name):
            return {}
        out, ids = self._from_markers(spec, ids)
        for chunk in _chunks(ids):
            statements = self.profile_statements(spec, chunk)
            main = self.query(statements[0], chunk)
            distinct = dict(self.query(statements[1], chunk)) if len(statements) > 1 else None
            for row in main:
                run_id, rows, null_keys, measure = row[0], int(row[1]), int(row[2] or 0), row[3]
                keys = int(row[4]) if distinct is None else int(distinct.get(run_id, 0))
                out[run_id] = VersionNumbers(row_count=rows, null_keys=null_keys, distinct_keys=keys,
                                             measure_sum=rounded_measure(measure))
        return out

    def measure_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, float | None]:
        ids = sorted({r for r in run_ids if r})
        if not ids or not spec.core_measure or not self.table_exists(spec.name):
            return {}
        numbers, ids = self._from_markers(spec, ids)
        out: dict[str, float | None] = {run_id: n.measure_sum for run_id, n in numbers.items()}
        for chunk in _chunks(ids):
            for run_id, total in self.query(self.measure_statement(spec, chunk), chunk):
                out[run_id] = rounded_measure(total)
        return out
