"""An Apache Iceberg warehouse: every produced dataset is an Iceberg table (pyiceberg's
SQL catalog on SQLite or PostgreSQL, data files under a warehouse location), and SQL
jobs, checks and `query` run in DuckDB over the pinned versions' Parquet files.

    iceberg+sqlite:///var/catalog.db?warehouse=/var/warehouse
    iceberg+postgresql://user@host:5432/catalog?warehouse=/srv/warehouse

The layout and the reasons are docs/iceberg.md. In short: a run writes its data files
under `<table>/data/<partition column>=<key>/_runs/<run_id>/` and then a commit marker
(`_bf_marker.json`: attempt, files, numbers and fingerprint taken from the rows as they
were written) there, indexed in the catalog database; nothing a reader of the table sees
changes. Publishing is ONE Iceberg commit that removes the partition's live files and
adds the run's, and sets the table property `bf.current.<partition>` (the pointer) in the
same metadata commit; our compare-and-set is the check of that property on the snapshot
the commit is based on, and the commit's own requirement that the branch is still at that
snapshot (a lost race: CommitFailedException, reload, check again). pyiceberg's retries
are off (`commit.retry.num-retries=0`): a retry must re-check the pointer, which only we
know how to do. The publication history is a table of the catalog database, each row
also carried by its snapshot's summary (`bf.*`) so a crash between the commit and the
row is repaired from the table itself.

The warehouse is a local directory or an object store (`?warehouse=s3://bucket/prefix`,
with pyiceberg's `s3.*` properties in the query: `s3.endpoint`, `s3.region`, keys or the
AWS environment); every file goes through `storage.Storage`. A run's writer lock is an
flock locally and a lease row of the catalog database on an object store (no file locks
there).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

from backfill_portal.backends import register_backend
from backfill_portal.backends.base import (
    BOOKKEEPING_COLUMNS,
    FINGERPRINT_DECIMALS,
    MAX_DATASET_NAME,
    AlreadyCommitted,
    ColumnSpec,
    DatasetSpec,
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
    identifier,
    rounded_measure,
)
from backfill_portal.backends.storage import Storage
from backfill_portal.core.errors import ValidationError

logger = logging.getLogger(__name__)

MARKER_FILE = "_bf_marker.json"
LOCK_FILE = "_bf_writer.lock"
POINTER_PREFIX = "bf.current."
SOURCE_PROPERTY = "bf.source"  # a source table's (load_source); a produced dataset's has bf.partition-column
LOAD_PREFIX = "bf.load."  # + load key = rows: the keyed loads of a source, set in their commit
NAMESPACE = "backfill"
# The catalog's name in pyiceberg's tables (a reader opens SqlCatalog under it).
CATALOG_NAME = "backfill"
# The engine's type of each declared column type (DuckDB), and Iceberg's.
DUCK_TYPES = {"text": "VARCHAR", "integer": "BIGINT", "numeric": "DOUBLE", "timestamp": "TIMESTAMPTZ",
              "date": "DATE", "boolean": "BOOLEAN"}
BOOKKEEPING_TYPES = {"_run_id": "text", "_partition": "text", "_attempt": "integer"}
CHUNK = 500
# Snapshots a table keeps after each publishing commit (the newest; see
# _expire_old_snapshots): enough for time travel over the last publishes.
RETAINED_SNAPSHOTS = 20
# A source table's old snapshots are expired this many at a time (_expire_source_snapshots):
# each expiry reads the retained snapshots' manifests.
SOURCE_EXPIRY_BATCH = 10
# A writer's lease on an object store (_Lease), unless the URL's `writer_lease` says:
# renewed every quarter of it while the writer lives; a killed writer's run directory
# is the sweep's this long after its last renewal.
LEASE_SECONDS = 60.0
ROW_HASH = "_bf_row_md5"  # the numbers query's per-row hash (not a column name a dataset may use)


def _quote(name: str) -> str:
    return f'"{name}"'


def _literal(value: str) -> str:
    """A string as a DuckDB literal, for rendered SQL: `?` and control characters are
    refused like the SQL backends do (a rendered template may be parameterised later)."""
    if not isinstance(value, str) or any(ch == "?" or ord(ch) < 32 for ch in value):
        raise ValidationError(f"{value!r} cannot be rendered as a SQL literal")
    return "'" + value.replace("'", "''") + "'"


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def _iceberg_type(logical: str):
    from pyiceberg.types import BooleanType, DateType, DoubleType, LongType, StringType, TimestamptzType

    return {"text": StringType(), "integer": LongType(), "numeric": DoubleType(), "timestamp": TimestamptzType(),
            "date": DateType(), "boolean": BooleanType()}[logical]


def _add_columns(txn, columns: Sequence[ColumnSpec]) -> None:
    """Add `columns` to the table of the pyiceberg transaction `txn`, and keep its
    default name mapping (how readers match Parquet columns by name) up to date."""
    with txn.update_schema() as update:
        for col in columns:
            update.add_column(col.name, _iceberg_type(col.type))
    txn.set_properties({"schema.name-mapping.default": txn.table_metadata.schema().name_mapping.model_dump_json()})


def _logical_type(iceberg_type) -> str:
    from pyiceberg.types import BooleanType, DateType, DoubleType, LongType, StringType, TimestamptzType

    for logical, cls in (("text", StringType), ("integer", LongType), ("numeric", DoubleType),
                         ("timestamp", TimestamptzType), ("date", DateType), ("boolean", BooleanType)):
        if isinstance(iceberg_type, cls):
            return logical
    return str(iceberg_type)


def _live_overwrite(table, txn, summary: dict[str, str]):
    """The overwrite of one publishing commit, whose manifest list holds only manifests
    with live files (and this snapshot's own record of what it deleted).

    pyiceberg 0.12's overwrite carries every earlier snapshot's manifests forward,
    including the ones that only record deleted files: a reader planned over one more
    manifest per publish (benchmarks/reader_cost_iceberg.py: 1.94 over a plain table).
    Iceberg's own writers drop a manifest once none of its entries is live; this does
    the same in the producer's post-processing hook. There is no rewrite_manifests in
    pyiceberg 0.12, hence the subclass of its overwrite (pinned: pyproject.toml)."""
    from pyiceberg.manifest import ManifestContent
    from pyiceberg.table.snapshots import Operation
    from pyiceberg.table.update.snapshot import _OverwriteFiles

    class LiveOverwrite(_OverwriteFiles):
        def _process_manifests(self, manifests):
            return [m for m in manifests
                    if m.content != ManifestContent.DATA or m.added_snapshot_id == self._snapshot_id
                    or m.has_added_files() or m.has_existing_files()]

    branch = "main"
    return LiveOverwrite(
        operation=Operation.OVERWRITE if txn.table_metadata.snapshot_by_name(branch) is not None else Operation.APPEND,
        transaction=txn, io=table.io, branch=branch, snapshot_properties=summary)


# -- values: Python -> what the Parquet column holds ---------------------------------------


def _converter(col: ColumnSpec):
    """The column's canonical value (ColumnSpec.parser) as the Parquet column holds it:
    numbers as doubles, instants as aware UTC datetimes."""
    parse = col.parser()
    if col.type == "numeric":
        return lambda v: None if (v := parse(v)) is None else float(v)
    if col.type == "timestamp":
        def timestamp(v):
            v = parse(v)
            if v is None:
                return None
            if v.tzinfo is None or v.utcoffset() is None:
                raise ValueError("a naive datetime is ambiguous: give it a timezone")
            return v.astimezone(timezone.utc)
        return timestamp
    return parse


def _row_text_sql(spec: DatasetSpec, alias: str = "") -> str:
    """DuckDB: one canonical text per row of the declared columns, each value length-
    prefixed (so NULL, '' and ('x', 12) vs ('x1', 2) differ), numbers rounded like every
    backend's fingerprint, instants as epoch microseconds."""
    parts = []
    for col in spec.columns:
        ref = f"{alias}{_quote(col.name)}"
        rendered = {
            "text": ref,
            "integer": f"CAST({ref} AS VARCHAR)",
            "numeric": f"printf('%.{FINGERPRINT_DECIMALS}f', round({ref}, {FINGERPRINT_DECIMALS}) + 0.0)",
            "timestamp": f"CAST(epoch_us({ref}) AS VARCHAR)",
            "date": f"CAST({ref} AS VARCHAR)",
            "boolean": f"CASE WHEN {ref} THEN 't' ELSE 'f' END",
        }[col.type]
        parts.append(f"COALESCE(CAST(length({rendered}) AS VARCHAR) || ':' || {rendered}, 'n')")
    return " || '|' || ".join(parts)


def _numbers_sql(spec: DatasetSpec, source: str) -> str:
    keys = [_quote(k) for k in spec.business_key]
    any_null = " OR ".join(f"{k} IS NULL" for k in keys)
    none_null = " AND ".join(f"{k} IS NOT NULL" for k in keys)
    key = keys[0] if len(keys) == 1 else f"({', '.join(keys)})"
    measure = f"SUM({_quote(spec.core_measure)})" if spec.core_measure else "NULL"
    # One MD5 per row, split in two 64-bit halves (md5_number_upper and _lower each hash
    # the row again: twice the pass). DuckDB's md5_number_upper is the UHUGEINT's low
    # 64 bits, md5_number_lower its high ones: the same sums, the same fingerprints.
    hashed = f"(SELECT *, md5_number({_row_text_sql(spec)}) AS {ROW_HASH} FROM {source}) AS bf_hashed"
    return (f"SELECT COUNT(*), COUNT(*) FILTER (WHERE {any_null}), "
            f"COUNT(DISTINCT {key}) FILTER (WHERE {none_null}), {measure}, "
            f"SUM(CAST({ROW_HASH} & CAST({2**64 - 1} AS UHUGEINT) AS UBIGINT)), "
            f"SUM(CAST({ROW_HASH} >> 64 AS UBIGINT)) FROM {hashed}")


def _beyond_retention(table) -> list:
    """The table's snapshots older than its newest RETAINED_SNAPSHOTS, but any a branch or
    tag points at (one a reader created), oldest first."""
    snapshots = sorted(table.metadata.snapshots, key=lambda s: (s.sequence_number or 0, s.timestamp_ms))
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    return [s for s in snapshots[:-RETAINED_SNAPSHOTS] if s.snapshot_id not in protected]


def _fingerprint_of(upper, lower) -> str:
    return f"{int(upper or 0) % 2**64:016x}{int(lower or 0) % 2**64:016x}"


@register_backend("iceberg")
class IcebergWarehouse(WarehouseBackend):
    """Iceberg tables in pyiceberg's SQL catalog; DuckDB as the engine (docs/iceberg.md)."""

    dialect = "duckdb"

    def __init__(self, url: str, **kwargs: Any):
        super().__init__(url, **kwargs)
        parsed = urlparse(url)
        kind = parsed.scheme.partition("+")[2]
        query = parse_qs(parsed.query)
        if kind == "sqlite":
            path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
            if not path:
                raise ValidationError("WAREHOUSE_URL: iceberg+sqlite:///<catalog file> needs a path",
                                      field="WAREHOUSE_URL")
            self.catalog_uri = f"sqlite:///{path}"
            default_wh = str(Path(path).resolve().parent / "iceberg-warehouse")
        elif kind in ("postgresql", "postgres"):
            self.catalog_uri = parsed._replace(scheme="postgresql+psycopg", query="").geturl()
            default_wh = ""
        else:
            raise ValidationError(
                f"WAREHOUSE_URL: iceberg+{kind or '?'}:// is not a catalog this backend knows "
                "(iceberg+sqlite:///path or iceberg+postgresql://...)", field="WAREHOUSE_URL")
        self.warehouse_path = (query.get("warehouse") or [default_wh])[0]
        if not self.warehouse_path:
            raise ValidationError("WAREHOUSE_URL: ?warehouse=<path> is required for a PostgreSQL catalog",
                                  field="WAREHOUSE_URL")
        # pyiceberg's FileIO properties (s3.endpoint, s3.region, s3.access-key-id, ...):
        # the catalog's FileIO and the portal's own files use the same.
        self.io_properties = {k: v[0] for k, v in query.items() if k.startswith("s3.")}
        self.storage = Storage(self.warehouse_path, self.io_properties)
        lease = (query.get("writer_lease") or [str(LEASE_SECONDS)])[0]
        try:
            self.writer_lease = float(lease)
        except ValueError:
            self.writer_lease = 0.0
        if not 1 <= self.writer_lease <= 86400:
            raise ValidationError(f"WAREHOUSE_URL: writer_lease={lease} must be seconds between 1 and 86400",
                                  field="WAREHOUSE_URL")
        self.warehouse_path = self.storage.root
        self.namespace = (query.get("namespace") or [NAMESPACE])[0]
        self.catalog_name = CATALOG_NAME
        identifier(self.namespace, what="namespace")
        self._catalog = None
        self._catalog_lock = threading.Lock()
        self._local = threading.local()
        self._ready: set[tuple] = set()
        self._meta_ready = False
        self._data_file_cache: dict[tuple, Any] = {}

    # -- connections ------------------------------------------------------------------

    @property
    def catalog(self):
        if self._catalog is None:
            with self._catalog_lock:
                if self._catalog is None:
                    from pyiceberg.catalog.sql import SqlCatalog

                    try:
                        self._catalog = SqlCatalog(CATALOG_NAME, uri=self.catalog_uri,
                                                   warehouse=self.warehouse_uri, **self.io_properties)
                    except Exception as exc:
                        raise WarehouseUnavailable(f"Iceberg catalog {self.catalog_label}: {exc}") from exc
        return self._catalog

    @property
    def catalog_label(self) -> str:
        """The catalog's URL fit for a message or a log: its password masked."""
        from sqlalchemy.engine import make_url

        return make_url(self.catalog_uri).render_as_string(hide_password=True)

    @property
    def warehouse_uri(self) -> str:
        """The warehouse root as Iceberg names it (file:///... or s3://...)."""
        return self.storage.uri(self.storage.root)

    @property
    def engine(self):
        """The catalog database (SQLAlchemy): pyiceberg's tables and ours."""
        return self.catalog.engine

    @property
    def duck(self):
        """This thread's DuckDB connection (in memory; nothing is kept in it)."""
        con = getattr(self._local, "duck", None)
        if con is None:
            import duckdb

            con = duckdb.connect()
            con.execute("SET TimeZone = 'UTC'")
            if not self.storage.local:
                con.register_filesystem(self.storage.fsspec())
            self._local.duck = con
        return con

    def close(self) -> None:
        con = getattr(self._local, "duck", None)
        if con is not None:
            con.close()
            self._local.duck = None

    def probe(self, *, timeout: float | None = None) -> None:
        import sqlalchemy

        args = {}
        if self.catalog_uri.startswith("postgresql"):
            args = {"connect_timeout": max(1, int(timeout or 5))}
        elif not Path(self.catalog_uri.removeprefix("sqlite:///")).parent.is_dir():
            raise WarehouseUnavailable(f"Iceberg catalog {self.catalog_label}: its directory does not exist")
        engine = sqlalchemy.create_engine(self.catalog_uri, connect_args=args, poolclass=sqlalchemy.pool.NullPool)
        try:
            with engine.connect() as conn:
                conn.execute(sqlalchemy.text("SELECT 1"))
        except Exception as exc:
            raise WarehouseUnavailable(f"Iceberg catalog {self.catalog_label}: {exc}") from exc
        finally:
            engine.dispose()
        self.storage.probe()

    def _sql(self, statement: str, params: dict | None = None, *, write: bool = False) -> list[tuple]:
        import sqlalchemy

        with (self.engine.begin() if write else self.engine.connect()) as conn:
            result = conn.execute(sqlalchemy.text(statement), params or {})
            return [tuple(r) for r in result] if result.returns_rows else []

    # -- schema -----------------------------------------------------------------------

    def ensure_meta(self) -> None:
        if self._meta_ready:
            return
        postgres = self.catalog_uri.startswith("postgresql")
        serial = "BIGSERIAL PRIMARY KEY" if postgres else "INTEGER PRIMARY KEY AUTOINCREMENT"
        number = "DOUBLE PRECISION" if postgres else "REAL"
        for statement in (
            f"""CREATE TABLE IF NOT EXISTS bf_ice_markers (run_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
                "partition" TEXT NOT NULL, attempt_no INTEGER NOT NULL, row_count BIGINT NOT NULL,
                fingerprint TEXT NOT NULL, committed_at TEXT NOT NULL, null_keys BIGINT, distinct_keys BIGINT,
                measure_sum {number}, numbers_of TEXT, location TEXT NOT NULL, files TEXT NOT NULL,
                columns TEXT NOT NULL)""",
            f"""CREATE TABLE IF NOT EXISTS bf_ice_publications (id {serial}, dataset TEXT NOT NULL,
                "partition" TEXT NOT NULL, run_id TEXT NOT NULL, previous_run_id TEXT, action TEXT NOT NULL,
                actor TEXT NOT NULL, published_at TEXT NOT NULL, snapshot_id BIGINT NOT NULL,
                UNIQUE (snapshot_id, "partition"))""",
            """CREATE INDEX IF NOT EXISTS bf_ice_publications_partition
                ON bf_ice_publications (dataset, "partition", id)""",
            # An object store's writer leases (_Lease): one per run directory being written.
            f"""CREATE TABLE IF NOT EXISTS bf_ice_writers (location TEXT PRIMARY KEY, token TEXT NOT NULL,
                expires_at {number} NOT NULL)""",
        ):
            self._sql(statement, write=True)
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception as exc:  # two processes creating it at once
            from pyiceberg.exceptions import NamespaceAlreadyExistsError

            if not isinstance(exc, NamespaceAlreadyExistsError):
                raise
        self.storage.make_dir(self.warehouse_path)
        self._meta_ready = True

    def _ident(self, name: str) -> tuple[str, str]:
        identifier(name, what="dataset", max_length=MAX_DATASET_NAME)
        return (self.namespace, name)

    def table_location(self, name: str) -> str:
        """Where a dataset's table is (a local directory or an object store prefix)."""
        return self.storage.join(self.warehouse_path, self.namespace, name)

    def table_uri(self, name: str) -> str:
        """Where a dataset's table is, as Iceberg and lineage name it (file:///... or s3://...)."""
        return self.storage.uri(self.table_location(name))

    def _load(self, name: str):
        """The table as the catalog has it now, or None."""
        from pyiceberg.exceptions import NoSuchTableError

        self.ensure_meta()
        try:
            return self.catalog.load_table(self._ident(name))
        except NoSuchTableError:
            return None

    def _iceberg_schema(self, spec: DatasetSpec):
        from pyiceberg.schema import Schema
        from pyiceberg.types import NestedField

        columns = [(c.name, c.type) for c in spec.columns] + list(BOOKKEEPING_TYPES.items())
        return Schema(*(NestedField(i, name, _iceberg_type(t), required=False)
                        for i, (name, t) in enumerate(columns, start=1)))

    def ensure_dataset(self, spec: DatasetSpec) -> None:
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError

        key = (spec.name, spec.columns, spec.partition_key_column)
        if key in self._ready:
            return
        for _ in range(20):
            table = self._load(spec.name)
            if table is None:
                from pyiceberg.partitioning import PartitionField, PartitionSpec
                from pyiceberg.transforms import IdentityTransform

                schema = self._iceberg_schema(spec)
                source = schema.find_field(spec.partition_key_column)
                partitioning = PartitionSpec(PartitionField(source_id=source.field_id, field_id=1000,
                                                            transform=IdentityTransform(),
                                                            name=spec.partition_key_column))
                try:
                    self.catalog.create_table(
                        self._ident(spec.name), schema=schema, partition_spec=partitioning,
                        location=self.table_uri(spec.name),
                        properties={"commit.retry.num-retries": "0", "bf.partition-column": spec.partition_key_column,
                                    "schema.name-mapping.default": schema.name_mapping.model_dump_json()})
                except TableAlreadyExistsError:
                    continue
                break
            present = {f.name: _logical_type(f.field_type) for f in table.schema().fields}
            for col in spec.columns:
                if col.name in present and present[col.name] != col.type:
                    raise ValidationError(
                        f"{spec.name}.{col.name} is stored as {present[col.name]}; it cannot become {col.type} "
                        "(old versions must stay readable)", field=col.name)
            missing = [c for c in spec.columns if c.name not in present]
            if not missing:
                break
            try:
                with table.transaction() as txn:
                    _add_columns(txn, missing)
            except CommitFailedException:
                continue
            break
        self._ready.add(key)

    def _partition_column(self, table) -> str:
        return table.metadata.properties.get("bf.partition-column", "_partition")

    def _table_columns(self, table) -> list[tuple[str, str]]:
        return [(f.name, _logical_type(f.field_type)) for f in table.schema().fields]

    # -- where a run's files are ---------------------------------------------------------

    def run_location(self, spec_or_name: DatasetSpec | str, partition: str, run_id: str) -> str:
        """The directory a run writes its data files and its marker in."""
        name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
        column = spec_or_name.partition_key_column if isinstance(spec_or_name, DatasetSpec) else None
        if column is None:
            table = self._load(name)
            column = self._partition_column(table) if table is not None else "_partition"
        return self.storage.join(self.table_location(name), "data", f"{column}={quote(partition, safe='')}",
                                 "_runs", quote(run_id, safe=""))

    def _run_directories(self, name: str) -> dict[str, list[str]]:
        """Every run directory under the table's `data/*/_runs/`, with the files in it."""
        data = self.storage.join(self.table_location(name), "data")
        found: dict[str, list[str]] = {}
        for path in self.storage.files(data, recursive=True):
            parts = path[len(data) + 1:].split("/")
            if len(parts) == 4 and parts[1] == "_runs":
                found.setdefault(self.storage.join(data, *parts[:3]), []).append(path)
        return found

    def run_files(self, spec_or_name: DatasetSpec | str, run_id: str) -> list[str]:
        """Every data file under the run's directories (any partition, with a marker or not):
        what a writer left, committed or not."""
        name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
        run = quote(run_id, safe="")
        return sorted(f for directory, files in self._run_directories(name).items()
                      if self.storage.name(directory) == run for f in files if f.endswith(".parquet"))

    def _version_files(self, marker_row) -> list[str]:
        return [self.storage.join(marker_row["location"], f) for f in marker_row["files"]]

    # -- staging ----------------------------------------------------------------------

    @staticmethod
    def _check_run(*, run_id: str, attempt_no: int, partition: str) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValidationError("run_id must be a non-empty string", field="run_id")
        if not isinstance(partition, str) or not partition:
            raise ValidationError("partition must be a non-empty string", field="partition")
        if not isinstance(attempt_no, int) or attempt_no < 1:
            raise ValidationError("attempt_no must be a positive integer", field="attempt_no")

    def _begin(self, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str, take_over: bool):
        """Ready to write: the table exists, the run has no marker, this process holds
        the run's writer lock (`_writer_lock`), and what a dead attempt left is gone.
        Returns the attempt's `_Staging`."""
        self._check_run(run_id=run_id, attempt_no=attempt_no, partition=partition)
        self.ensure_dataset(spec)
        existing = self.marker(run_id)
        if existing is not None:
            raise AlreadyCommitted(existing)
        directory = self.run_location(spec, partition, run_id)
        self.storage.make_dir(directory)
        lock = self._writer_lock(directory)
        try:
            lock.acquire(take_over=take_over, timeout=self.lock_timeout_seconds or 3600)
            found = self._read_marker_file(directory)
            if found is not None:  # committed, but the index row was lost with its process
                self._index_marker(found)
                raise AlreadyCommitted(self._to_marker(found))
            self._discard(directory)
            table = self._load(spec.name)
        except BaseException:
            lock.release()
            raise
        return _Staging(table=table, directory=directory, lock=lock)

    @contextmanager
    def _writing(self, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str, take_over: bool):
        """One attempt's writing (`_begin`), as its `_Staging`: whatever it raises, the
        files this attempt wrote are deleted (never another's: an attempt taken over must
        not delete what its successor committed); the writer lock is released either way."""
        staging = self._begin(spec, run_id, attempt_no, partition, take_over)
        try:
            yield staging
        except BaseException:
            for written in staging.files:
                self.storage.delete(written)
            raise
        finally:
            staging.lock.release()

    def _writer_lock(self, directory: str):
        """The lock a run directory's writer holds while it writes, and the sweep takes
        before it deletes what a dead writer left: locally an flock on a file there (a
        killed writer's goes with its process); on an object store a lease row in the
        catalog database, renewed while its writer lives."""
        if self.storage.local:
            return _FileLock(self.storage.join(directory, LOCK_FILE))
        return _Lease(self, directory)

    @staticmethod
    def _arrow_schema(table):
        """The table's Arrow schema, Iceberg field ids in the fields' metadata."""
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        return schema_to_pyarrow(table.schema())

    def stage_rows(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                   rows: Iterable[Sequence], chunk_size: int = 5000, take_over: bool = False) -> Marker:
        """Each chunk of rows is a data file of its own, closed before the next is
        started (a writer killed mid-way leaves whole files, which the retry or the
        sweep deletes)."""
        import pyarrow as pa

        with self._writing(spec, run_id, attempt_no, partition, take_over) as staging:
            schema = self._arrow_schema(staging.table)
            converters = [_converter(c) for c in spec.columns]
            written: list = []
            chunk: list[tuple] = []
            n = 0

            def flush():
                nonlocal chunk, n
                if chunk:
                    batch = self._batch(pa, schema, spec, chunk, run_id, attempt_no, partition)
                    self._write_file(staging, f"part-{attempt_no:03d}-{n:05d}.parquet", batch)
                    written.append(batch)
                    n += 1
                    chunk = []

            for row in rows:
                chunk.append(self._convert_row(spec, converters, row, partition))
                if len(chunk) >= chunk_size:
                    flush()
            flush()
            data = pa.Table.from_batches(written, schema=schema) if written else schema.empty_table()
            return self._commit_marker(spec, run_id, attempt_no, partition, staging, data)

    @staticmethod
    def _convert_row(spec: DatasetSpec, converters, row: Sequence, partition: str) -> tuple:
        values = convert_row(spec, converters, row)
        if spec.partition_column:
            got = values[spec.column_names.index(spec.partition_column)]
            if got != partition:
                raise ValidationError(f"{spec.name}.{spec.partition_column}: a row of partition {partition!r} "
                                      f"holds {got!r}", field=spec.partition_column)
        return values

    def _batch(self, pa, schema, spec: DatasetSpec, chunk: list[tuple], run_id: str, attempt_no: int,
               partition: str):
        columns = {}
        names = spec.column_names
        for i, name in enumerate(names):
            columns[name] = [row[i] for row in chunk]
        fill = {"_run_id": run_id, "_partition": partition, "_attempt": attempt_no}
        arrays = []
        for field in schema:
            if field.name in columns:
                arrays.append(pa.array(columns[field.name], type=field.type))
            elif field.name in fill:
                arrays.append(pa.array([fill[field.name]] * len(chunk), type=field.type))
            else:
                arrays.append(pa.nulls(len(chunk), type=field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _write_file(self, staging: _Staging, name: str, data) -> None:
        """A data file of the attempt in its run directory, recorded as the attempt's."""
        import pyarrow as pa

        location = self.storage.join(staging.directory, name)
        staging.files.append(location)
        self.storage.write_parquet(location, data if isinstance(data, pa.Table) else pa.Table.from_batches([data]))

    def _discard(self, directory: str) -> list[str]:
        """Delete every file of the run directory but its lock file; returns them."""
        doomed = [f for f in self.storage.files(directory) if self.storage.name(f) != LOCK_FILE]
        for leftover in doomed:
            self.storage.delete(leftover)
        return doomed

    def stage_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                     select_sql: str, params: Sequence = (), take_over: bool = False) -> Marker:
        """DuckDB runs the SELECT into Arrow; the rows are cast to the declared types,
        counted and fingerprinted there and written as one data file."""
        with self._writing(spec, run_id, attempt_no, partition, take_over) as staging:
            table = staging.table
            schema = self._arrow_schema(table)
            present = set(self.columns_of(select_sql, params))
            missing = [c for c in spec.column_names if c not in present]
            if missing:
                raise ValidationError(f"the SELECT of {spec.name} has no column {missing[0]!r}", field=missing[0])
            declared = {c.name: c for c in spec.columns}
            fill = {"_run_id": _literal(run_id), "_partition": _literal(partition), "_attempt": str(attempt_no)}
            projection = []
            for field in schema:
                duck = DUCK_TYPES[_logical_type(table.schema().find_field(field.name).field_type)]
                if field.name in declared:
                    projection.append(f"CAST(q.{_quote(field.name)} AS {duck}) AS {_quote(field.name)}")
                elif field.name in fill:
                    projection.append(f"CAST({fill[field.name]} AS {duck}) AS {_quote(field.name)}")
                else:
                    projection.append(f"CAST(NULL AS {duck}) AS {_quote(field.name)}")
            data = self.duck.sql(f"SELECT {', '.join(projection)} FROM ({select_sql}) AS q",
                                 params=list(params) or None).to_arrow_table()
            data = data.cast(schema)
            if spec.partition_column:
                import pyarrow.compute as pc

                wrong = data.filter(pc.invert(pc.fill_null(pc.equal(data[spec.partition_column], partition), False)))
                if wrong.num_rows:
                    raise ValidationError(
                        f"{spec.name}.{spec.partition_column}: a row of partition {partition!r} holds "
                        f"{wrong[spec.partition_column][0].as_py()!r}", field=spec.partition_column)
            if data.num_rows:
                self._write_file(staging, f"part-{attempt_no:03d}-00000.parquet", data)
            return self._commit_marker(spec, run_id, attempt_no, partition, staging, data)

    def _commit_marker(self, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str, staging: _Staging,
                       data) -> Marker:
        """The numbers and fingerprint of the rows just written (the Arrow data in memory,
        not the files read back), then the marker file (`Storage.write_whole`: it exists
        whole or not at all), then its index row. A writer whose lease was taken over
        (an attempt presumed dead) stops before its marker."""
        con = self.duck
        con.register("bf_staged", data)
        try:
            rows, null_keys, distinct, measure, upper, lower = con.execute(
                _numbers_sql(spec, "bf_staged")).fetchall()[0]
        finally:
            con.unregister("bf_staged")
        marker = {
            "run_id": run_id, "attempt_no": attempt_no, "dataset": spec.name, "partition": partition,
            "row_count": int(rows), "fingerprint": _fingerprint_of(upper, lower),
            "committed_at": _now().isoformat(), "null_keys": int(null_keys), "distinct_keys": int(distinct),
            "measure_sum": rounded_measure(measure), "numbers_of": spec.numbers_of,
            "location": staging.directory,
            "files": sorted(self.storage.name(f) for f in staging.files),
            "columns": [f.name for f in staging.table.schema().fields],
        }
        staging.lock.confirm()
        self.storage.write_whole(self.storage.join(staging.directory, MARKER_FILE), json.dumps(marker))
        self._index_marker(marker)
        return self._to_marker(marker)

    def _read_marker_file(self, directory: str) -> dict | None:
        text = self.storage.read_text(self.storage.join(directory, MARKER_FILE))
        return None if text is None else json.loads(text)

    def _index_marker(self, m: dict) -> None:
        self._sql(
            """INSERT INTO bf_ice_markers (run_id, dataset, "partition", attempt_no, row_count, fingerprint,
                committed_at, null_keys, distinct_keys, measure_sum, numbers_of, location, files, columns)
                VALUES (:run_id, :dataset, :partition, :attempt_no, :row_count, :fingerprint, :committed_at,
                :null_keys, :distinct_keys, :measure_sum, :numbers_of, :location, :files, :columns) ON CONFLICT (run_id) DO NOTHING""",
            {**m, "files": json.dumps(m["files"]), "columns": json.dumps(m["columns"])}, write=True)

    @staticmethod
    def _to_marker(m: dict) -> Marker:
        return Marker(run_id=m["run_id"], attempt_no=m["attempt_no"], dataset=m["dataset"], partition=m["partition"],
                      row_count=m["row_count"], fingerprint=m["fingerprint"],
                      committed_at=datetime.fromisoformat(m["committed_at"]), null_keys=m["null_keys"],
                      distinct_keys=m["distinct_keys"], measure_sum=m["measure_sum"], numbers_of=m["numbers_of"])

    MARKER_COLUMNS = ("run_id", "dataset", "partition", "attempt_no", "row_count", "fingerprint", "committed_at",
                      "null_keys", "distinct_keys", "measure_sum", "numbers_of", "location", "files", "columns")

    def _marker_rows(self, run_ids: Sequence[str]) -> dict[str, dict]:
        self.ensure_meta()
        found: dict[str, dict] = {}
        ids = list(dict.fromkeys(run_ids))
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            names = {f"r{i}": run_id for i, run_id in enumerate(chunk)}
            columns = ", ".join(f'"{c}"' for c in self.MARKER_COLUMNS)
            for row in self._sql(f"SELECT {columns} FROM bf_ice_markers WHERE run_id IN "
                                 f"({', '.join(':' + k for k in names)})", names):
                m = dict(zip(self.MARKER_COLUMNS, row))
                m["files"] = json.loads(m["files"])
                m["columns"] = json.loads(m["columns"])
                found[m["run_id"]] = m
        return found

    def marker(self, run_id: str) -> Marker | None:
        row = self._marker_rows([run_id]).get(run_id)
        return None if row is None else self._to_marker(row)

    def markers(self, run_ids: Sequence[str]) -> dict[str, Marker]:
        return {run_id: self._to_marker(row) for run_id, row in self._marker_rows(run_ids).items()}

    # -- numbers ----------------------------------------------------------------------

    def _files_source(self, files: list[str], columns: Sequence[tuple[str, str]], present: Sequence[str]) -> str:
        """A DuckDB subquery over Parquet files with `columns` [(name, type)], NULL for a
        column the files were written without."""
        projection = []
        for name, logical in columns:
            if name in present:
                projection.append(f"CAST({_quote(name)} AS {DUCK_TYPES[logical]}) AS {_quote(name)}")
            else:
                projection.append(f"CAST(NULL AS {DUCK_TYPES[logical]}) AS {_quote(name)}")
        if not files:
            return f"(SELECT {', '.join(projection)} WHERE false)"
        listed = ", ".join(_literal(f) for f in files)
        return (f"(SELECT {', '.join(projection)} FROM read_parquet([{listed}], hive_partitioning = false, "
                "union_by_name = true))")

    def _version_source(self, spec: DatasetSpec, row: dict, *, bookkeeping: bool = False) -> str:
        columns = [(c.name, c.type) for c in spec.columns]
        if bookkeeping:
            columns += list(BOOKKEEPING_TYPES.items())
        return self._files_source(self._version_files(row), columns, row["columns"])

    def _count(self, spec: DatasetSpec, row: dict) -> tuple[VersionNumbers, str]:
        rows, null_keys, distinct, measure, upper, lower = self.duck.execute(
            _numbers_sql(spec, f"{self._version_source(spec, row)} AS v")).fetchall()[0]
        return (VersionNumbers(int(rows), int(null_keys), int(distinct), rounded_measure(measure)),
                _fingerprint_of(upper, lower))

    def _committed(self, run_id: str) -> dict:
        row = self._marker_rows([run_id]).get(run_id)
        if row is None:
            raise VersionNotCommitted(f"run {run_id!r} has no committed version")
        return row

    def profile(self, *, spec: DatasetSpec, run_id: str) -> Profile:
        row = self._committed(run_id)
        marker = self._to_marker(row)
        numbers = marker.numbers_for(spec)
        fingerprint = marker.fingerprint
        if numbers is None:
            numbers, fingerprint = self._count(spec, row)
        table = self._load(spec.name)
        present = set(row["columns"])
        columns = [(n, t) for n, t in self._table_columns(table) if n not in BOOKKEEPING_COLUMNS and n in present]
        return Profile(row_count=numbers.row_count, distinct_keys=numbers.distinct_keys, null_keys=numbers.null_keys,
                       duplicate_keys=numbers.duplicate_keys, measure_sum=numbers.measure_sum,
                       fingerprint=fingerprint, columns=columns)

    def fingerprint(self, *, spec: DatasetSpec, run_id: str) -> str:
        return self._count(spec, self._committed(run_id))[1]

    def profile_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, VersionNumbers]:
        found = {}
        for run_id, row in self._marker_rows(list(run_ids)).items():
            if row["dataset"] != spec.name:
                continue
            numbers = self._to_marker(row).numbers_for(spec)
            found[run_id] = numbers if numbers is not None else self._count(spec, row)[0]
        return found

    def measure_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, float | None]:
        if not spec.core_measure:
            return {}
        return {run_id: n.measure_sum for run_id, n in self.profile_many(spec=spec, run_ids=run_ids).items()}

    # -- publication ------------------------------------------------------------------

    def _data_files(self, table, row: dict) -> list:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file

        files = []
        for path in self._version_files(row):
            # A data file never changes once its marker is written: its Iceberg entry
            # (statistics read from its footer) is kept for a later rollback to it.
            key = (path, table.metadata.table_uuid, table.metadata.default_spec_id, table.metadata.current_schema_id)
            data_file = self._data_file_cache.get(key)
            if data_file is None:
                data_file = parquet_file_to_data_file(table.io, table.metadata, self.storage.uri(path))
                # from_args drops spec_id (pyiceberg 0.12); a file read from a manifest has
                # it, and a delete needs it.
                data_file.spec_id = table.metadata.default_spec_id
                self._data_file_cache[key] = data_file
            files.append(data_file)
        return files

    def _check_target(self, name: str, partition: str, run_id: str, action: str) -> dict:
        row = self._marker_rows([run_id]).get(run_id)
        if row is None or row["dataset"] != name or row["partition"] != partition:
            raise VersionNotCommitted(f"run {run_id!r} has no committed version of {name}/{partition}")
        if action == "rollback" and not self._sql(
                'SELECT 1 FROM bf_ice_publications WHERE dataset = :d AND "partition" = :p AND run_id = :r',
                {"d": name, "p": partition, "r": run_id}):
            raise VersionNotCommitted(f"run {run_id!r} was never published at {name}/{partition}")
        return row

    def _commit_moves(self, name: str, moves: list[tuple[str, str, str | None, dict]], *, actor: str,
                      action: str) -> list[PublicationRecord]:
        """One Iceberg commit of the moves [(partition, run_id, expected, marker row)] of one
        table: each partition's live files replaced by the run's, the pointers set, if and
        only if every pointer is still where the caller expected on the snapshot the commit
        is built on. A concurrent commit (CommitFailedException): reload and check again."""
        from pyiceberg.exceptions import CommitFailedException
        from sqlalchemy.exc import OperationalError

        deadline = time.monotonic() + self.publish_wait_seconds
        while True:
            table = self._load(name)
            if table is None:
                raise VersionNotCommitted(f"{name} has no table")
            pointers = table.metadata.properties
            previous = {}
            for partition, run_id, expected, _ in moves:
                current = pointers.get(POINTER_PREFIX + partition)
                if current != expected:
                    raise PublishConflict(dataset=name, partition=partition, run_id=run_id,
                                          expected_run_id=expected, current_run_id=current)
                previous[partition] = current
            # The partition's live files are its current version's (a publish replaces
            # them all): the marker's list, not a scan of the manifests. Were they not
            # live, the overwrite's own check of its deletes would refuse the commit.
            current_rows = self._marker_rows([c for c in previous.values() if c is not None])
            # To the microsecond: the history is ordered by it (a row recovered from its
            # snapshot is written after later ones), and it is taken after the reload
            # that saw every earlier commit to the table.
            published_at = datetime.now(timezone.utc)
            summary = {"bf.action": action, "bf.actor": actor, "bf.published-at": published_at.isoformat(),
                       "bf.moves": json.dumps([[p, r, e] for p, r, e, _ in moves])}
            try:
                txn = table.transaction()
                with _live_overwrite(table, txn, summary) as overwrite:
                    for partition, _, _, row in moves:
                        if previous[partition] is not None:
                            for old in self._data_files(table, current_rows[previous[partition]]):
                                overwrite.delete_data_file(old)
                        for new in self._data_files(table, row):
                            overwrite.append_data_file(new)
                    snapshot_id = overwrite.snapshot_id
                # After the snapshot is built: each staged update makes every later look
                # at the transaction's metadata a deep copy.
                txn.set_properties({POINTER_PREFIX + p: r for p, r, _, _ in moves})
                committed = txn.commit_transaction()
            except CommitFailedException:
                if time.monotonic() > deadline:
                    raise WarehouseLockTimeout(f"{name}: gave up after {self.publish_wait_seconds}s of lost races")
                continue
            except OperationalError as exc:  # SQLite: another commit holds the catalog's write lock
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise WarehouseUnavailable(f"Iceberg catalog: {exc}") from exc
                time.sleep(0.02)
                continue
            records = self._record(committed, snapshot_id)
            self._expire_old_snapshots(committed)
            return records

    def _expire_old_snapshots(self, table) -> None:
        """After a publishing commit and its history rows: every snapshot but the newest
        RETAINED_SNAPSHOTS is expired, so the table's metadata (what every reader loads)
        stops growing with publishes. History first: a snapshot whose row its committer
        did not live to write is recorded before it can go. Only snapshots go, never a
        file: a version's files are listed by its marker, which rollback and pinning read,
        and only `purge` deletes them. A commit lost to a concurrent one is left to the
        next publish; a snapshot a branch or tag points at (one a reader created) is kept.
        Nothing here fails the publish: it has committed and is recorded."""
        from pyiceberg.exceptions import CommitFailedException
        from sqlalchemy.exc import OperationalError

        doomed = [s.snapshot_id for s in _beyond_retention(table)]
        if not doomed:
            return
        try:
            self._sync_history(table)
            table.maintenance.expire_snapshots().by_ids(doomed).commit()
        except (CommitFailedException, OperationalError):
            pass  # a concurrent commit (SQLite: one holding the catalog's write lock): the next publish expires
        except Exception:
            logger.warning("%s: expiring %d old snapshots failed; the next publish tries again",
                           table.name()[-1], len(doomed), exc_info=True)

    def _expire_source_snapshots(self, table) -> None:
        """After a source load's commit: once SOURCE_EXPIRY_BATCH loads have piled up past
        the newest RETAINED_SNAPSHOTS, the older snapshots are expired and the data files
        only they listed (rows a `replace` load replaced) are deleted; an append's files
        are listed by every later snapshot and stay. Nothing here fails the load."""
        from pyiceberg.exceptions import CommitFailedException
        from sqlalchemy.exc import OperationalError

        doomed = _beyond_retention(table)
        if len(doomed) < SOURCE_EXPIRY_BATCH:
            return
        doomed_ids = {s.snapshot_id for s in doomed}
        manifests: dict[str, set[str]] = {}

        def files(snapshots) -> set[str]:
            listed: set[str] = set()
            for snapshot in snapshots:
                for manifest in snapshot.manifests(table.io):
                    if manifest.manifest_path not in manifests:
                        manifests[manifest.manifest_path] = {
                            e.data_file.file_path for e in manifest.fetch_manifest_entry(table.io, discard_deleted=True)}
                    listed |= manifests[manifest.manifest_path]
            return listed

        try:
            unreferenced = (files(doomed)
                            - files(s for s in table.metadata.snapshots if s.snapshot_id not in doomed_ids))
            table.maintenance.expire_snapshots().by_ids(sorted(doomed_ids)).commit()
        except (CommitFailedException, OperationalError):
            return  # a concurrent commit: a later load expires
        except Exception:
            logger.warning("%s: expiring %d old source snapshots failed; a later load tries again",
                           table.name()[-1], len(doomed), exc_info=True)
            return
        for uri in sorted(unreferenced):
            self.storage.delete(self.storage.engine_path(uri))

    def _record(self, table, snapshot_id: int) -> list[PublicationRecord]:
        """The history rows of one publishing snapshot, one per partition it moved
        (idempotent: keyed by snapshot and partition)."""
        props = table.metadata.snapshot_by_id(snapshot_id).summary.additional_properties
        name = table.name()[-1]
        records = []
        for partition, run_id, expected in json.loads(props["bf.moves"]):
            key = {"s": snapshot_id, "p": partition}
            self._sql(
                """INSERT INTO bf_ice_publications (dataset, "partition", run_id, previous_run_id, action, actor,
                   published_at, snapshot_id) VALUES (:d, :p, :r, :e, :a, :actor, :t, :s)
                   ON CONFLICT (snapshot_id, "partition") DO NOTHING""",
                {**key, "d": name, "r": run_id, "e": expected, "a": props["bf.action"], "actor": props["bf.actor"],
                 "t": props["bf.published-at"]}, write=True)
            (row_id,), = self._sql(
                'SELECT id FROM bf_ice_publications WHERE snapshot_id = :s AND "partition" = :p', key)
            records.append(PublicationRecord(
                id=row_id, dataset=name, partition=partition, run_id=run_id, previous_run_id=expected,
                action=props["bf.action"], actor=props["bf.actor"],
                published_at=datetime.fromisoformat(props["bf.published-at"])))
        return records

    def _sync_history(self, table) -> None:
        """Record any publishing snapshot whose history row its committer did not live to
        write (a crash between the Iceberg commit and the row)."""
        recorded = {r[0] for r in self._sql("SELECT snapshot_id FROM bf_ice_publications WHERE dataset = :d",
                                            {"d": table.name()[-1]})}
        for snapshot in sorted(table.metadata.snapshots, key=lambda s: s.sequence_number or 0):
            if "bf.moves" in snapshot.summary.additional_properties and snapshot.snapshot_id not in recorded:
                self._record(table, snapshot.snapshot_id)

    def publish(self, *, spec_or_name: DatasetSpec | str, partition: str, run_id: str,
                expected_run_id: str | None, actor: str, action: str = "publish") -> PublicationRecord:
        if action not in ("publish", "rollback"):
            raise ValidationError(f"action {action!r} must be publish or rollback", field="action")
        name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
        row = self._check_target(name, partition, run_id, action)
        return self._commit_moves(name, [(partition, run_id, expected_run_id, row)], actor=actor, action=action)[0]

    def rollback_many(self, moves: Sequence[PointerMove], *, actor: str) -> list[PublicationRecord]:
        """One Iceberg commit per dataset. Every expectation is checked before the first
        commit; across datasets a race lost after an earlier dataset committed is undone
        by moving that dataset's pointers back (Iceberg has no multi-table commit)."""
        by_name: dict[str, list] = {}
        for move in moves:
            row = self._check_target(move.name, move.partition, move.to_run_id, "rollback")
            by_name.setdefault(move.name, []).append((move.partition, move.to_run_id, move.expected_run_id, row))
        for name, group in by_name.items():  # every expectation, before anything moves
            table = self._load(name)
            for partition, run_id, expected, _ in group:
                current = table.metadata.properties.get(POINTER_PREFIX + partition) if table else None
                if current != expected:
                    raise PublishConflict(dataset=name, partition=partition, run_id=run_id,
                                          expected_run_id=expected, current_run_id=current)
        records: list[PublicationRecord] = []
        done: list[tuple[str, list]] = []
        try:
            for name, group in by_name.items():
                records += self._commit_moves(name, group, actor=actor, action="rollback")
                done.append((name, group))
        except PublishConflict:
            for name, group in done:
                back = [(p, e, r, self._check_target(name, p, e, "rollback")) for p, r, e, _ in group]
                self._commit_moves(name, back, actor=actor, action="rollback")
            raise
        order = {(m.name, m.partition): i for i, m in enumerate(moves)}
        return sorted(records, key=lambda r: order[(r.dataset, r.partition)])

    def current(self, name: str, partition: str) -> str | None:
        table = self._load(name)
        return None if table is None else table.metadata.properties.get(POINTER_PREFIX + partition)

    def current_many(self, name: str, partitions: Sequence[str]) -> dict[str, str]:
        if not partitions:
            return {}
        table = self._load(name)
        if table is None:
            return {}
        props = table.metadata.properties
        return {p: props[POINTER_PREFIX + p] for p in partitions if POINTER_PREFIX + p in props}

    def history(self, name: str, partition: str) -> list[PublicationRecord]:
        table = self._load(name)
        if table is None:
            return []
        self._sync_history(table)
        rows = self._sql(
            """SELECT id, dataset, "partition", run_id, previous_run_id, action, actor, published_at
               FROM bf_ice_publications WHERE dataset = :d AND "partition" = :p""",
            {"d": name, "p": partition})
        records = [PublicationRecord(id=r[0], dataset=r[1], partition=r[2], run_id=r[3], previous_run_id=r[4],
                                     action=r[5], actor=r[6], published_at=datetime.fromisoformat(r[7])) for r in rows]
        # Newest first by the commit's time, not the row's id: a row recovered from its
        # snapshot by _sync_history is written after rows of later publishes.
        return sorted(records, key=lambda r: (r.published_at, r.id), reverse=True)

    # -- retention --------------------------------------------------------------------

    def purge(self, *, spec: DatasetSpec, run_id: str) -> int:
        """The version's files, marker and index row go; first every snapshot but the
        current one that still lists one of its files is expired, so no retained Iceberg
        snapshot points at a deleted file."""
        row = self._marker_rows([run_id]).get(run_id)
        table = self._load(spec.name)
        if table is not None and run_id in {v for k, v in table.metadata.properties.items()
                                            if k.startswith(POINTER_PREFIX)}:
            raise PurgeRefused(f"run {run_id!r} is the current version of {spec.name}/{row and row['partition']}")
        if row is None:
            for path in self.run_files(spec, run_id):
                self.storage.delete(path)
            return 0
        self._sql("DELETE FROM bf_ice_markers WHERE run_id = :r", {"r": run_id}, write=True)
        table = self._load(spec.name)
        if run_id in {v for k, v in table.metadata.properties.items() if k.startswith(POINTER_PREFIX)}:
            self._index_marker(row)  # published meanwhile
            raise PurgeRefused(f"run {run_id!r} became the current version of {spec.name}/{row['partition']}")
        self._expire_snapshots_listing(table, {self.storage.uri(p) for p in self._version_files(row)})
        for leftover in self.storage.files(row["location"]):
            self.storage.delete(leftover)
        self.storage.remove_dir(row["location"])
        return int(row["row_count"])

    def _expire_snapshots_listing(self, table, paths: set[str]) -> None:
        current = table.current_snapshot()
        doomed = []
        for snapshot in table.metadata.snapshots:
            if current is not None and snapshot.snapshot_id == current.snapshot_id:
                continue
            for manifest in snapshot.manifests(table.io):
                if any(e.data_file.file_path in paths for e in manifest.fetch_manifest_entry(table.io)):
                    doomed.append(snapshot.snapshot_id)
                    break
        if doomed:
            table.maintenance.expire_snapshots().by_ids(doomed).commit()

    def sweep_orphans(self, spec_or_name: DatasetSpec | str) -> list[str]:
        """Delete what dead writers left under a dataset's `_runs/`: a run directory with
        no marker whose writer lock nobody holds (a live writer holds it for as long as it
        writes; on an object store a dead writer's lease lapses `writer_lease` seconds
        after its last renewal). Returns the files deleted."""
        name = spec_or_name if isinstance(spec_or_name, str) else spec_or_name.name
        deleted = []
        for directory, files in sorted(self._run_directories(name).items()):
            if any(self.storage.name(f) == MARKER_FILE for f in files):
                continue
            if all(self.storage.name(f) == LOCK_FILE for f in files):
                continue
            lock = self._writer_lock(directory)
            if not lock.try_acquire():
                continue  # a live writer
            try:
                if self._read_marker_file(directory) is None:
                    deleted += self._discard(directory)
            finally:
                lock.release()
        return sorted(deleted)

    # -- reading ----------------------------------------------------------------------

    def read_partition(self, name: str, partition: str) -> list[dict]:
        """What any Iceberg reader sees: the current snapshot's files of the partition."""
        from pyiceberg.expressions import EqualTo

        table = self._load(name)
        if table is None or table.current_snapshot() is None:
            return []
        return table.scan(row_filter=EqualTo(self._partition_column(table), partition)).to_arrow().to_pylist()

    def ref_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        for partition, run_id in pins.items():
            _literal(partition)
            _literal(run_id)
        columns = [(c.name, c.type) for c in spec.columns]
        if not pins:
            return self._files_source([], columns, [])
        rows = self._marker_rows(list(pins.values()))
        parts = []
        for partition, run_id in sorted(pins.items()):
            row = rows.get(run_id)
            if row is None or row["dataset"] != spec.name or row["partition"] != partition:
                continue
            parts.append(f"SELECT * FROM {self._files_source(self._version_files(row), columns, row['columns'])}")
        if not parts:
            return self._files_source([], columns, [])
        return "(" + " UNION ALL ".join(parts) + ")"

    def version_sql(self, spec: DatasetSpec, run_id: str) -> str:
        """A subquery over one committed version's rows with the declared and the
        bookkeeping columns (tests and diagnosis; jobs use `ref_sql`)."""
        return self._version_source(spec, self._committed(run_id), bookkeeping=True)

    def source_sql(self, *, name: str, time_column: str, start: datetime, end: datetime) -> str:
        """A source is any Iceberg table of the namespace: its current snapshot's files,
        read by the time column."""
        from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

        identifier(time_column, what="column")
        table = self._load(name)
        if table is None:
            raise ValidationError(f"source {name!r} is not a table of the Iceberg catalog", field="source")
        columns = self._table_columns(table)
        files = []
        if table.current_snapshot() is not None:
            predicate = And(GreaterThanOrEqual(time_column, start.astimezone(timezone.utc).isoformat()),
                            LessThan(time_column, end.astimezone(timezone.utc).isoformat()))
            files = [self.storage.engine_path(t.file.file_path)
                     for t in table.scan(row_filter=predicate).plan_files()]
        source = self._files_source(files, columns, [n for n, _ in columns])
        return (f"(SELECT * FROM {source} AS s WHERE {_quote(time_column)} >= {self.ts_literal(start)} "
                f"AND {_quote(time_column)} < {self.ts_literal(end)})")

    # -- sources --------------------------------------------------------------------------

    def source_loads(self, name: str) -> dict[str, int] | None:
        table = self._load(name)
        if table is None or table.metadata.properties.get(SOURCE_PROPERTY) != "true":
            return None
        return {key.removeprefix(LOAD_PREFIX): int(n) for key, n in table.metadata.properties.items()
                if key.startswith(LOAD_PREFIX)}

    def _source_arrow(self, spec: DatasetSpec, rows: Any, schema):
        """`rows` as an Arrow table of `schema` (the declared columns' Iceberg types)."""
        import pyarrow as pa

        if isinstance(rows, pa.RecordBatch):
            rows = pa.Table.from_batches([rows])
        if isinstance(rows, pa.Table):
            missing = [c.name for c in spec.columns if c.name not in rows.schema.names]
            if missing:
                raise ValidationError(f"{spec.name}: the rows have no column {missing[0]!r}", field=missing[0])
            arrays = []
            for field, col in zip(schema, spec.columns):
                array = rows.column(col.name)
                try:
                    if col.type == "timestamp" and pa.types.is_timestamp(array.type) and array.type.tz is None:
                        raise TypeError("a naive timestamp; give it a timezone")
                    arrays.append(array.cast(field.type))
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError) as exc:
                    raise ValidationError(f"{spec.name}.{col.name}: cannot store its values as {col.type}: {exc}",
                                          field=col.name) from exc
            return pa.Table.from_arrays(arrays, schema=schema)
        converters = [_converter(c) for c in spec.columns]
        values = []
        for row in rows:
            values.append(convert_row(spec, converters, row))
        columns = list(zip(*values)) if values else [[] for _ in spec.columns]
        return pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(columns, schema)], schema=schema)

    def load_source(self, *, spec: DatasetSpec, rows: Any, time_column: str = "", load_key: str | None = None,
                    replace: bool = False) -> int:
        """A source is an Iceberg table of the namespace (`bf.source=true`), unpartitioned:
        each load is one commit (an append, or with `replace` an overwrite of every row)
        whose data files' column statistics prune `source_sql`'s scan by the time column;
        manifests are merged as they accumulate. The load key is a table property set in
        the same commit, so a lost race (CommitFailedException) re-checks it."""
        from pyiceberg.exceptions import CommitFailedException, TableAlreadyExistsError
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import schema_to_pyarrow
        from pyiceberg.schema import Schema
        from pyiceberg.types import NestedField

        self._ident(spec.name)
        if time_column and time_column not in spec.column_names:
            raise ValidationError(f"{spec.name}: no column {time_column!r} to read by", field="time_column")
        if load_key is not None and (not isinstance(load_key, str) or not load_key):
            raise ValidationError("load_key must be a non-empty string", field="load_key")
        schema = Schema(*(NestedField(i, c.name, _iceberg_type(c.type), required=False)
                          for i, c in enumerate(spec.columns, start=1)))
        data = self._source_arrow(spec, rows, schema_to_pyarrow(schema))
        for _ in range(50):
            table = self._load(spec.name)
            if table is None:
                try:
                    self.catalog.create_table(
                        self._ident(spec.name), schema=schema,
                        location=self.table_uri(spec.name),
                        properties={SOURCE_PROPERTY: "true", "commit.retry.num-retries": "0",
                                    "commit.manifest-merge.enabled": "true",
                                    "commit.manifest.min-count-to-merge": "8",
                                    "schema.name-mapping.default": schema.name_mapping.model_dump_json()})
                except TableAlreadyExistsError:
                    pass
                continue
            properties = table.metadata.properties
            if properties.get(SOURCE_PROPERTY) != "true":
                raise ValidationError(f"{spec.name!r} is a produced dataset's table, not a source", field="source")
            if not replace and load_key is not None and LOAD_PREFIX + load_key in properties:
                return 0
            present = {f.name: _logical_type(f.field_type) for f in table.schema().fields}
            for col in spec.columns:
                if col.name in present and present[col.name] != col.type:
                    raise ValidationError(f"{spec.name}.{col.name} is stored as {present[col.name]}; it cannot "
                                          f"become {col.type}", field=col.name)
            try:
                with table.transaction() as txn:
                    missing = [c for c in spec.columns if c.name not in present]
                    if missing:
                        _add_columns(txn, missing)
                    if replace:
                        old_keys = [k for k in properties if k.startswith(LOAD_PREFIX)]
                        if old_keys:
                            txn.remove_properties(*old_keys)
                        txn.overwrite(data, overwrite_filter=AlwaysTrue())
                    elif data.num_rows:
                        txn.append(data)
                    if load_key is not None:
                        txn.set_properties({LOAD_PREFIX + load_key: str(data.num_rows)})
            except CommitFailedException:
                continue
            self._expire_source_snapshots(table)
            return data.num_rows
        raise WarehouseLockTimeout(f"{spec.name}: 50 loads lost their commit to concurrent ones in a row")

    # -- the engine ---------------------------------------------------------------------

    def query(self, statement: str, params: Sequence = ()) -> list[tuple]:
        return self.duck.execute(statement, list(params)).fetchall()

    def query_dicts(self, statement: str, params: Sequence = ()) -> list[dict]:
        cursor = self.duck.execute(statement, list(params))
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]

    def columns_of(self, select_sql: str, params: Sequence = ()) -> list[str]:
        cursor = self.duck.execute(f"SELECT * FROM ({select_sql}) AS q LIMIT 0", list(params))
        return [d[0] for d in cursor.description]

    def ts(self, value: datetime) -> Any:
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValidationError(f"{value!r} is a naive datetime; give it a timezone", field="timestamp")
        return value.astimezone(timezone.utc)

    def ts_literal(self, value: datetime) -> str:
        return f"TIMESTAMPTZ '{self.ts(value).isoformat(sep=' ')}'"


