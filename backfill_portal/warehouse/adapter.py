"""The warehouse adapter: isolated versions, commit markers, the publication pointer.

Everything the portal does to warehouse data goes through `Warehouse`. Layout, the same
in both dialects:

    <dataset>__versions   every run's rows, tagged `_run_id`, `_partition`, `_attempt`.
                          Writing here changes nothing a reader sees.
    <dataset>             the reader VIEW: the versions joined to `_bf_current`, i.e.
                          exactly the published version of each partition.
    _bf_current           the pointer (dataset, partition) -> run_id. Moving it is the
                          only way data becomes visible (DESIGN invariant 2).
    _bf_publications      the history of pointer moves, `publish` and `rollback`.
    _bf_markers           one commit marker per run, written in the same transaction
                          as the run's rows (invariant 4).

Why a view over a pointer: a publish is then a single-row UPDATE, so any one SELECT on
the view sees either the whole old version or the whole new one, never an empty or
half-written partition; and a rollback is the same UPDATE pointing back.

Staging is one transaction: a crash anywhere before the marker leaves nothing behind,
and a marker proves the rows are complete. Callers retry with `marker()` first:
committed -> verify; absent -> stage again (which first clears the run's leftovers).
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any, NamedTuple

from backfill_portal.core.errors import ConflictError, ValidationError
from backfill_portal.warehouse.db import SQLITE_TS_FORMAT, WarehouseDB, WarehouseUnavailable

logger = logging.getLogger(__name__)

__all__ = [
    "COLUMN_TYPES",
    "AlreadyCommitted",
    "ColumnSpec",
    "DatasetSpec",
    "Marker",
    "Profile",
    "PublicationRecord",
    "PublishConflict",
    "PurgeRefused",
    "VersionNotCommitted",
    "VersionNumbers",
    "Warehouse",
    "rounded_measure",
]

COLUMN_TYPES = ("text", "integer", "numeric", "timestamp", "date", "boolean")

# Physical types. PostgreSQL keeps `numeric` exact so the core measure sums the same
# whatever the row order; SQLite has no decimal type, so REAL (and the fingerprint
# rounds it). The PostgreSQL names are the ones format_type() reports back, so
# `ensure_dataset` can compare them directly.
_PHYSICAL_TYPES = {
    "sqlite": {
        "text": "TEXT",
        "integer": "INTEGER",
        "numeric": "REAL",
        "timestamp": "TEXT",
        "date": "TEXT",
        "boolean": "INTEGER",
    },
    "postgresql": {
        "text": "text",
        "integer": "bigint",
        "numeric": "numeric",
        "timestamp": "timestamp with time zone",
        "date": "date",
        "boolean": "boolean",
    },
}

_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
# `<name>__versions_run` (and older warehouses' `_part_run`) must fit PostgreSQL's
# 63-byte identifier limit.
_MAX_DATASET_NAME = 40
_MAX_COLUMN_NAME = 63
_BOOKKEEPING_COLUMNS = ("_run_id", "_partition", "_attempt")
# A staging transaction writes what it has at least this often while rows come slowly.
FLUSH_SECONDS = 5.0
_META_PREFIX = "_bf_"
_META_TABLES = ("_bf_current", "_bf_publications", "_bf_markers")
# Marker columns added after the first release, with their logical types.
_MARKER_NUMBERS = {"null_keys": "integer", "distinct_keys": "integer", "measure_sum": "numeric", "numbers_of": "text"}
_ACTIONS = ("publish", "rollback")
# Digits kept when numbers are fingerprinted: enough for money and rates, few enough
# that the last-bit noise of float arithmetic does not change the fingerprint.
_FINGERPRINT_DECIMALS = 6


def _identifier(name: str, *, what: str, max_length: int = _MAX_COLUMN_NAME) -> str:
    # fullmatch: with match(), `$` would also accept a trailing newline.
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or len(name) > max_length:
        raise ValidationError(
            f"{what} {name!r} must match {_IDENTIFIER.pattern} and be at most {max_length} characters",
            field=what,
        )
    return name


def _quote(name: str) -> str:
    """Names are validated before they get here; quoting keeps keywords such as
    `partition`, `order` or `date` usable as column names."""
    return f'"{name}"'


def _literal(value: str) -> str:
    """A string as a SQL literal, for SQL that is rendered rather than parameterised.
    `?` is refused because `WarehouseDB.sql` turns every `?` into a PostgreSQL
    placeholder, even inside quotes."""
    if not isinstance(value, str) or any(ch == "?" or ord(ch) < 32 for ch in value):
        raise ValidationError(f"{value!r} cannot be rendered as a SQL literal")
    return "'" + value.replace("'", "''") + "'"


def _now() -> datetime:
    # Whole seconds: SQLite stores timestamps at that precision, and a record returned
    # by a write should equal the same record read back.
    return datetime.now(timezone.utc).replace(microsecond=0)


# -- specs and results -------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str

    def __post_init__(self) -> None:
        _identifier(self.name, what="column")
        if self.name in _BOOKKEEPING_COLUMNS:
            raise ValidationError(f"column name {self.name!r} is reserved for the warehouse", field="column")
        if self.type not in COLUMN_TYPES:
            raise ValidationError(
                f"column {self.name!r} has type {self.type!r}; expected one of {', '.join(COLUMN_TYPES)}",
                field="column",
            )


@dataclass(frozen=True)
class DatasetSpec:
    """What the adapter needs to know about a produced dataset. Columns may be given
    as `ColumnSpec`s or `(name, type)` pairs; they are stored as a tuple so the spec
    stays hashable."""

    name: str
    columns: tuple[ColumnSpec, ...]
    business_key: tuple[str, ...]
    core_measure: str = ""

    def __post_init__(self) -> None:
        _identifier(self.name, what="dataset", max_length=_MAX_DATASET_NAME)
        if self.name.startswith(_META_PREFIX) or self.name.endswith("__versions"):
            raise ValidationError(f"dataset name {self.name!r} is reserved for the warehouse", field="dataset")
        columns = tuple(c if isinstance(c, ColumnSpec) else ColumnSpec(*c) for c in self.columns)
        object.__setattr__(self, "columns", columns)
        object.__setattr__(self, "business_key", tuple(self.business_key))
        names = [c.name for c in columns]
        if not names:
            raise ValidationError(f"dataset {self.name!r} declares no columns", field="columns")
        if len(set(names)) != len(names):
            raise ValidationError(f"dataset {self.name!r} declares a column twice", field="columns")
        # The profile's key counts are how verification proves "not one row more";
        # a dataset without a business key could not be verified.
        if not self.business_key or any(k not in names for k in self.business_key):
            raise ValidationError(
                f"business key {self.business_key!r} of {self.name!r} must name declared columns",
                field="business_key",
            )
        if self.core_measure and self.column(self.core_measure).type not in ("integer", "numeric"):
            raise ValidationError(
                f"core measure {self.core_measure!r} of {self.name!r} must be a declared integer or numeric column",
                field="core_measure",
            )

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    @property
    def numbers_of(self) -> str:
        """What a version's numbers depend on besides its rows: the key and the measure."""
        return f"{','.join(self.business_key)}|{self.core_measure}"

    @property
    def versions_table(self) -> str:
        return f"{self.name}__versions"

    def column(self, name: str) -> ColumnSpec:
        for col in self.columns:
            if col.name == name:
                return col
        raise ValidationError(f"dataset {self.name!r} has no column {name!r}", field="columns")


