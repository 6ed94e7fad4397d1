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
from urllib.parse import urlparse

import psycopg

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import (
    BOOKKEEPING_COLUMNS,
    FINGERPRINT_DECIMALS,
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

    def _partition_key_of(self, name: str) -> str | None:
        """The column `<name>` is partitioned on, or None if it is not partitioned."""
        rows = self.query(
            """SELECT a.attname FROM pg_catalog.pg_partitioned_table AS p
            JOIN pg_catalog.pg_attribute AS a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]
            WHERE p.partrelid = to_regclass(?)""", (_quote(name),))
        return rows[0][0] if rows else None

    def _index_names(self, table: str) -> set[str]:
        return {name for (name,) in self.query(
            """SELECT c.relname FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
            WHERE i.indrelid = to_regclass(?)""", (_quote(table),))}

    def _reader_indexes(self, spec: DatasetSpec) -> list[tuple[str, ...]]:
        # Partition pruning finds a partition; only the declared indexes are needed.
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
        wanted = {_index_name(spec.name, columns) for columns in spec.indexes}
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
            columns = [f"{_quote(c.name)} {self._physical(c.type)}" for c in spec.columns]
            columns += ['"_run_id" text NOT NULL', '"_partition" text NOT NULL', '"_attempt" integer']
            self.execute(f"CREATE TABLE {_quote(spec.name)} ({', '.join(columns)}) "
                         f"PARTITION BY LIST ({_quote(spec.partition_key_column)})")
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
        columns = [f"{_quote(name)} {kind}" for name, kind in self._columns_of(spec.name).items()
                   if name not in BOOKKEEPING_COLUMNS]
        self.execute(f"CREATE TABLE {_quote(table)} ({', '.join(columns)})")

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
        have left one), and a new one is made."""
        table = self.version_table(spec, run_id)
        self.execute(f"DROP TABLE IF EXISTS {_quote(table)}")
        self._create_version_table(spec, table)

    def _finish_version(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str) -> None:
        """The bookkeeping columns and the partition's CHECK (`_add_bookkeeping`), then
        the declared indexes, built once over the loaded rows (cheaper than keeping
        them up row by row), matching the reader table's so the ATTACH adopts them."""
        table = self.version_table(spec, run_id)
        self._add_bookkeeping(spec, table, run_id=run_id, attempt_no=attempt_no, partition=partition)
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
        constraint, so nothing is scanned)."""
        parent = _quote(name)
        if previous_run_id is not None:
            old = self._version_table_of(name, previous_run_id)
            if self._attached(name, old):
                self.execute(f"ALTER TABLE {parent} DETACH PARTITION {_quote(old)}")
        self.execute(f"ALTER TABLE {parent} ATTACH PARTITION {_quote(self._version_table_of(name, run_id))} "
                     f"FOR VALUES IN ({_literal(partition)})")

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
        parts = [f'SELECT {columns} FROM {_quote(t if t in existing else spec.name)} WHERE "_run_id" = ?'
                 + ("" if t in existing else " AND false") for t in tables]
        return "(" + " UNION ALL ".join(parts) + ")"

    def upgrade_layout(self, spec: DatasetSpec) -> dict[str, Any]:
        """From the view layout (`<name>` a view over `<name>__versions` joined to the
        pointer), or a reader table partitioned on another column than the catalog now
        names, to this one, in one transaction: every committed version gets its own
        table (with its CHECK and indexes), the published ones are attached, the
        markers, pointers and history stay as they are; the old heap goes."""
        self._ensure_meta_once()
        kind = self._relation_kind(spec.name)
        key = self._partition_key_of(spec.name)
        if kind is None or (kind == "table" and key == spec.partition_key_column):
            return {}
        with self.transaction():
            self._lock(f"dataset:{spec.name}")
            self._ready.discard(spec)
            runs = self.query('SELECT "run_id", "partition", "attempt_no" FROM "_bf_markers" WHERE "dataset" = ? '
                              'ORDER BY "run_id"', (spec.name,))
            current = dict(self.query('SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ?',
                                      (spec.name,)))
            if kind == "view":
                heap = spec.versions_table
                self.execute(f"DROP VIEW {_quote(spec.name)}")
            else:  # partitioned on another column: the versions move to new tables too
                heap = f"{spec.name}__upgrading"
                self.execute(f"ALTER TABLE {_quote(spec.name)} RENAME TO {_quote(heap)}")
                for run_id, _, _ in runs:
                    table = self._version_table_of(spec.name, run_id)
                    if self.table_exists(table):
                        self.execute(f"ALTER TABLE {_quote(table)} RENAME TO {_quote(table + '_old')}")
            stored = self._columns_of(heap)
            columns = [f"{_quote(c)} {t}" for c, t in stored.items() if c not in BOOKKEEPING_COLUMNS]
            columns += ['"_run_id" text NOT NULL', '"_partition" text NOT NULL', '"_attempt" integer']
            self.execute(f"CREATE TABLE {_quote(spec.name)} ({', '.join(columns)}) "
                         f"PARTITION BY LIST ({_quote(spec.partition_key_column)})")
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
            for partition, run_id in current.items():
                self.execute(f"ALTER TABLE {_quote(spec.name)} ATTACH PARTITION "
                             f"{_quote(self._version_table_of(spec.name, run_id))} FOR VALUES IN ({_literal(partition)})")
            self.execute(f"DROP TABLE {_quote(heap)}" + (" CASCADE" if kind != "view" else ""))
        self._ready.add(spec)
        return {"versions": len(runs), "published": len(current)}

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