@dataclasses.dataclass
class _Staging:
    """One attempt's writing: the table as it began, the run directory, the writer lock,
    and the data files this attempt has written (what its marker lists and what a failure
    deletes)."""

    table: Any
    directory: str
    lock: Any
    files: list[str] = dataclasses.field(default_factory=list)


class _FileLock:
    """A local run directory's writer lock: an flock on its lock file, which the kernel
    releases with a killed writer's process."""

    def __init__(self, path: str):
        self.path = path
        self.handle = None

    def _try(self) -> bool:
        if self.handle is None:
            self.handle = open(self.path, "a+")
        try:
            fcntl.flock(self.handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def acquire(self, *, take_over: bool, timeout: float) -> None:
        """Wait for the lock; with `take_over` (the holder is a dead or frozen attempt of
        this run) go on without it."""
        deadline = time.monotonic() + timeout
        while not self._try():
            if take_over:
                return
            if time.monotonic() > deadline:
                self.release()
                raise WarehouseLockTimeout(f"another writer holds {self.path}")
            time.sleep(0.05)

    def try_acquire(self) -> bool:
        if self._try():
            return True
        self.release()
        return False

    def confirm(self) -> None:
        """Nothing to check: a local writer taken over shares the directory (its files are
        its attempt's own) and the marker's index row is written once."""

    def release(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


class _Lease:
    """An object store's writer lock (it has no file locks): a row of `bf_ice_writers`
    in the catalog database naming the run directory, a token and when it lapses. The
    holder renews it every quarter of the lease from a thread of its own; a killed
    holder's lapses. Taking over (an attempt presumed dead) overwrites the token, and the
    old holder finds out at its next renewal or at `confirm`, before its marker.
    Expiry is by the hosts' clocks: they must agree to well within the lease."""

    def __init__(self, warehouse: IcebergWarehouse, location: str):
        self.warehouse = warehouse
        self.location = location
        self.token = uuid.uuid4().hex
        self.lost = False
        self._stop = threading.Event()
        self._thread = None

    def _claim(self, *, force: bool) -> bool:
        now = time.time()
        params = {"l": self.location, "t": self.token, "e": now + self.warehouse.writer_lease, "now": now}
        condition = "" if force else " WHERE bf_ice_writers.expires_at < :now"
        # A row comes back only if this statement inserted the lease or took it over.
        return bool(self.warehouse._sql(
            "INSERT INTO bf_ice_writers (location, token, expires_at) VALUES (:l, :t, :e) "
            "ON CONFLICT (location) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at"
            + condition + " RETURNING token", params, write=True))

    def _renew(self) -> bool:
        params = {"l": self.location, "t": self.token, "e": time.time() + self.warehouse.writer_lease}
        return bool(self.warehouse._sql(
            "UPDATE bf_ice_writers SET expires_at = :e WHERE location = :l AND token = :t RETURNING token",
            params, write=True))

    def _heartbeat(self) -> None:
        from sqlalchemy.exc import OperationalError

        while not self._stop.wait(self.warehouse.writer_lease / 4):
            try:
                if not self._renew():
                    self.lost = True
                    return
            except OperationalError:  # the catalog busy or away: the next beat tries again
                logger.warning("renewing the writer lease of %s failed", self.location, exc_info=True)

    def _held(self) -> None:
        self._thread = threading.Thread(target=self._heartbeat, name="bf-ice-lease", daemon=True)
        self._thread.start()

    def acquire(self, *, take_over: bool, timeout: float) -> None:
        self.warehouse.ensure_meta()
        deadline = time.monotonic() + timeout
        while not self._claim(force=take_over):
            if time.monotonic() > deadline:
                raise WarehouseLockTimeout(f"another writer holds the lease of {self.location}")
            time.sleep(0.2)
        self._held()

    def try_acquire(self) -> bool:
        self.warehouse.ensure_meta()
        if not self._claim(force=False):
            return False
        self._held()
        return True

    def confirm(self) -> None:
        if self.lost or not self._renew():
            self.lost = True
            raise WarehouseLockTimeout(f"the writer lease of {self.location} was taken over by another attempt")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self.warehouse._sql("DELETE FROM bf_ice_writers WHERE location = :l AND token = :t",
                            {"l": self.location, "t": self.token}, write=True)