@dataclass(frozen=True)
class Marker:
    """Proof that a run's rows are complete: written in the rows' own transaction."""

    run_id: str
    attempt_no: int
    dataset: str
    partition: str
    row_count: int
    fingerprint: str
    committed_at: datetime
    # The numbers verification and reconciliation compare, taken with the rows. None
    # on a marker written before the warehouse kept them: computed on demand then.
    null_keys: int | None = None
    distinct_keys: int | None = None
    measure_sum: float | None = None
    numbers_of: str | None = None  # DatasetSpec.numbers_of when they were taken

    def numbers_for(self, spec: DatasetSpec) -> VersionNumbers | None:
        """The version's numbers as `spec` counts them, if this marker holds them: None
        when it predates them, or they were counted for another dataset, key or measure."""
        if (self.null_keys is None or self.distinct_keys is None or self.dataset != spec.name
                or self.numbers_of != spec.numbers_of):
            return None
        return VersionNumbers(self.row_count, self.null_keys, self.distinct_keys, self.measure_sum)


class VersionNumbers(NamedTuple):
    """What verification and reconciliation compare of one version."""

    row_count: int
    null_keys: int  # rows where any key column is NULL
    distinct_keys: int  # distinct keys among rows whose key has no NULL
    measure_sum: float | None  # None: no core measure declared, or no non-NULL value

    @property
    def duplicate_keys(self) -> int:
        return self.row_count - self.null_keys - self.distinct_keys


def rounded_measure(value: Any) -> float | None:
    """A measure sum as every reader compares it: rounded like the fingerprint, since a
    float sum may differ in its last bits with the order rows are read in."""
    return None if value is None else round(float(value), _FINGERPRINT_DECIMALS)


@dataclass(frozen=True)
class Profile:
    row_count: int
    distinct_keys: int  # distinct business keys among rows whose key has no NULL
    null_keys: int  # rows where any key column is NULL
    duplicate_keys: int  # rows with a complete key minus distinct complete keys
    measure_sum: float | None  # None: no core measure declared, or no non-NULL value
    fingerprint: str
    columns: list[tuple[str, str]]  # data columns present in the versions table


