"""PostgreSQL (14 or newer) through psycopg 3: the warehouse of real deployments.

Timestamps are `timestamptz`, numbers exact `numeric` (the core measure sums the same
whatever the row order), and the fingerprint is computed in the database
(`hash_record_extended`). Writers of one run or one dataset's DDL queue on advisory
locks; sessions get a lock timeout and an idle-in-transaction timeout, so no statement
waits for ever and a frozen client's locks are released by the server.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import (
    BOOKKEEPING_COLUMNS,
    FINGERPRINT_DECIMALS,
    READER_LAYOUTS,
    DatasetSpec,
    Estimate,
    VersionNumbers,
    WarehouseLockTimeout,
    WarehouseUnavailable,
)
from backfill_portal.backends.sql import SqlWarehouse, _index_name, _literal, _quote
from backfill_portal.core.errors import ValidationError

logger = logging.getLogger(__name__)

_TS_FORMAT = "%Y-%m-%d %H:%M:%S"
# The comment that marks a reader table of the "table" layout as the portal's, and
# names the column a publish replaces a partition by.
_TABLE_LAYOUT_COMMENT = "backfill-portal reader table; partition key: "
# A conversion between the reader layouts builds the new reader table under the first
# name and, once it has taken the reader's name, empties the old one under the second.
_BUILDING, _RETIRED = "__bld", "__old"
# The URL's query parameter naming the reader layout of datasets the catalog leaves
# to the warehouse.
_LAYOUT_OPTION = "reader_layout"


def _without_layout_option(url: str) -> tuple[str, list[str]]:
    """`url` without its `reader_layout` parameters (libpq would refuse them), and
    their values."""
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    given = [value for key, value in pairs if key == _LAYOUT_OPTION]
    kept = urlencode([(key, value) for key, value in pairs if key != _LAYOUT_OPTION])
    return urlunsplit(parts._replace(query=kept)), given


# The oid of the table or view named ? on the search path (`table_exists`): a same-named
# one in another schema is not the one an unqualified statement would reach.
_VISIBLE_TABLE = ("SELECT c.oid FROM pg_catalog.pg_class AS c WHERE c.relname = ? AND c.relkind IN ('r', 'v', 'p')"
                  " AND pg_catalog.pg_table_is_visible(c.oid)")


@register_backend("postgresql", "postgres", "pgsql")
class PostgreSQLWarehouse(SqlWarehouse):
    dialect = "postgresql"
    ENGINE = "PostgreSQL"
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
    BOOKKEEPING_PER_ROW = False  # catalog defaults: `_add_bookkeeping`
    #: Version tables a conversion between the reader layouts reads or detaches in one
    #: transaction, which holds a lock on each until it ends (PostgreSQL's lock table
    #: holds max_locks_per_transaction x max_connections entries, 6,400 by default).
    conversion_batch = 200

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(url, **kwargs)
        problem = self.url_problem(url)
        if problem:
            raise ValidationError(problem, field=_LAYOUT_OPTION)
        given = _without_layout_option(url)[1]
        #: The reader layout of a dataset whose spec leaves it to the warehouse.
        self.default_layout = given[-1] if given else "partitioned"
        self._layouts: dict[str, tuple[str, str] | None] = {}

    @classmethod
    def target_of(cls, url: str) -> str:
        scheme = urlsplit(url).scheme
        return _without_layout_option(url.replace(scheme + "://", "postgresql://", 1))[0]

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        given = _without_layout_option(url)[1]
        if given and given[-1] not in READER_LAYOUTS:
            return (f"WAREHOUSE_URL: {_LAYOUT_OPTION}={given[-1]!r} is not a reader layout "
                    f"(one of {', '.join(READER_LAYOUTS)})")
        return None

    # -- connections ------------------------------------------------------------------

    def _connect(self, *, timeout: float | None = None, probe: bool = False):
        from django.conf import settings

        try:
            # A bounded wait: an unreachable host must not hold a worker for the
            # operating system's TCP timeout (minutes).
            conn = psycopg.connect(self.target, autocommit=True,
                                   connect_timeout=settings.WAREHOUSE_CONNECT_TIMEOUT if timeout is None else timeout)
            session = [f"SET {name} = '{int(seconds)}s'" for name, seconds in (
                ("lock_timeout", self.lock_timeout_seconds),
                ("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout_seconds)) if seconds]
            # A staging transaction of a worker host that is gone ends within about
            # DATABASE_DEAD_PEER_SECONDS, not at the idle timeout above (settings.py).
            session += [f"SET {name} = {int(value)}" for name, value in settings.DATABASE_DEAD_PEER_SETTINGS.items()]
            if session:
                conn.execute("; ".join(session))
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
        if isinstance(exc, psycopg.errors.DeadlockDetected):
            raise WarehouseLockTimeout(f"{exc} (the server broke a lock cycle)") from exc
        if isinstance(exc, psycopg.errors.CheckViolation) and "_bf_partition" in str(exc):
            raise ValidationError(f"a row's partition column does not hold its version's partition: {exc}",
                                  field="partition_column") from exc
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

    def _explain(self, select_sql: str) -> Estimate:
        (plan_json,), = self.query("EXPLAIN (FORMAT JSON) " + select_sql)
        top = (json.loads(plan_json) if isinstance(plan_json, str) else plan_json)[0]["Plan"]
        lines = tuple(row[0] for row in self.query("EXPLAIN " + select_sql))
        return Estimate(engine=self.ENGINE, rows=top.get("Plan Rows"), cost=top.get("Total Cost"), plan=lines)

    def ts(self, value: datetime) -> datetime:
        return self._utc(value)

    def ts_literal(self, value: datetime) -> str:
        return "TIMESTAMPTZ '" + self._utc(value).strftime(_TS_FORMAT) + "+00'"

    def _from_ts(self, value: Any) -> datetime:
        return value.astimezone(timezone.utc)

    # -- the catalog ------------------------------------------------------------------

    def table_exists(self, name: str) -> bool:
        return bool(self.query(_VISIBLE_TABLE, (name,)))

    def _relation_kind(self, name: str) -> str | None:
        rows = self.query("SELECT relkind FROM pg_catalog.pg_class WHERE oid = to_regclass(?)", (_quote(name),))
        if not rows:
            return None
        return "view" if rows[0][0] == "v" else "table"  # anything else in the way counts as a table

    def _columns_of(self, relation: str) -> dict[str, str]:
        # to_regclass resolves the name through the search path as a statement would.
        return self._attributes("to_regclass(?)", (_quote(relation),))

    def _attributes(self, relation_oid: str, params: tuple) -> dict[str, str]:
        """{column: type} of the relation whose oid the SQL `relation_oid` gives (none
        if NULL), in order."""
        return {name: kind for name, kind, _ in self._attribute_rows(relation_oid, params)}

    def _attribute_rows(self, relation_oid: str, params: tuple) -> list[tuple[str, str, bool]]:
        """(column, type, collatable) of the relation whose oid the SQL `relation_oid`
        gives (none if NULL), in order: pg_attribute rather than information_schema,
        whose views join far more than this needs."""
        return self.query(
            f"""SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attcollation <> 0
            FROM pg_catalog.pg_attribute AS a
            WHERE a.attrelid = {relation_oid} AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum""",
            params,
        )

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

    # -- the layout: one table per version, the reader table partitioned over them -------
    #
    # `<name>` is partitioned by LIST on the partition key column; its partitions are
    # exactly the published versions. A version is staged into `<name>__v<hash>` with a
    # CHECK that every row holds its partition, validated as rows go in, so the ATTACH
    # that publishes it need not scan it; its declared indexes are built before the
    # marker, so the ATTACH finds them instead of building them under its lock.
    #
    # Locks (PostgreSQL 14+): ATTACH takes SHARE UPDATE EXCLUSIVE on the parent (readers
    # go on) and ACCESS EXCLUSIVE on the table attached; DETACH without CONCURRENTLY takes
    # ACCESS EXCLUSIVE on the parent. DETACH ... CONCURRENTLY would not block readers but
    # cannot run inside a transaction block (it is two transactions), so the partition
    # would be missing, or the pointer disagree with it, between them: invariant 2 rules
    # it out. So a replacing publish waits for readers of the parent; each try waits at
    # most `publish_lock_timeout_seconds` (SET LOCAL lock_timeout), then lets go so the
    # readers queued behind it run, and tries again (`_with_publish_retry`).

    def version_table(self, spec: DatasetSpec, run_id: str) -> str:
        return self._version_table_of(spec.name, run_id)

    @staticmethod
    def _version_table_of(name: str, run_id: str) -> str:
        return f"{name}__v{hashlib.blake2b(run_id.encode(), digest_size=8).hexdigest()}"

    def _stored_table(self, spec: DatasetSpec, run_id: str) -> str:
        table = self.version_table(spec, run_id)
        return table if self.table_exists(table) else spec.name

    def _stored_columns(self, spec: DatasetSpec, run_id: str) -> dict[str, str]:
        """`_columns_of(_stored_table(...))` in one round trip (verification reads it
        for every run): the version's own table if there is one, else the dataset's."""
        return self._attributes(f"COALESCE(({_VISIBLE_TABLE}), to_regclass(?))",
                                (self.version_table(spec, run_id), _quote(spec.name)))

    def _partition_key_of(self, name: str) -> str | None:
        """The column `<name>` holds a partition's key in: what it is partitioned on,
        or what its comment names (the "table" layout); None if it is neither."""
        reader = self._reader_of(name)
        return reader[1] if reader else None

    # -- the "table" layout (base.READER_LAYOUTS) ----------------------------------------
    #
    # `<name>` a plain table holding the published rows, with the declared indexes and
    # one on the partition key; a publish deletes the partition's rows and copies the
    # version's in, inside the pointer's transaction, so a reader (MVCC) sees the old
    # rows or the new, never neither, and is never blocked (no DDL on `<name>`). Each
    # version keeps its own table (its CHECK, no indexes: readers do not read it), so
    # rollback copies the earlier one back and downstream runs read their pins.
    # The choice for datasets with many partitions (an hourly one, 8,760 a year): a
    # query that does not prune partitions plans and locks every partition of a
    # partitioned table (9,000 of them: "out of shared memory" with the default
    # max_locks_per_transaction, docs/performance.md), and a key lookup probes every
    # partition's index.

    def _reader_of(self, name: str) -> tuple[str, str] | None:
        """(layout, partition key column) of the reader table `name` as it is, or None
        if `name` is absent or not a reader table of either layout."""
        rows = self.query(
            """SELECT c.relkind, pg_catalog.obj_description(c.oid, 'pg_class'), a.attname
            FROM pg_catalog.pg_class AS c
            LEFT JOIN pg_catalog.pg_partitioned_table AS p ON p.partrelid = c.oid
            LEFT JOIN pg_catalog.pg_attribute AS a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
            WHERE c.oid = to_regclass(?)""", (_quote(name),))
        if not rows:
            return None
        relkind, comment, key = rows[0]
        if relkind == "p":
            return "partitioned", key
        if relkind == "r" and (comment or "").startswith(_TABLE_LAYOUT_COMMENT):
            return "table", comment[len(_TABLE_LAYOUT_COMMENT):]
        return None

    def _layout_for(self, spec: DatasetSpec) -> str:
        """The layout of `spec`'s reader table as it is (an existing one keeps its own
        until `upgrade_warehouse_layout` converts it), else the one it is made with."""
        if spec.name not in self._layouts:
            reader = self._reader_of(spec.name)
            if reader is None:
                return spec.reader_layout or self.default_layout
            self._layouts[spec.name] = reader
        return self._layouts[spec.name][0]

    def _create_reader(self, spec: DatasetSpec, columns: list[str], layout: str) -> None:
        """The reader table `<name>` of `layout` with the data `columns` (definitions)."""
        if layout == "table":
            extra = [] if spec.partition_column else ['"_partition" text NOT NULL']
            self.execute(f"CREATE TABLE {_quote(spec.name)} ({', '.join(columns + extra)})")
            self.execute(f"COMMENT ON TABLE {_quote(spec.name)} IS "
                         f"{_literal(_TABLE_LAYOUT_COMMENT + spec.partition_key_column)}")
        else:
            columns = [*columns, '"_run_id" text NOT NULL', '"_partition" text NOT NULL', '"_attempt" integer']
            self.execute(f"CREATE TABLE {_quote(spec.name)} ({', '.join(columns)}) "
                         f"PARTITION BY LIST ({_quote(spec.partition_key_column)})")
        self._layouts[spec.name] = (layout, spec.partition_key_column)

    def _is_reader_table(self, name: str) -> bool:
        return self._reader_of(name) is not None or super()._is_reader_table(name)

    def read_partition(self, name: str, partition: str) -> list[dict]:
        """As the base's; a "table" layout stores no run per row: the pointer's is
        joined, in the same statement."""
        reader = self._reader_of(name)
        if reader is None or reader[0] != "table":
            return super().read_partition(name, partition)
        return self.query_dicts(
            f'SELECT t.*, c."run_id" AS "_run_id" FROM {_quote(name)} AS t JOIN "_bf_current" AS c '
            f'ON c."dataset" = ? AND c."partition" = ? WHERE t.{_quote(reader[1])} = ?', (name, partition, partition))

    def _index_names(self, table: str) -> set[str]:
        return {name for (name,) in self.query(
            """SELECT c.relname FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
            WHERE i.indrelid = to_regclass(?)""", (_quote(table),))}

    def _reader_indexes(self, spec: DatasetSpec) -> list[tuple[str, ...]]:
        # Partitioned, pruning finds a partition: only the declared indexes are needed.
        if self._layout_for(spec) == "table":
            return super()._reader_indexes(spec)
        return list(spec.indexes)

    def _detached_versions(self, name: str) -> list[str]:
        """The version tables of `name` that exist and are not attached."""
        tables = sorted({self._version_table_of(name, run_id) for (run_id,) in self.query(
            'SELECT "run_id" FROM "_bf_markers" WHERE "dataset" = ?', (name,))})
        if not tables:
            return []
        return [t for (t,) in self.query(
            """SELECT c.relname FROM pg_catalog.pg_class AS c
            WHERE c.relname = ANY(?) AND pg_catalog.pg_table_is_visible(c.oid) AND c.relkind = 'r'
              AND NOT c.relispartition ORDER BY c.relname""", (tables,))]

    def _has_index_on(self, table: str, columns: Sequence[str]) -> bool:
        rows = self.query(
            """SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)
                            JOIN pg_catalog.pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
                            ORDER BY k.n)
            FROM pg_catalog.pg_index AS i WHERE i.indrelid = to_regclass(?) AND i.indpred IS NULL
              AND i.indexprs IS NULL""", (_quote(table),))
        return any(list(found) == list(columns) for (found,) in rows)

    def _dataset_is_ready(self, spec: DatasetSpec) -> bool:
        if self._partition_key_of(spec.name) != spec.partition_key_column:
            return False
        present = self._columns_of(spec.name)
        if any(present.get(c.name, "").lower() != self._physical(c.type).lower() for c in spec.columns):
            return False
        wanted = {_index_name(spec.name, columns) for columns in self._reader_indexes(spec)}
        return wanted <= self._index_names(spec.name)

    def _refuse_foreign_relation(self, spec: DatasetSpec) -> None:
        super()._refuse_foreign_relation(spec)
        key = self._partition_key_of(spec.name)
        if self._relation_kind(spec.name) is not None and key is None:
            raise ValidationError(
                f"{spec.name!r} is a table of an earlier warehouse layout or not the portal's; convert the "
                "warehouse with `manage.py upgrade_warehouse_layout` first", field="dataset")
        if key is not None and key != spec.partition_key_column:
            raise ValidationError(
                f"{spec.name!r} is partitioned on {key!r} but the catalog names {spec.partition_key_column!r}; "
                "`manage.py upgrade_warehouse_layout` repartitions it", field="partition_column")

    def _build_dataset(self, spec: DatasetSpec) -> None:
        """The partitioned reader table, its declared (partitioned) indexes; a column or
        index added to the catalog is added to every version not attached too, so any
        version can be attached again (a rollback) and read by pin."""
        present = self._columns_of(spec.name)
        if not present:
            self._create_reader(spec, [f"{_quote(c.name)} {self._physical(c.type)}" for c in spec.columns],
                                spec.reader_layout or self.default_layout)
            detached: list[str] = []
        else:
            detached = self._detached_versions(spec.name)
            for col in spec.columns:
                if col.name in present:
                    continue
                for table in [spec.name, *detached]:
                    self.execute(f"ALTER TABLE {_quote(table)} ADD COLUMN IF NOT EXISTS {_quote(col.name)} "
                                 f"{self._physical(col.type)}")
            self._evolve_columns(spec, spec.name, self._columns_of(spec.name))
        if self._layout_for(spec) == "table":
            for columns in self._reader_indexes(spec):
                self.execute(f"CREATE INDEX IF NOT EXISTS {_quote(_index_name(spec.name, columns))} "
                             f"ON {_quote(spec.name)} ({', '.join(_quote(c) for c in columns)})")
            return
        for columns in spec.indexes:
            listed = ", ".join(_quote(c) for c in columns)
            for table in detached:
                if not self._has_index_on(table, columns):
                    self.execute(f"CREATE INDEX {_quote(_index_name(table, columns))} ON {_quote(table)} ({listed})")
            self.execute(f"CREATE INDEX IF NOT EXISTS {_quote(_index_name(spec.name, columns))} "
                         f"ON {_quote(spec.name)} ({listed})")

    def _create_version_table(self, spec: DatasetSpec, table: str) -> None:
        """The data columns of the reader table, read from the catalog (CREATE TABLE
        ... LIKE would hold a lock on the reader table until the staging transaction
        ends, and a replacing publish needs that table alone). The bookkeeping columns
        and the partition's CHECK come after the rows (`_add_bookkeeping`)."""
        columns = [f"{_quote(name)} {kind}" for name, kind, _ in self._data_attributes(spec)]
        self.execute(f"CREATE TABLE {_quote(table)} ({', '.join(columns)})")

    def _data_attributes(self, spec: DatasetSpec) -> list[tuple[str, str, bool]]:
        """(column, type, collatable) of the reader table's data columns, in order: what
        a version's table holds before `_add_bookkeeping`."""
        return [row for row in self._attribute_rows("to_regclass(?)", (_quote(spec.name),))
                if row[0] not in BOOKKEEPING_COLUMNS]

    def _add_bookkeeping(self, spec: DatasetSpec, table: str, *, run_id: str, attempt_no: int,
                         partition: str) -> None:
        """`_run_id`, `_partition` and `_attempt` are the same in every row of a
        version, so they are added after the rows as columns with a constant DEFAULT:
        PostgreSQL 11+ keeps such a default once in the catalog (`attmissingval`) for
        the rows already there, without rewriting them, so no row carries them (the
        staging INSERT writes only the declared columns). NOT NULL as the reader
        table's. In the same statement the CHECK that makes the ATTACH skip its scan
        (a LIST partition refuses NULL, so it says NOT NULL too): validated by one
        scan of the rows here, cheaper than the same test row by row during the
        INSERT (figures in docs/performance.md)."""
        key = _quote(spec.partition_key_column)
        self.execute(
            f'ALTER TABLE {_quote(table)} ADD COLUMN "_run_id" text NOT NULL DEFAULT {_literal(run_id)}, '
            f'ADD COLUMN "_partition" text NOT NULL DEFAULT {_literal(partition)}, '
            f'ADD COLUMN "_attempt" integer DEFAULT {int(attempt_no)}, '
            f'ADD CONSTRAINT "_bf_partition" CHECK ({key} IS NOT NULL AND {key} = {_literal(partition)})')

    def _prepare_version(self, *, spec: DatasetSpec, run_id: str, partition: str) -> None:
        """A version without a marker is a dead attempt's: its table goes (PostgreSQL's
        DDL is transactional, so only a writer outside the staging transaction could
        have left one). The new one is made by the write (`_open_version` or
        `_insert_select`)."""
        self.execute(f"DROP TABLE IF EXISTS {_quote(self.version_table(spec, run_id))}")

    def _open_version(self, *, spec: DatasetSpec, run_id: str) -> None:
        self._create_version_table(spec, self.version_table(spec, run_id))

    def _insert_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                       select_sql: str, params: Sequence) -> None:
        """The version's table made by the SELECT itself (CREATE TABLE ... AS), each
        declared column cast to the reader table's type, a collatable one with the
        default collation: the columns `_create_version_table` gives it, which the
        ATTACH compares. A table created by the statement that fills it is written through
        PostgreSQL's bulk-insert path (a small ring of buffers, no free-space-map
        lookups per row) and its SELECT may run in parallel workers: 1,000,000 rows
        0.45 s against 0.56 s for INSERT ... SELECT into the empty table (psql,
        alternated; docs/performance.md). The casts are explicit ones, so a value an
        INSERT would have refused by its type alone (a text where the catalog declares
        a date) is converted, and one that does not convert fails the attempt."""
        declared = set(spec.column_names)
        selected = []
        for name, kind, collatable in self._data_attributes(spec):
            value = f"q.{_quote(name)}" if name in declared else "NULL"  # a column the catalog no longer declares
            collation = ' COLLATE pg_catalog."default"' if collatable else ""
            selected.append(f"CAST({value} AS {kind}){collation} AS {_quote(name)}")
        self.execute(f"CREATE TABLE {_quote(self.version_table(spec, run_id))} AS "
                     f"SELECT {', '.join(selected)} FROM ({select_sql}) AS q", tuple(params))

    def _finish_version(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str) -> None:
        """The bookkeeping columns and the partition's CHECK (`_add_bookkeeping`), then
        the declared indexes, built once over the loaded rows (cheaper than keeping
        them up row by row), matching the reader table's so the ATTACH adopts them."""
        table = self.version_table(spec, run_id)
        self._add_bookkeeping(spec, table, run_id=run_id, attempt_no=attempt_no, partition=partition)
        if self._layout_for(spec) == "table":
            return  # readers read the reader table's copy; an attach would build them
        for columns in spec.indexes:
            self.execute(f"CREATE INDEX {_quote(_index_name(table, columns))} ON {_quote(table)} "
                         f"({', '.join(_quote(c) for c in columns)})")

    def _publish_try(self):
        """Each try of a pointer switch waits at most the publish lock timeout for a
        lock (SET LOCAL: this transaction only)."""
        self.execute(f"SET LOCAL lock_timeout = '{max(1, int(self.publish_lock_timeout_seconds * 1000))}ms'")
        return contextlib.nullcontext()

    def _attached(self, name: str, table: str) -> bool:
        return bool(self.query(
            """SELECT 1 FROM pg_catalog.pg_inherits WHERE inhparent = to_regclass(?) AND inhrelid = to_regclass(?)""",
            (_quote(name), _quote(table))))

    def _show(self, *, name: str, partition: str, run_id: str, previous_run_id: str | None) -> None:
        """Detach the previous version, attach this one (its CHECK proves the partition
        constraint, so nothing is scanned). The "table" layout: the partition's rows
        are replaced by the version's."""
        reader = self._reader_of(name)
        if reader is not None and reader[0] == "table":
            self._copy_in(name, reader[1], partition, run_id, replace=True)
            return
        parent = _quote(name)
        if previous_run_id is not None:
            old = self._version_table_of(name, previous_run_id)
            if self._attached(name, old):
                self.execute(f"ALTER TABLE {parent} DETACH PARTITION {_quote(old)}")
        self.execute(f"ALTER TABLE {parent} ATTACH PARTITION {_quote(self._version_table_of(name, run_id))} "
                     f"FOR VALUES IN ({_literal(partition)})")

    def _copy_in(self, name: str, key: str, partition: str, run_id: str, *, replace: bool) -> None:
        """The "table" layout's reader table holds `run_id`'s rows for `partition`
        (`replace`: instead of the rows it held)."""
        if replace:
            self.execute(f"DELETE FROM {_quote(name)} WHERE {_quote(key)} = ?", (partition,))
        columns = ", ".join(_quote(c) for c in self._columns_of(name))
        self.execute(f"INSERT INTO {_quote(name)} ({columns}) SELECT {columns} "
                     f"FROM {_quote(self._version_table_of(name, run_id))}")

    def _drop_version(self, *, spec: DatasetSpec, run_id: str) -> int:
        table = self.version_table(spec, run_id)
        if not self.table_exists(table):
            return 0
        (count,) = self.query(f"SELECT COUNT(*) FROM {_quote(table)}")[0]
        self.execute(f"DROP TABLE {_quote(table)}")
        return int(count)

    def _existing_tables(self, tables: Sequence[str]) -> set[str]:
        if not tables:
            return set()
        return {t for (t,) in self.query(
            "SELECT relname FROM pg_catalog.pg_class WHERE relname = ANY(?) AND relkind = 'r'"
            " AND pg_catalog.pg_table_is_visible(oid)", (list(tables),))}

    def _pinned_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        """The pinned versions' own tables, UNION ALL: what a downstream run reads does
        not depend on what is attached. A pin names its partition too: another
        partition's version contributes nothing (its CHECK excludes it at planning)."""
        columns = ", ".join(_quote(name) for name in spec.column_names)
        tables = {run_id: self.version_table(spec, run_id) for run_id in pins.values()}
        existing = self._existing_tables(list(tables.values()))
        parts = []
        for partition, run_id in sorted(pins.items()):
            literal = _literal(partition)
            _literal(run_id)  # refused like a rendered value, though only its hash is rendered
            if tables[run_id] in existing:
                parts.append(f'SELECT {columns} FROM {_quote(tables[run_id])} WHERE "_partition" = {literal}')
        if not parts:
            return f"(SELECT {columns} FROM {_quote(spec.name)} WHERE 1 = 0)"
        return "(" + " UNION ALL ".join(parts) + ")"

    def _runs_source(self, spec: DatasetSpec, run_ids: Sequence[str]) -> str:
        columns = ", ".join(_quote(name) for name in (*spec.column_names, "_run_id"))
        tables = [self.version_table(spec, run_id) for run_id in run_ids]
        existing = self._existing_tables(tables)
        # A version without a table (purged) contributes nothing: its `?` is still bound.
        data = ", ".join(_quote(name) for name in spec.column_names)
        parts = [f'SELECT {columns} FROM {_quote(t)} WHERE "_run_id" = ?' if t in existing else
                 f'SELECT {data}, CAST(? AS text) AS "_run_id" FROM {_quote(spec.name)} WHERE false' for t in tables]
        return "(" + " UNION ALL ".join(parts) + ")"

    def upgrade_layout(self, spec: DatasetSpec) -> dict[str, Any]:
        """To the layout the catalog names (`spec.reader_layout`, else the warehouse's
        default) from any earlier one, in one transaction; the markers, pointers and
        history stay as they are:

        - from the view layout (`<name>` a view over `<name>__versions` joined to the
          pointer), or a reader table keyed on another column than the catalog now
          names: every committed version gets a table of its own again (its CHECK,
          and its indexes where it will be attached), the old heap goes;
        - from the other of the two layouts, keyed as the catalog says: the versions
          keep their tables; the reader table is made again and shows the published
          ones (attached, or copied in).

        Each version's table is locked until the end, so a dataset of more versions
        than the server's lock table holds (max_locks_per_transaction) needs it raised
        for the conversion."""
        self._ensure_meta_once()
        self._retire(f"{spec.name}{_RETIRED}")  # a conversion interrupted after its switch
        kind = self._relation_kind(spec.name)
        reader = self._reader_of(spec.name)
        wanted = spec.reader_layout or self.default_layout
        if kind is None or reader == (wanted, spec.partition_key_column):
            return {}
        if kind == "table" and reader is None:
            return {}  # not the portal's: ensure_dataset refuses it, naming it
        if reader == ("partitioned", spec.partition_key_column) and wanted == "table":
            return self._partitioned_to_table(spec)
        with self.transaction():
            self._lock(f"dataset:{spec.name}")
            # Publications wait (their pointer's UPDATE) until the reader table is made
            # again, then show their version in the new layout; one that holds its
            # pointer already is waited for here, and its version is shown below.
            self.execute('LOCK TABLE "_bf_current" IN SHARE MODE')
            self._ready.discard(spec)
            self._layouts.pop(spec.name, None)
            runs = self.query('SELECT "run_id", "partition", "attempt_no" FROM "_bf_markers" WHERE "dataset" = ? '
                              'ORDER BY "run_id"', (spec.name,))
            current = dict(self.query('SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ?',
                                      (spec.name,)))
            if reader is not None and reader[1] == spec.partition_key_column:
                # Only the layout changes: the versions keep their tables.
                stored = [f"{_quote(c)} {t}" for c, t in self._columns_of(spec.name).items()
                          if c not in BOOKKEEPING_COLUMNS]
                for child in self._partitions_of(spec.name):
                    self.execute(f"ALTER TABLE {_quote(spec.name)} DETACH PARTITION {_quote(child)}")
                grants = self._grants_of(spec.name)
                self.execute(f"DROP TABLE {_quote(spec.name)}")
                self._create_reader(spec, stored, wanted)
                self._grant(spec.name, grants)
                self._build_dataset(spec)
                for run_id, partition, attempt_no in runs:
                    if wanted == "partitioned":  # what an attach adopts instead of building under its lock
                        self._finish_indexes(spec, self._version_table_of(spec.name, run_id))
                self._show_all(spec, current)
                self._ready.add(spec)
                return {"versions": len(runs), "published": len(current), "layout": wanted}
            grants = self._grants_of(spec.name)  # the view's or the table's, before either goes
            if kind == "view":
                heap = spec.versions_table
                self.execute(f"DROP VIEW {_quote(spec.name)}")
            else:  # keyed on another column: the versions move to new tables too
                heap = f"{spec.name}__upgrading"
                self.execute(f"ALTER TABLE {_quote(spec.name)} RENAME TO {_quote(heap)}")
                for run_id, _, _ in runs:
                    table = self._version_table_of(spec.name, run_id)
                    if self.table_exists(table):
                        self.execute(f"ALTER TABLE {_quote(table)} RENAME TO {_quote(table + '_old')}")
            stored = self._columns_of(heap)
            self._create_reader(spec, [f"{_quote(c)} {t}" for c, t in stored.items() if c not in BOOKKEEPING_COLUMNS],
                                wanted)
            self._grant(spec.name, grants)
            self._build_dataset(spec)
            names = [c for c in self._columns_of(spec.name) if c not in BOOKKEEPING_COLUMNS]
            listed = ", ".join(_quote(c) for c in names)
            for run_id, partition, attempt_no in runs:
                table = self._version_table_of(spec.name, run_id)
                source = (_quote(heap) if kind == "view" else _quote(table + "_old"))
                self._create_version_table(spec, table)
                if kind == "view" or self.table_exists(table + "_old"):
                    self.execute(f'INSERT INTO {_quote(table)} ({listed}) SELECT {listed} FROM {source} '
                                 f'WHERE "_run_id" = ?', (run_id,))
                self._finish_version(spec=spec, run_id=run_id, attempt_no=int(attempt_no), partition=partition)
                if kind != "view" and self.table_exists(table + "_old"):
                    self.execute(f"DROP TABLE {_quote(table + '_old')}")
            self._show_all(spec, current)
            self.execute(f"DROP TABLE {_quote(heap)}" + (" CASCADE" if kind != "view" else ""))
        self._ready.add(spec)
        return {"versions": len(runs), "published": len(current), "layout": wanted}

    def _partitioned_to_table(self, spec: DatasetSpec) -> dict[str, Any]:
        """The conversion a dataset of many partitions needs (an hourly one): the
        one-transaction conversion would lock every version table at once, beyond the
        server's lock table. The new reader table is filled under another name,
        `conversion_batch` versions a transaction, while readers go on reading the
        partitioned one and publications go on; then one short transaction (the
        publications held back meanwhile) copies in what was published since, and
        renames the partitioned table away and the new one into its place; last, the
        old one lets its partitions go, a batch a transaction, and is dropped."""
        name, building = spec.name, f"{spec.name}{_BUILDING}"
        key = spec.partition_key_column
        with self.transaction():
            self._lock(f"dataset:{name}")
            stored = [f"{_quote(c)} {t}" for c, t in self._columns_of(name).items() if c not in BOOKKEEPING_COLUMNS]
            extra = [] if spec.partition_column else ['"_partition" text NOT NULL']
            self.execute(f"DROP TABLE IF EXISTS {_quote(building)}")
            self.execute(f"CREATE TABLE {_quote(building)} ({', '.join(stored + extra)})")
        columns = ", ".join(_quote(c) for c in self._columns_of(building))

        def copy_in(partition: str, run_id: str) -> None:
            self.execute(f"INSERT INTO {_quote(building)} ({columns}) SELECT {columns} "
                         f"FROM {_quote(self._version_table_of(name, run_id))}")

        snapshot = dict(self.query('SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ?', (name,)))
        shown = sorted(snapshot.items())
        for start in range(0, len(shown), self.conversion_batch):
            with self.transaction():
                for partition, run_id in shown[start:start + self.conversion_batch]:
                    copy_in(partition, run_id)
        indexes = SqlWarehouse._reader_indexes(self, spec)  # the table layout's: the key's and the declared
        for index in indexes:
            self.execute(f"CREATE INDEX {_quote(_index_name(building, index))} ON {_quote(building)} "
                         f"({', '.join(_quote(c) for c in index)})")
        retired = f"{name}{_RETIRED}"
        with self.transaction():
            self._lock(f"dataset:{name}")
            self.execute('LOCK TABLE "_bf_current" IN SHARE MODE')
            now = dict(self.query('SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ?', (name,)))
            for partition, run_id in sorted(now.items()):
                if snapshot.get(partition) != run_id:  # published or rolled back since
                    self.execute(f"DELETE FROM {_quote(building)} WHERE {_quote(key)} = ?", (partition,))
                    copy_in(partition, run_id)
            for index in spec.indexes:  # the partitioned indexes' names go with their table
                if _index_name(name, index) in self._index_names(name):
                    self.execute(f"ALTER INDEX {_quote(_index_name(name, index))} "
                                 f"RENAME TO {_quote(_index_name(retired, index))}")
            self._grant(building, self._grants_of(name))
            self.execute(f"ALTER TABLE {_quote(name)} RENAME TO {_quote(retired)}")
            self.execute(f"ALTER TABLE {_quote(building)} RENAME TO {_quote(name)}")
            for index in indexes:
                self.execute(f"ALTER INDEX {_quote(_index_name(building, index))} "
                             f"RENAME TO {_quote(_index_name(name, index))}")
            self.execute(f"COMMENT ON TABLE {_quote(name)} IS {_literal(_TABLE_LAYOUT_COMMENT + key)}")
            (versions,) = self.query('SELECT COUNT(*) FROM "_bf_markers" WHERE "dataset" = ?', (name,))[0]
        self._layouts[name] = ("table", key)
        self._ready.discard(spec)
        self._retire(retired)
        return {"versions": int(versions), "published": len(now), "layout": "table"}

    def _grants_of(self, table: str) -> list[tuple[str, str]]:
        """(grantee, privilege) of what `table`'s owner granted on it: readers' SELECT."""
        return [(grantee, privilege) for grantee, privilege in self.query(
            """SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) END,
                      a.privilege_type
            FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
            WHERE c.oid = to_regclass(?) AND a.grantee <> c.relowner ORDER BY 1, 2""", (_quote(table),))]

    def _grant(self, table: str, grants: list[tuple[str, str]]) -> None:
        """A reader table made again keeps the grants the one it replaces had."""
        for grantee, privilege in grants:
            self.execute(f"GRANT {privilege} ON {_quote(table)} TO {grantee}")

    def _partitions_of(self, table: str, *, limit: int | None = None) -> list[str]:
        """The tables attached to the partitioned `table` (the first `limit` by name)."""
        return [c for (c,) in self.query(
            """SELECT c.relname FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS c
            ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(?) ORDER BY c.relname LIMIT ?""",
            (_quote(table), limit))]

    def _retire(self, table: str) -> None:
        """A partitioned table readers no longer read lets its partitions (version
        tables) go, `conversion_batch` a transaction, and is dropped."""
        while self._relation_kind(table) is not None:
            with self.transaction():
                children = self._partitions_of(table, limit=self.conversion_batch)
                for child in children:
                    self.execute(f"ALTER TABLE {_quote(table)} DETACH PARTITION {_quote(child)}")
                if not children:
                    self.execute(f"DROP TABLE {_quote(table)}")

    def _finish_indexes(self, spec: DatasetSpec, table: str) -> None:
        """The declared indexes on a version's table, those it lacks."""
        for columns in spec.indexes:
            if self.table_exists(table) and not self._has_index_on(table, columns):
                self.execute(f"CREATE INDEX {_quote(_index_name(table, columns))} ON {_quote(table)} "
                             f"({', '.join(_quote(c) for c in columns)})")

    def _show_all(self, spec: DatasetSpec, current: dict[str, str]) -> None:
        """The reader table, just made, shows the published version of each partition."""
        layout = self._layout_for(spec)
        for partition, run_id in sorted(current.items()):
            table = self._version_table_of(spec.name, run_id)
            if layout == "table":
                self._copy_in(spec.name, spec.partition_key_column, partition, run_id, replace=False)
            else:
                self.execute(f"ALTER TABLE {_quote(spec.name)} ATTACH PARTITION {_quote(table)} "
                             f"FOR VALUES IN ({_literal(partition)})")

    # -- numbers and fingerprint ------------------------------------------------------

    def _numbers_and_fingerprint(self, spec: DatasetSpec, run_id: str) -> tuple[VersionNumbers, str]:
        """Both at commit, inside the staging transaction, from the run's freshly
        written rows (in shared buffers), in two statements: one scan for the rows,
        the rows with a NULL key part, the measure's sum and the fingerprint, which the
        server may run in parallel workers (`_scan_sql`), and one for the distinct
        complete keys (`_distinct_keys_sql`; COUNT(DISTINCT) keeps a plan serial).

        Measured (1,000,000 rows, PostgreSQL 15, 2 cores; docs/performance.md): the
        two statements 0.40 + 0.38 s against 1.15 s for the earlier single scan that
        computed everything serially, and 1.84-1.90 s for a data-modifying CTE
        aggregating the INSERT's own RETURNING rows (they go through a tuplestore)."""
        table = self._stored_table(spec, run_id)
        own = table != spec.name  # the version's own table holds nothing else
        where, params = ("", ()) if own else ('WHERE "_run_id" = ?', (run_id,))
        row_count, null_keys, measure, lane = self.query(self._scan_sql(spec, _quote(table), where), params)[0]
        (distinct,) = self.query(self._distinct_keys_sql(spec, _quote(table), where), params)[0]
        numbers = self._to_numbers((row_count, null_keys, measure, distinct))
        return numbers, self._fingerprint_of(lane)

    def _scan_sql(self, spec: DatasetSpec, table: str, where: str) -> str:
        """Row count, rows with a NULL key part, measure sum and the fingerprint's sum
        of row hashes, in this order, from one scan of `table` (`where`: its filter).
        Each aggregate takes its input straight from the row, the row hash once, so
        the plan may be a parallel one (partial sums in the workers)."""
        any_null = " OR ".join(f"{_quote(k)} IS NULL" for k in spec.business_key)
        measure = f"SUM({_quote(spec.core_measure)})" if spec.core_measure else "NULL"
        return (f"SELECT COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0), {measure}, "
                f"SUM({self._row_hash_sql(spec)}) FROM {table} {where}")

    def _distinct_keys_sql(self, spec: DatasetSpec, table: str, where: str) -> str:
        """The distinct complete keys of `table`: COUNT(DISTINCT) of the key (a row of
        its columns if it has several, complete ones only), exact, sorted inside the
        aggregate; text parts compared bytewise (COLLATE "C": equality is the same for
        the deterministic collations, and the sort several times cheaper than the
        locale's). Grouping the rows by key instead spills a hash table of one group
        per key: 1.34 s against 0.49 s for 1,000,000 keys."""
        parts = []
        for name in spec.business_key:
            declared = next((c for c in spec.columns if c.name == name), None)
            text = declared is not None and declared.type == "text"
            parts.append(f'{_quote(name)} COLLATE "C"' if text else _quote(name))
        all_set = " AND ".join(f"{_quote(k)} IS NOT NULL" for k in spec.business_key)
        key = parts[0] if len(parts) == 1 else f"ROW({', '.join(parts)})"
        distinct = f"COUNT(DISTINCT {key})" + ("" if len(parts) == 1 else f" FILTER (WHERE {all_set})")
        return f"SELECT {distinct} FROM {table} {where}"

    # The fingerprint's kind (base.fingerprint_kind). Kind "" (bare hex, before it was
    # named) summed each row hash and a bit-mixed copy of it in two lanes over a
    # subquery computing the hash once (OFFSET 0), which kept the scan serial; "v2" is
    # the sum of the row hashes alone, 64 bits, taken in parallel.
    FINGERPRINT_KIND = "v2"

    def _fingerprint(self, spec: DatasetSpec, run_id: str) -> str:
        (lane,) = self.query(
            f'SELECT SUM({self._row_hash_sql(spec)}) FROM {_quote(self._stored_table(spec, run_id))} '
            'WHERE "_run_id" = ?',
            (run_id,),
        )[0]
        return self._fingerprint_of(lane)

    @classmethod
    def _fingerprint_of(cls, lane: Any) -> str:
        """The fingerprint of a sum of row hashes (NULL: no rows): modulo 2**64, so a
        sum counts every copy of a row and no order or overflow changes it."""
        return f"{cls.FINGERPRINT_KIND}:{int(lane or 0) % 2**64:016x}"

    @staticmethod
    def _row_hash_sql(spec: DatasetSpec) -> str:
        """A 64-bit hash of a row's declared columns (PostgreSQL 14+).

        hash_record_extended hashes each field with its type's own hash function: no
        text rendering (five times faster than md5 of the row's text, measured), no
        dependence on session settings (TimeZone, DateStyle), NULL distinct from ''.
        Numbers are rounded to the sixth decimal first, so float noise below it does
        not count; numeric hashing already ignores trailing zeros, so a value with at
        most six decimals hashes as its rounded self and is not rounded (the same
        fingerprint, ~10% less of the hash's time at 1,000,000 rows)."""
        places = FINGERPRINT_DECIMALS

        def rounded(name: str) -> str:
            return f"CASE WHEN scale({name}) > {places} THEN round({name}, {places}) ELSE {name} END"

        values = ", ".join(rounded(_quote(c.name)) if c.type == "numeric" else _quote(c.name) for c in spec.columns)
        return f"hash_record_extended(ROW({values}), 0)"