@dataclass(frozen=True)
class PublicationRecord:
    id: int
    dataset: str
    partition: str
    run_id: str
    previous_run_id: str | None
    action: str
    actor: str
    published_at: datetime


# -- refusals ------------------------------------------------------------------------


class PublishConflict(ConflictError):
    """The pointer was not where the caller expected: someone published first."""

    def __init__(self, *, dataset: str, partition: str, run_id: str, expected_run_id: str | None,
                 current_run_id: str | None):
        super().__init__(
            f"{dataset}/{partition}: expected the current version to be {expected_run_id!r} "
            f"but it is {current_run_id!r}; {run_id!r} was not published"
        )
        self.dataset = dataset
        self.partition = partition
        self.run_id = run_id
        self.expected_run_id = expected_run_id
        self.current_run_id = current_run_id

    @property
    def already_published(self) -> bool:
        """True when the lost race was lost to this very run (a retried publish):
        the caller's work is already done."""
        return self.current_run_id == self.run_id


class AlreadyCommitted(ConflictError):
    """The run already has a marker: its rows are complete, go on to verification."""

    def __init__(self, marker: Marker):
        super().__init__(f"run {marker.run_id!r} is already committed ({marker.row_count} rows)")
        self.marker = marker


class VersionNotCommitted(ConflictError):
    """Only a run with a commit marker for that very (dataset, partition) may be shown."""


class PurgeRefused(ConflictError):
    """The version is visible somewhere; move the pointer away first."""


# -- the adapter -----------------------------------------------------------------------


class Warehouse:
    """The adapter. Stateless apart from caching which tables it has already ensured;
    safe to share between threads (`WarehouseDB` keeps one connection per thread)."""

    def __init__(self, db: WarehouseDB):
        self.db = db
        self._meta_ready = False
        self._ready: set[DatasetSpec] = set()

    # -- schema ---------------------------------------------------------------------

    def ensure_meta(self) -> None:
        """Create the pointer, history and marker tables if missing. Idempotent.

        Checks read-only first: callers make a fresh `Warehouse` per request, and on
        SQLite the DDL transaction would take the database's single write lock."""
        if self.db.dialect == "postgresql":
            (version,) = self.db.query("SELECT current_setting('server_version_num')::int")[0]
            if int(version) < 140000:
                raise WarehouseUnavailable("the warehouse needs PostgreSQL 14 or newer (hash_record_extended)")
        if all(self.db.table_exists(name) for name in _META_TABLES) and not self._missing_marker_columns():
            self._meta_ready = True
            return
        sqlite = self.db.dialect == "sqlite"
        ts = self._physical("timestamp")
        text = self._physical("text")
        integer = self._physical("integer")
        # AUTOINCREMENT: history ids never reuse a deleted id, so "newest first" is
        # simply id order.
        serial = "INTEGER PRIMARY KEY AUTOINCREMENT" if sqlite else "bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY"
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
        with self.db.transaction():
            self._lock("meta")
            for statement in statements:
                self.db.execute(statement)
            # A warehouse from before markers kept the version's numbers.
            for name in self._missing_marker_columns():
                kind = self._physical(_MARKER_NUMBERS[name])
                self.db.execute(f'ALTER TABLE "_bf_markers" ADD COLUMN {_quote(name)} {kind}')
        self._meta_ready = True

    def _missing_marker_columns(self) -> list[str]:
        present = self._columns_of("_bf_markers")
        return [name for name in _MARKER_NUMBERS if present and name not in present]

    def ensure_dataset(self, spec: DatasetSpec) -> None:
        """Create or evolve `<name>__versions` and the reader view `<name>`. Idempotent.

        Columns are only ever added, never dropped or retyped: old versions must stay
        readable for rollback. The view shows every data column of the versions table
        (which is the declared columns unless a column was removed from the catalog),
        so two processes running an older and a newer spec during a deploy agree on it
        instead of recreating it back and forth.
        """
        self._ensure_meta_once()
        if self._dataset_is_ready(spec):  # read-only, as for ensure_meta
            self._ready.add(spec)
            return
        table = spec.versions_table
        with self.db.transaction():
            self._lock(f"dataset:{spec.name}")
            if self._relation_kind(spec.name) == "table":
                raise ValidationError(
                    f"a table named {spec.name!r} already exists; the reader view needs that name",
                    field="dataset",
                )
            present = self._columns_of(table)
            if not present:
                columns = [f"{_quote(c.name)} {self._physical(c.type)}" for c in spec.columns]
                columns += ['"_run_id" TEXT NOT NULL', '"_partition" TEXT NOT NULL', '"_attempt" INTEGER']
                self.db.execute(f"CREATE TABLE {_quote(table)} ({', '.join(columns)})")
            else:
                for col in spec.columns:
                    if col.name not in present:
                        self.db.execute(
                            f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(col.name)} {self._physical(col.type)}"
                        )
                    elif present[col.name].lower() != self._physical(col.type).lower():
                        raise ValidationError(
                            f"{spec.name}.{col.name} is stored as {present[col.name]!r} but declared {col.type!r};"
                            " changing a column's type needs a migration",
                            field="columns",
                        )
            # One index, on the run: a run writes one partition, so readers reach a
            # partition's rows through the pointer's run id too. Every index is paid for
            # by every staging INSERT, and a second one on (_partition, _run_id) would
            # serve no query the first does not.
            self.db.execute(f"CREATE INDEX IF NOT EXISTS {_quote(table + '_run')} ON {_quote(table)} (\"_run_id\")")

            data_columns = self._data_columns(table)
            if list(self._columns_of(spec.name)) != data_columns + ["_partition", "_run_id"]:
                selected = ", ".join(f"v.{_quote(name)}" for name in data_columns)
                # DROP + CREATE rather than CREATE OR REPLACE: PostgreSQL only lets a
                # replaced view append columns, and ours end with _partition, _run_id.
                self.db.execute(f"DROP VIEW IF EXISTS {_quote(spec.name)}")
                self.db.execute(
                    f"""CREATE VIEW {_quote(spec.name)} AS
                    SELECT {selected}, v."_partition", v."_run_id"
                    FROM {_quote(table)} AS v
                    JOIN "_bf_current" AS c
                      ON c."dataset" = {_literal(spec.name)}
                     AND c."partition" = v."_partition"
                     AND c."run_id" = v."_run_id"
                    """
                )
        self._ready.add(spec)

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
        4. count and fingerprint the run's rows;
        5. insert the marker.
        Anything raised (including from `rows`) rolls all of it back.
        """
        self._check_run(run_id=run_id, attempt_no=attempt_no, partition=partition)
        if chunk_size < 1:
            raise ValidationError("chunk_size must be at least 1", field="chunk_size")
        self._ensure_dataset_once(spec)
        converters = [self._converter(col) for col in spec.columns]
        width = len(converters)
        tail = (run_id, partition, attempt_no)
        columns = [_quote(name) for name in (*spec.column_names, *_BOOKKEEPING_COLUMNS)]
        with self.db.transaction():
            self._begin_stage(spec=spec, run_id=run_id, take_over=take_over)
            batch: list[tuple] = []
            flush_at = time.monotonic() + FLUSH_SECONDS
            for row in rows:
                if len(row) != width:
                    raise ValidationError(
                        f"{spec.name}: a row has {len(row)} values, the dataset declares {width} columns"
                    )
                batch.append(self._convert_row(spec, converters, row) + tail)
                if len(batch) >= chunk_size or time.monotonic() >= flush_at:
                    self.db.bulk_insert(_quote(spec.versions_table), columns, batch)
                    batch = []
                    flush_at = time.monotonic() + FLUSH_SECONDS
            self.db.bulk_insert(_quote(spec.versions_table), columns, batch)
            return self._commit_marker(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)

    def stage_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                     select_sql: str, params: Sequence = (), take_over: bool = False) -> Marker:
        """Like `stage_rows`, but the rows come from a SELECT run inside the warehouse.
        Its output columns must carry the declared column names; extra ones are ignored.
        `select_sql` uses `?` placeholders, bound from `params`."""
        self._check_run(run_id=run_id, attempt_no=attempt_no, partition=partition)
        self._ensure_dataset_once(spec)
        columns = ", ".join(_quote(name) for name in (*spec.column_names, *_BOOKKEEPING_COLUMNS))
        selected = ", ".join(f"q.{_quote(name)}" for name in spec.column_names)
        # The three run placeholders come first in the text, so first in the params.
        statement = (
            f"INSERT INTO {_quote(spec.versions_table)} ({columns}) "
            f"SELECT {selected}, CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER) "
            f"FROM ({select_sql}) AS q"
        )
        with self.db.transaction():
            self._begin_stage(spec=spec, run_id=run_id, take_over=take_over)
            self.db.execute(statement, (run_id, partition, attempt_no, *params))
            return self._commit_marker(spec=spec, run_id=run_id, attempt_no=attempt_no, partition=partition)

    def marker(self, run_id: str) -> Marker | None:
        self._ensure_meta_once()
        return self._marker(run_id)

    # -- verification -----------------------------------------------------------------

    def profile(self, *, spec: DatasetSpec, run_id: str) -> Profile:
        """The numbers verification compares. A committed version never changes, so
        they are its marker's, taken in the rows' own transaction; a version without
        them (no marker yet, an older marker, another key or measure since) is counted
        in the database now."""
        self._ensure_dataset_once(spec)
        marker = self._marker(run_id)
        numbers = (marker.numbers_for(spec) if marker else None) or self._numbers(spec, run_id)
        present = self._columns_of(spec.versions_table)
        columns = []
        for name, physical in present.items():
            if name in _BOOKKEEPING_COLUMNS:
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
            fingerprint=marker.fingerprint if marker else self._fingerprint(spec, run_id),
            columns=columns,
        )

    def fingerprint(self, *, spec: DatasetSpec, run_id: str) -> str:
        """An order-independent content hash (32 hex digits) of the version's declared
        columns: the same multiset of rows gives the same value, an extra copy of a row
        or a changed value a different one. Comparable within one dialect only."""
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
        3. append the history row.
        """
        name = spec_or_name.name if isinstance(spec_or_name, DatasetSpec) else spec_or_name
        _identifier(name, what="dataset", max_length=_MAX_DATASET_NAME)
        if action not in _ACTIONS:
            raise ValidationError(f"action must be one of {', '.join(_ACTIONS)}", field="action")
        if not actor:
            raise ValidationError("every publication needs an actor", field="actor")
        if expected_run_id == run_id:
            raise ValidationError(f"{name}/{partition}: {run_id!r} is already the expected current version")
        self._ensure_meta_once()
        now = _now()
        with self.db.transaction():
            marker = self._marker(run_id, lock=True)
            if marker is None or (marker.dataset, marker.partition) != (name, partition):
                raise VersionNotCommitted(f"run {run_id!r} has no committed version of {name}/{partition}")
            if action == "rollback" and not self.db.query(
                'SELECT 1 FROM "_bf_publications" WHERE "dataset" = ? AND "partition" = ? AND "run_id" = ?',
                (name, partition, run_id),
            ):
                raise VersionNotCommitted(
                    f"run {run_id!r} was never published for {name}/{partition}; only a publish can show it"
                )
            if expected_run_id is None:
                changed = self.db.execute(
                    """INSERT INTO "_bf_current" ("dataset", "partition", "run_id", "published_at")
                    VALUES (?, ?, ?, ?) ON CONFLICT ("dataset", "partition") DO NOTHING""",
                    (name, partition, run_id, self.db.ts(now)),
                )
            else:
                changed = self.db.execute(
                    """UPDATE "_bf_current" SET "run_id" = ?, "published_at" = ?
                    WHERE "dataset" = ? AND "partition" = ? AND "run_id" = ?""",
                    (run_id, self.db.ts(now), name, partition, expected_run_id),
                )
            if changed != 1:
                raise PublishConflict(
                    dataset=name, partition=partition, run_id=run_id,
                    expected_run_id=expected_run_id, current_run_id=self._current(name, partition),
                )
            (record_id,) = self.db.query(
                """INSERT INTO "_bf_publications"
                ("dataset", "partition", "run_id", "previous_run_id", "action", "actor", "published_at")
                VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING "id"
                """,
                (name, partition, run_id, expected_run_id, action, actor, self.db.ts(now)),
            )[0]
        return PublicationRecord(
            id=int(record_id), dataset=name, partition=partition, run_id=run_id,
            previous_run_id=expected_run_id, action=action, actor=actor, published_at=now,
        )

    def rollback(self, *, name: str, partition: str, to_run_id: str, expected_run_id: str,
                 actor: str) -> PublicationRecord:
        """Move the pointer back to a version that was published here before, with the
        same compare-and-set as `publish`."""
        return self.publish(
            spec_or_name=name, partition=partition, run_id=to_run_id,
            expected_run_id=expected_run_id, actor=actor, action="rollback",
        )

    def current(self, name: str, partition: str) -> str | None:
        self._ensure_meta_once()
        return self._current(name, partition)

    def current_many(self, name: str, partitions: list[str]) -> dict[str, str]:
        """{partition: run_id} for the published ones among `partitions`, in one query."""
        self._ensure_meta_once()
        partitions = list(dict.fromkeys(partitions))
        if not partitions:
            return {}
        marks = ", ".join("?" * len(partitions))
        rows = self.db.query(
            f'SELECT "partition", "run_id" FROM "_bf_current" WHERE "dataset" = ? AND "partition" IN ({marks})',
            (name, *partitions),
        )
        return dict(rows)

    def history(self, name: str, partition: str) -> list[PublicationRecord]:
        """Every pointer move of one partition, newest first."""
        self._ensure_meta_once()
        rows = self.db.query(
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
        with self.db.transaction():
            self._lock(f"run:{run_id}")
            self.db.execute('DELETE FROM "_bf_markers" WHERE "run_id" = ? AND "dataset" = ?', (run_id, spec.name))
            visible = self.db.query('SELECT "dataset", "partition" FROM "_bf_current" WHERE "run_id" = ?', (run_id,))
            if visible:
                where = ", ".join(f"{d}/{p}" for d, p in visible)
                raise PurgeRefused(f"run {run_id!r} is the current version of {where}; it cannot be purged")
            return self.db.execute(f'DELETE FROM {_quote(spec.versions_table)} WHERE "_run_id" = ?', (run_id,))

    # -- reading ----------------------------------------------------------------------

    def read_partition(self, name: str, partition: str) -> list[dict]:
        """The published rows of one partition, through the reader view, as readers
        see them (one statement, so one consistent version). Unordered."""
        _identifier(name, what="dataset", max_length=_MAX_DATASET_NAME)
        return self.db.query_dicts(f'SELECT * FROM {_quote(name)} WHERE "_partition" = ?', (partition,))

    def ref_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        """A parenthesised subquery over exactly the pinned versions {partition: run_id},
        with the declared columns. A downstream run selects from it instead of the
        reader view, so what it reads cannot change under it when someone publishes.
        No pins: the right columns and no rows (the table is created if nothing was ever
        staged into it, as for a depends_on_past job's first partition)."""
        columns = ", ".join(_quote(name) for name in spec.column_names)
        table = _quote(spec.versions_table)
        if not pins:
            self._ensure_dataset_once(spec)
            return f"(SELECT {columns} FROM {table} WHERE 1 = 0)"
        # Sorted so the rendered SQL, which may be hashed or logged, is deterministic.
        matches = " OR ".join(
            f'("_partition" = {_literal(partition)} AND "_run_id" = {_literal(run_id)})'
            for partition, run_id in sorted(pins.items())
        )
        return f"(SELECT {columns} FROM {table} WHERE {matches})"

    # -- internals --------------------------------------------------------------------

    def _ensure_meta_once(self) -> None:
        if not self._meta_ready:
            self.ensure_meta()

    def _ensure_dataset_once(self, spec: DatasetSpec) -> None:
        if spec not in self._ready:
            self.ensure_dataset(spec)

    def _dataset_is_ready(self, spec: DatasetSpec) -> bool:
        """Whether the versions table has every declared column with its type and the
        view shows every data column; the indexes come with the table."""
        present = self._columns_of(spec.versions_table)
        if any(present.get(c.name, "").lower() != self._physical(c.type).lower() for c in spec.columns):
            return False
        data_columns = [name for name in present if name not in _BOOKKEEPING_COLUMNS]
        return list(self._columns_of(spec.name)) == data_columns + ["_partition", "_run_id"]

    def _data_columns(self, table: str) -> list[str]:
        return [name for name in self._columns_of(table) if name not in _BOOKKEEPING_COLUMNS]

    def _physical(self, logical: str) -> str:
        return _PHYSICAL_TYPES[self.db.dialect][logical]

    def _lock(self, key: str) -> None:
        """Serialise writers of one key until the transaction ends. PostgreSQL needs
        it to queue two attempts of one run (or two DDL runs) instead of racing;
        SQLite's BEGIN IMMEDIATE already admits one writer at a time."""
        if self.db.dialect == "postgresql":
            self.db.query("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (f"backfill:{key}",))

    def _lock_ending_other_holders(self, key: str) -> bool:
        """Take the advisory lock of `key` if it is free (True: taken, one statement as
        `_lock`); otherwise end the other sessions of this role holding it and return
        False (the caller then waits for it, within the lock timeout). Sessions of
        another role are left to the lock and idle-in-transaction timeouts: ending
        them needs a privilege. SQLite: False (BEGIN IMMEDIATE is the lock)."""
        if self.db.dialect != "postgresql":
            return False
        if self.db.query("SELECT pg_try_advisory_xact_lock(hashtextextended(?, 0))", (f"backfill:{key}",))[0][0]:
            return True
        ended = self.db.query(
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

    def _relation_kind(self, name: str) -> str | None:
        if self.db.dialect == "sqlite":
            rows = self.db.query("SELECT type FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')", (name,))
            return rows[0][0] if rows else None
        rows = self.db.query("SELECT relkind FROM pg_catalog.pg_class WHERE oid = to_regclass(?)", (_quote(name),))
        if not rows:
            return None
        return "view" if rows[0][0] == "v" else "table"  # anything else in the way counts as a table

    def _columns_of(self, relation: str) -> dict[str, str]:
        """{column: physical type} of a table or view, in column order; {} if absent."""
        if self.db.dialect == "sqlite":
            rows = self.db.query("SELECT name, type FROM pragma_table_info(?) ORDER BY cid", (relation,))
        else:
            # pg_attribute rather than information_schema, whose views join far more than
            # this needs; to_regclass resolves the name through the search path as a
            # statement would.
            rows = self.db.query(
                """SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
                FROM pg_catalog.pg_attribute AS a
                WHERE a.attrelid = to_regclass(?) AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum""",
                (_quote(relation),),
            )
        return {name: kind for name, kind in rows}

    @staticmethod
    def _check_run(*, run_id: str, attempt_no: int, partition: str) -> None:
        if not isinstance(run_id, str) or not run_id:
            raise ValidationError("run_id must be a non-empty string", field="run_id")
        if not isinstance(partition, str) or not partition:
            raise ValidationError("partition must be a non-empty string", field="partition")
        if not isinstance(attempt_no, int) or attempt_no < 1:
            raise ValidationError("attempt_no must be a positive integer", field="attempt_no")

    def _begin_stage(self, *, spec: DatasetSpec, run_id: str, take_over: bool = False) -> None:
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
        # Without a marker, any row under this run_id is a dead attempt's partial
        # output. A run writes one partition, so all of them go.
        self.db.execute(f'DELETE FROM {_quote(spec.versions_table)} WHERE "_run_id" = ?', (run_id,))

    def _commit_marker(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str) -> Marker:
        numbers, fingerprint = self._numbers_and_fingerprint(spec, run_id)
        marker = Marker(
            run_id=run_id, attempt_no=attempt_no, dataset=spec.name, partition=partition,
            row_count=numbers.row_count, fingerprint=fingerprint, committed_at=_now(),
            null_keys=numbers.null_keys, distinct_keys=numbers.distinct_keys, measure_sum=numbers.measure_sum,
            numbers_of=spec.numbers_of,
        )
        self.db.execute(
            """INSERT INTO "_bf_markers"
            ("run_id", "attempt_no", "dataset", "partition", "row_count", "fingerprint", "committed_at",
             "null_keys", "distinct_keys", "measure_sum", "numbers_of")
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (marker.run_id, marker.attempt_no, marker.dataset, marker.partition, marker.row_count,
             marker.fingerprint, self.db.ts(marker.committed_at), marker.null_keys, marker.distinct_keys,
             marker.measure_sum, marker.numbers_of),
        )
        return marker

    def _numbers_sql(self, spec: DatasetSpec, source: str) -> str:
        """Row count, rows with a NULL key part, measure sum and distinct complete keys
        of one run: `source` is the versions table filtered on the run (`... WHERE
        "_run_id" = ?`), read once more for the keys; the caller binds both. Grouping by the
        key columns counts composite keys correctly, which COUNT(DISTINCT a || b)
        would not ('ab'||'c' = 'a'||'bc')."""
        keys = [_quote(k) for k in spec.business_key]
        any_null = " OR ".join(f"{k} IS NULL" for k in keys)
        all_set = " AND ".join(f"{k} IS NOT NULL" for k in keys)
        measure = f"SUM({_quote(spec.core_measure)})" if spec.core_measure else "NULL"
        return (f"COUNT(*), COALESCE(SUM(CASE WHEN {any_null} THEN 1 ELSE 0 END), 0), {measure}, "
                f"(SELECT COUNT(*) FROM (SELECT 1 FROM {source} AND {all_set} GROUP BY {', '.join(keys)}) AS d)")

    @staticmethod
    def _to_numbers(row: Sequence) -> VersionNumbers:
        row_count, null_keys, measure_sum, distinct_keys = row[:4]
        return VersionNumbers(row_count=int(row_count), null_keys=int(null_keys or 0),
                              distinct_keys=int(distinct_keys), measure_sum=rounded_measure(measure_sum))

    def _numbers(self, spec: DatasetSpec, run_id: str) -> VersionNumbers:
        run_rows = f'{_quote(spec.versions_table)} WHERE "_run_id" = ?'
        return self._to_numbers(self.db.query(
            f"SELECT {self._numbers_sql(spec, run_rows)} FROM {run_rows}", (run_id, run_id))[0])

    def _numbers_and_fingerprint(self, spec: DatasetSpec, run_id: str) -> tuple[VersionNumbers, str]:
        """Both at commit. On PostgreSQL one pass over the run's rows does both."""
        if self.db.dialect != "postgresql":
            return self._numbers(spec, run_id), self._fingerprint_sqlite(spec, run_id)
        run_rows = f'{_quote(spec.versions_table)} WHERE "_run_id" = ?'
        row = self.db.query(
            f"""SELECT {self._numbers_sql(spec, run_rows)}, {self._hash_lanes_sql()}
            FROM (SELECT *, {self._row_hash_sql(spec)} AS h FROM {run_rows} OFFSET 0) AS r""",
            (run_id, run_id),
        )[0]
        return self._to_numbers(row), self._lanes_hex(row[4], row[5])

    _MARKER_COLUMNS = ('"run_id", "attempt_no", "dataset", "partition", "row_count", "fingerprint", "committed_at", '
                       '"null_keys", "distinct_keys", "measure_sum", "numbers_of"')

    def _marker(self, run_id: str, *, lock: bool = False) -> Marker | None:
        statement = f'SELECT {self._MARKER_COLUMNS} FROM "_bf_markers" WHERE "run_id" = ?'
        if lock and self.db.dialect == "postgresql":
            statement += " FOR SHARE"
        rows = self.db.query(statement, (run_id,))
        return self._to_marker(rows[0]) if rows else None

    def markers(self, run_ids: Sequence[str]) -> dict[str, Marker]:
        """{run_id: marker} of those runs that committed (one query; callers chunk)."""
        self._ensure_meta_once()
        if not run_ids:
            return {}
        marks = ", ".join("?" * len(run_ids))
        rows = self.db.query(f'SELECT {self._MARKER_COLUMNS} FROM "_bf_markers" WHERE "run_id" IN ({marks})',
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
        rows = self.db.query(
            'SELECT "run_id" FROM "_bf_current" WHERE "dataset" = ? AND "partition" = ?', (name, partition)
        )
        return rows[0][0] if rows else None

    def _from_ts(self, value: Any) -> datetime:
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc)
        return datetime.strptime(value, SQLITE_TS_FORMAT).replace(tzinfo=timezone.utc)

    # -- values -------------------------------------------------------------------------

    @staticmethod
    def _convert_row(spec: DatasetSpec, converters: list[Callable[[Any], Any]], row: Sequence) -> tuple:
        try:
            return tuple(convert(value) for convert, value in zip(converters, row))
        except (TypeError, ValueError, ArithmeticError) as exc:
            # Find the culprit only on the slow path, to keep the loop above tight.
            for col, convert, value in zip(spec.columns, converters, row):
                try:
                    convert(value)
                except (TypeError, ValueError, ArithmeticError):
                    raise ValidationError(
                        f"{spec.name}.{col.name}: cannot store {value!r} as {col.type}: {exc}", field=col.name
                    ) from exc
            raise

    def _converter(self, col: ColumnSpec) -> Callable[[Any], Any]:
        """Python value -> parameter for this dialect. Normalising here (UTC text for
        SQLite timestamps, ISO dates, 0/1 booleans) is what makes the same data stored
        twice byte-identical, and so fingerprint-identical."""
        sqlite = self.db.dialect == "sqlite"
        ts = self.db.ts

        def text(v):
            return v if v is None or isinstance(v, str) else str(v)

        def integer(v):
            if v is None or type(v) is int:
                return v
            if isinstance(v, str):
                return int(v)
            if isinstance(v, (bool, int)) or (isinstance(v, (float, Decimal)) and v == int(v)):
                return int(v)
            raise TypeError("not an integer")

        def numeric(v):
            if v is None:
                return None
            if isinstance(v, str):
                v = Decimal(v)
            if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
                raise TypeError("not a number")
            return float(v) if sqlite else v

        def timestamp(v):
            if v is None:
                return None
            if isinstance(v, str):
                v = datetime.fromisoformat(v)
            if not isinstance(v, datetime):
                raise TypeError("not a datetime")
            return ts(v)  # refuses naive datetimes

        def day(v):
            if v is None:
                return None
            if isinstance(v, str):
                v = date.fromisoformat(v)
            if isinstance(v, datetime) or not isinstance(v, date):
                raise TypeError("not a date (a datetime is ambiguous: which timezone's day?)")
            return v.isoformat() if sqlite else v

        def boolean(v):
            if v is None:
                return None
            if not isinstance(v, (bool, int)) or v not in (0, 1):
                raise TypeError("not a boolean")
            return int(v) if sqlite else bool(v)

        return {"text": text, "integer": integer, "numeric": numeric, "timestamp": timestamp,
                "date": day, "boolean": boolean}[col.type]

    # -- fingerprint ----------------------------------------------------------------------

    def _fingerprint(self, spec: DatasetSpec, run_id: str) -> str:
        if self.db.dialect == "postgresql":
            return self._fingerprint_postgresql(spec, run_id)
        return self._fingerprint_sqlite(spec, run_id)

    def _fingerprint_postgresql(self, spec: DatasetSpec, run_id: str) -> str:
        high, low = self.db.query(
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
        places = _FINGERPRINT_DECIMALS
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

    def _fingerprint_sqlite(self, spec: DatasetSpec, run_id: str) -> str:
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
        scale = 10**_FINGERPRINT_DECIMALS

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
        for batch in self.db.stream(
            f"""SELECT json_array({values}) AS line FROM {_quote(spec.versions_table)}
            WHERE "_run_id" = ? ORDER BY line""",
            (run_id,),
        ):
            # One line per row, so the digest does not depend on the batch size.
            digest.update("".join([line + "\n" for (line,) in batch]).encode())
        return digest.hexdigest()
