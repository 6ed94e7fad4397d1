"""The warehouse backend interface: what the portal asks of wherever the data lives.

A backend keeps, for every produced dataset, isolated *versions* (one per run, written
under the run's identity and invisible to readers), a *commit marker* per run written
with its rows, and a *pointer* per (dataset, partition) naming the published version,
moved only by compare-and-set. Everything above this package speaks to a warehouse
through `WarehouseBackend`; implementations register themselves by URL scheme (see
`backfill_portal.backends.register_backend`) and `get_warehouse()` picks one by
`WAREHOUSE_URL`. The guarantees each implementation must keep are the contract suite
in `tests/backends/test_contract.py`.

This module holds the interface, the values it passes and the errors it raises; it
imports nothing but `core`.
"""
from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal
from typing import Any, NamedTuple

from backfill_portal.core.errors import ConflictError, Unavailable, ValidationError

__all__ = [
    "COLUMN_TYPES",
    "AlreadyCommitted",
    "ColumnSpec",
    "DatasetSpec",
    "Estimate",
    "Marker",
    "PointerMove",
    "Profile",
    "PublicationRecord",
    "PublishConflict",
    "PurgeRefused",
    "VersionNotCommitted",
    "VersionNumbers",
    "WarehouseBackend",
    "WarehouseLockTimeout",
    "WarehouseUnavailable",
    "rounded_measure",
]

COLUMN_TYPES = ("text", "integer", "numeric", "timestamp", "date", "boolean")

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]*$")
# `<name>__versions_run` and PostgreSQL's per-version tables `<name>__v<16 hex>` must
# fit PostgreSQL's 63-byte identifier limit.
MAX_DATASET_NAME = 40
# The names the backends give their own tables of a dataset: a dataset may not take one.
STORAGE_SUFFIX = re.compile(r"__versions$|__v[0-9a-f]{16}$|__bld$|__old$")
MAX_COLUMN_NAME = 63
BOOKKEEPING_COLUMNS = ("_run_id", "_partition", "_attempt")
# How a SQL warehouse shows a dataset to readers where it can choose (PostgreSQL):
# "partitioned", each published version attached as a partition of the reader table
# (a publish moves no rows), or "table", one plain table whose partition a publish
# replaces by the version's rows in the pointer's transaction (a reader's lookup by
# any column probes one index, whatever the number of partitions). DatasetSpec's ""
# is the warehouse's default.
READER_LAYOUTS = ("partitioned", "table")
META_PREFIX = "_bf_"
ACTIONS = ("publish", "rollback")
# Digits kept when numbers are fingerprinted: enough for money and rates, few enough
# that the last-bit noise of float arithmetic does not change the fingerprint.
FINGERPRINT_DECIMALS = 6


def identifier(name: str, *, what: str, max_length: int = MAX_COLUMN_NAME) -> str:
    """`name` if it is a valid dataset or column name, else ValidationError."""
    # fullmatch: with match(), `$` would also accept a trailing newline.
    if not isinstance(name, str) or not IDENTIFIER.fullmatch(name) or len(name) > max_length:
        raise ValidationError(
            f"{what} {name!r} must match {IDENTIFIER.pattern} and be at most {max_length} characters",
            field=what,
        )
    return name


def rounded_measure(value: Any) -> float | None:
    """A measure sum as every reader compares it: rounded like the fingerprint, since a
    float sum may differ in its last bits with the order rows are read in."""
    return None if value is None else round(float(value), FINGERPRINT_DECIMALS)


def fingerprint_kind(fingerprint: str) -> str:
    """How `fingerprint` was computed: the text before its ':' ("v2" for "v2:...."), or
    "" for the first fingerprint each backend had (bare hex digits, no ':'). Markers and
    versions keep the fingerprint they were staged with, so a warehouse can hold
    several kinds at once (`WarehouseBackend.FINGERPRINT_KIND`: what it computes now)."""
    head, sep, _ = (fingerprint or "").partition(":")
    return head if sep else ""


def convert_row(spec: DatasetSpec, converters, row) -> tuple:
    """`row` converted by `converters`, one per declared column; a value that does not
    convert is refused with its column named (ValidationError). The culprit is looked
    for only on that slow path, to keep the loop over the values tight."""
    try:
        return tuple(convert(value) for convert, value in zip(converters, row))
    except (TypeError, ValueError, ArithmeticError) as exc:
        for col, convert, value in zip(spec.columns, converters, row):
            try:
                convert(value)
            except (TypeError, ValueError, ArithmeticError):
                raise ValidationError(f"{spec.name}.{col.name}: cannot store {value!r} as {col.type}: {exc}",
                                      field=col.name) from exc
        raise


# -- specs and results -------------------------------------------------------------


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: str

    def __post_init__(self) -> None:
        identifier(self.name, what="column")
        if self.name in BOOKKEEPING_COLUMNS:
            raise ValidationError(f"column name {self.name!r} is reserved for the warehouse", field="column")
        if self.type not in COLUMN_TYPES:
            raise ValidationError(
                f"column {self.name!r} has type {self.type!r}; expected one of {', '.join(COLUMN_TYPES)}",
                field="column",
            )


    def parser(self) -> Callable[[Any], Any]:
        """Python value -> this column's canonical Python value (str, int, int/float/Decimal,
        datetime, date, bool; None stays None), refusing what is not of its type with a
        TypeError or ValueError. Every backend stores what this returns, in its own
        representation, so the same data staged on any backend is the same data."""
        return _PARSERS[self.type]


def _text(v):
    return v if v is None or isinstance(v, str) else str(v)


def _integer(v):
    if v is None or type(v) is int:
        return v
    if isinstance(v, str):
        return int(v)
    if isinstance(v, (bool, int)) or (isinstance(v, (float, Decimal)) and v == int(v)):
        return int(v)
    raise TypeError("not an integer")


def _numeric(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = Decimal(v)
    if isinstance(v, bool) or not isinstance(v, (int, float, Decimal)):
        raise TypeError("not a number")
    return v


def _timestamp(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = datetime.fromisoformat(v)
    if not isinstance(v, datetime):
        raise TypeError("not a datetime")
    return v


def _day(v):
    if v is None:
        return None
    if isinstance(v, str):
        v = date.fromisoformat(v)
    if isinstance(v, datetime) or not isinstance(v, date):
        raise TypeError("not a date (a datetime is ambiguous: which timezone's day?)")
    return v


def _boolean(v):
    if v is None:
        return None
    if not isinstance(v, (bool, int)) or v not in (0, 1):
        raise TypeError("not a boolean")
    return bool(v)


_PARSERS = {"text": _text, "integer": _integer, "numeric": _numeric, "timestamp": _timestamp,
            "date": _day, "boolean": _boolean}


@dataclass(frozen=True)
class DatasetSpec:
    """What a backend needs to know about a produced dataset. Columns may be given
    as `ColumnSpec`s or `(name, type)` pairs; they are stored as a tuple so the spec
    stays hashable."""

    name: str
    columns: tuple[ColumnSpec, ...]
    business_key: tuple[str, ...]
    core_measure: str = ""
    #: A declared text column that holds the partition key ('2022-10-01',
    #: '2022-10-01T03') in every row: readers filter on it, and a row whose value is
    #: not its version's partition key is refused when staged. "": readers filter on
    #: the bookkeeping column `_partition` instead.
    partition_column: str = ""
    #: Indexes a reader's usual filters need, each a tuple of declared column names,
    #: created on every version.
    indexes: tuple[tuple[str, ...], ...] = ()
    #: READER_LAYOUTS, or "" for the warehouse's default; a backend with one layout
    #: ignores it.
    reader_layout: str = ""

    def __post_init__(self) -> None:
        identifier(self.name, what="dataset", max_length=MAX_DATASET_NAME)
        if self.name.startswith(META_PREFIX) or STORAGE_SUFFIX.search(self.name):
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
        if self.partition_column and (self.partition_column not in names
                                      or self.column(self.partition_column).type != "text"):
            raise ValidationError(
                f"partition column {self.partition_column!r} of {self.name!r} must be a declared text column",
                field="partition_column",
            )
        indexes = tuple(tuple(ix) for ix in self.indexes)
        object.__setattr__(self, "indexes", indexes)
        for ix in indexes:
            if not ix or len(set(ix)) != len(ix) or any(c not in names for c in ix):
                raise ValidationError(
                    f"index {list(ix)!r} of {self.name!r} must name distinct declared columns",
                    field="indexes",
                )
        if len(set(indexes)) != len(indexes):
            raise ValidationError(f"dataset {self.name!r} declares an index twice", field="indexes")
        if self.reader_layout and self.reader_layout not in READER_LAYOUTS:
            raise ValidationError(
                f"reader layout {self.reader_layout!r} of {self.name!r} must be one of {', '.join(READER_LAYOUTS)}",
                field="reader_layout",
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
    def partition_key_column(self) -> str:
        """The column readers filter a partition by: `partition_column`, else `_partition`."""
        return self.partition_column or "_partition"

    @property
    def versions_table(self) -> str:
        return f"{self.name}__versions"

    def column(self, name: str) -> ColumnSpec:
        for col in self.columns:
            if col.name == name:
                return col
        raise ValidationError(f"dataset {self.name!r} has no column {name!r}", field="columns")


class VersionNumbers(NamedTuple):
    """What verification and reconciliation compare of one version."""

    row_count: int
    null_keys: int  # rows where any key column is NULL
    distinct_keys: int  # distinct keys among rows whose key has no NULL
    measure_sum: float | None  # None: no core measure declared, or no non-NULL value

    @property
    def duplicate_keys(self) -> int:
        return self.row_count - self.null_keys - self.distinct_keys


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


@dataclass(frozen=True)
class Profile:
    row_count: int
    distinct_keys: int  # distinct business keys among rows whose key has no NULL
    null_keys: int  # rows where any key column is NULL
    duplicate_keys: int  # rows with a complete key minus distinct complete keys
    measure_sum: float | None  # None: no core measure declared, or no non-NULL value
    fingerprint: str
    columns: list[tuple[str, str]]  # data columns present in the version's storage


@dataclass(frozen=True)
class Estimate:
    """The warehouse's own estimate of a SELECT, taken without running it (`explain`):
    what an approver reads before saying yes. `rows` and `cost` are the planner's
    figures for the whole statement, None where the engine gives none; `plan` its
    lines; `note` says what is missing and why; `error` the planner's refusal."""

    engine: str
    rows: int | None = None
    cost: float | None = None
    plan: tuple[str, ...] = ()
    note: str = ""
    error: str = ""


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


class PointerMove(NamedTuple):
    """One partition of a `rollback_many`: move `name`/`partition` from
    `expected_run_id` back to `to_run_id`."""

    name: str
    partition: str
    to_run_id: str
    expected_run_id: str


# -- refusals ------------------------------------------------------------------------


class WarehouseUnavailable(Unavailable):
    """The warehouse refused the connection or the statement could not run."""


class WarehouseLockTimeout(Exception):
    """A lock the statement needed stayed held past the session's lock timeout (the
    warehouse is up; another session holds it)."""


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


# -- the interface ---------------------------------------------------------------------


class WarehouseBackend(abc.ABC):
    """One warehouse, named by its URL. An instance is shared by the threads of a
    process (`get_warehouse` keeps one per URL); it must not be shared across
    processes. Every write method is all-or-nothing.

    Run identity: `run_id` names a version, `attempt_no` the attempt that wrote it,
    `partition` the one partition a run writes. Dataset names and columns come from a
    validated `DatasetSpec`.
    """

    #: The URL schemes this class was registered under (set by `register_backend`).
    schemes: tuple[str, ...] = ()
    #: The SQL dialect of the engine that runs job templates, checks and `query`
    #: ("sqlite", "postgresql", ...): the catalog's SQL is written in it.
    dialect: str = ""
    #: The kind of fingerprint `fingerprint` computes now (`fingerprint_kind`); a
    #: marker holding another kind is fingerprinted again when compared (`profile`).
    FINGERPRINT_KIND: str = ""

    def __init__(self, url: str, *, lock_timeout_seconds: int = 0, idle_in_transaction_timeout_seconds: int = 0,
                 publish_lock_timeout_seconds: float = 1.0, publish_wait_seconds: float = 300.0):
        """Constructing a backend opens nothing; the first operation connects.

        `publish_lock_timeout_seconds`: how long one try of a pointer switch waits for
        a lock readers hold (a backend whose switch takes one) before it lets go and
        tries again, so that readers queued behind it wait no longer than that;
        `publish_wait_seconds`: how long it keeps trying before WarehouseLockTimeout."""
        self.url = url
        self.lock_timeout_seconds = lock_timeout_seconds
        self.idle_in_transaction_timeout_seconds = idle_in_transaction_timeout_seconds
        self.publish_lock_timeout_seconds = publish_lock_timeout_seconds
        self.publish_wait_seconds = publish_wait_seconds

    @classmethod
    def url_problem(cls, url: str) -> str | None:
        """What is wrong with the options `url` gives this backend, in one line (the
        settings check at start shows it); None if nothing."""
        return None

    # -- schema -----------------------------------------------------------------------

    @abc.abstractmethod
    def ensure_meta(self) -> None:
        """Create the backend's own bookkeeping (pointers, history, markers) if
        missing. Idempotent; `get_warehouse` calls it once per process and URL."""

    @abc.abstractmethod
    def ensure_dataset(self, spec: DatasetSpec) -> None:
        """Create or evolve the storage of `spec` and its reader-visible form.
        Idempotent. Columns are only ever added, never dropped or retyped (old
        versions must stay readable for rollback); a retyped column is a
        ValidationError."""

    def upgrade_layout(self, spec: DatasetSpec) -> dict[str, Any]:
        """Convert `spec`'s storage from an older layout of this backend, keeping every
        version, marker and pointer move; {} when there is nothing to convert. What
        was done otherwise, as {"versions": n, "published": n, ...}."""
        return {}

    # -- staging ----------------------------------------------------------------------

    @abc.abstractmethod
    def stage_rows(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                   rows: Iterable[Sequence], chunk_size: int = 5000, take_over: bool = False) -> Marker:
        """Write a run's rows (in `spec.columns` order) as its version and commit its
        marker with them, in one transaction: a failure anywhere (including in `rows`)
        leaves neither. A run that already has a marker: AlreadyCommitted. Rows an
        earlier, dead attempt of the run left without a marker are discarded first.
        `take_over`: the caller is the run's only live writer, so a session still
        holding the run's staging lock belongs to a dead attempt and may be ended
        rather than waited for. A value that cannot be stored as its column's type:
        ValidationError naming the column."""

    @abc.abstractmethod
    def stage_select(self, *, spec: DatasetSpec, run_id: str, attempt_no: int, partition: str,
                     select_sql: str, params: Sequence = (), take_over: bool = False) -> Marker:
        """Like `stage_rows`, the rows coming from a SELECT (in `dialect`, `?`
        placeholders bound from `params`) run by the warehouse's engine. Its output
        columns carry the declared names; extra ones are ignored."""

    @abc.abstractmethod
    def marker(self, run_id: str) -> Marker | None:
        """The run's commit marker, or None: how a retry learns where it stopped."""

    @abc.abstractmethod
    def markers(self, run_ids: Sequence[str]) -> dict[str, Marker]:
        """{run_id: marker} of those runs that committed, in one round trip (callers
        pass a few hundred at a time)."""

    # -- numbers ----------------------------------------------------------------------

    @abc.abstractmethod
    def profile(self, *, spec: DatasetSpec, run_id: str) -> Profile:
        """The numbers verification compares, and the columns the version holds.
        A committed version's are its marker's; others are counted now."""

    @abc.abstractmethod
    def fingerprint(self, *, spec: DatasetSpec, run_id: str) -> str:
        """An order-independent content hash of the version's declared columns, of this
        backend's `FINGERPRINT_KIND` (hex digits, after "<kind>:" if the kind has a
        name): the same multiset of rows gives the same value, an extra copy of a row or
        a changed value a different one. Comparable within one backend and kind only."""

    @abc.abstractmethod
    def profile_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, VersionNumbers]:
        """{run_id: numbers} of those runs that have rows of `spec`, a few queries for
        thousands of runs (reconciliation of a whole request)."""

    @abc.abstractmethod
    def measure_many(self, *, spec: DatasetSpec, run_ids: Iterable[str]) -> dict[str, float | None]:
        """{run_id: core-measure sum}; empty when `spec` declares no core measure."""

    # -- publication ------------------------------------------------------------------

    @abc.abstractmethod
    def publish(self, *, spec_or_name: DatasetSpec | str, partition: str, run_id: str,
                expected_run_id: str | None, actor: str, action: str = "publish") -> PublicationRecord:
        """Point (dataset, partition) at `run_id` if it still points at
        `expected_run_id` (None: if nothing is published there yet), and append the
        history row, atomically. The pointer elsewhere: PublishConflict, nothing
        written. A run without a marker for exactly this partition:
        VersionNotCommitted; `action="rollback"` also requires that `run_id` was
        published here before."""

    def rollback(self, *, name: str, partition: str, to_run_id: str, expected_run_id: str,
                 actor: str) -> PublicationRecord:
        """Move the pointer back to a version that was published here before, with the
        same compare-and-set as `publish`."""
        return self.publish(spec_or_name=name, partition=partition, run_id=to_run_id,
                            expected_run_id=expected_run_id, actor=actor, action="rollback")

    @abc.abstractmethod
    def rollback_many(self, moves: Sequence[PointerMove], *, actor: str) -> list[PublicationRecord]:
        """Every move's `rollback`, all or none: one lost race (PublishConflict) leaves
        every pointer where it was."""

    @abc.abstractmethod
    def current(self, name: str, partition: str) -> str | None:
        """The run id published for (dataset, partition), or None."""

    @abc.abstractmethod
    def current_many(self, name: str, partitions: Sequence[str]) -> dict[str, str]:
        """{partition: run_id} for the published ones among `partitions` (any number)."""

    @abc.abstractmethod
    def history(self, name: str, partition: str) -> list[PublicationRecord]:
        """Every pointer move of one partition, newest first."""

    # -- retention --------------------------------------------------------------------

    @abc.abstractmethod
    def purge(self, *, spec: DatasetSpec, run_id: str) -> int:
        """Delete a version and its marker; return the rows deleted. PurgeRefused while
        the version is current anywhere. Which versions to keep is the caller's policy."""

    def sweep_orphans(self, spec_or_name: DatasetSpec | str) -> list[str]:
        """Delete what dead writers of a dataset left that no reader sees and no marker
        names (never a live writer's); return what was deleted. Retention calls it for
        every produced dataset. A transactional warehouse has nothing to sweep: the
        database rolls back a dead writer's transaction; a files layout (Iceberg) does."""
        return []

    # -- reading ----------------------------------------------------------------------

    @abc.abstractmethod
    def read_partition(self, name: str, partition: str) -> list[dict]:
        """The published rows of one partition as readers see them (one consistent
        version), as {column: value} dicts. Unordered."""

    @abc.abstractmethod
    def ref_sql(self, *, spec: DatasetSpec, pins: dict[str, str]) -> str:
        """A parenthesised subquery, in `dialect`, over exactly the pinned versions
        {partition: run_id}, with the declared columns: what a downstream run reads,
        unchanged by later publishes. No pins: the columns and no rows."""

    @abc.abstractmethod
    def source_sql(self, *, name: str, time_column: str, start: datetime, end: datetime) -> str:
        """A parenthesised subquery over a *source* dataset's rows whose `time_column`
        is in [start, end)."""

    # -- sources: tables the portal reads and does not produce --------------------------

    @abc.abstractmethod
    def load_source(self, *, spec: DatasetSpec, rows: Any, time_column: str = "", load_key: str | None = None,
                    replace: bool = False) -> int:
        """Create the source table `spec.name` (its declared columns, nothing of the
        portal's own) if missing and append `rows`: sequences in `spec.columns` order of
        values `ColumnSpec.parser` takes, or a pyarrow Table / RecordBatch with those
        columns (the bulk path). All or nothing; returns the rows written. `source_sql`
        reads the table afterwards, by `time_column` (indexed or laid out for that).

        `load_key` makes a load idempotent: a key this source has recorded writes
        nothing and returns 0; otherwise the key is recorded with the rows, atomically
        (of two loaders of one key, one writes). `replace`: the table's earlier rows and
        recorded keys are dropped in the same transaction, so readers see the old rows
        or the new ones. A name a produced dataset has, or a value its column cannot
        store: ValidationError, nothing written."""

    @abc.abstractmethod
    def source_loads(self, name: str) -> dict[str, int] | None:
        """{load_key: rows} of the keyed loads of source `name`; None when the
        warehouse has no such source table."""

    # -- the engine: SQL that jobs and checks run ---------------------------------------

    @abc.abstractmethod
    def query(self, statement: str, params: Sequence = ()) -> list[tuple]:
        """Run one statement (in `dialect`, `?` placeholders) and return its rows."""

    @abc.abstractmethod
    def query_dicts(self, statement: str, params: Sequence = ()) -> list[dict]:
        """`query`, each row as {column: value}."""

    @abc.abstractmethod
    def columns_of(self, select_sql: str) -> list[str]:
        """The output column names of a SELECT, without reading its rows."""

    @abc.abstractmethod
    def ts(self, value: datetime) -> Any:
        """An aware datetime as a parameter value of this engine (UTC)."""

    @abc.abstractmethod
    def ts_literal(self, value: datetime) -> str:
        """An aware datetime as a SQL literal of this engine, for rendered templates."""

    def explain(self, select_sql: str) -> Estimate:
        """The engine's estimate of a SELECT (in `dialect`) without reading its rows.
        Never raises: a statement the planner refuses is an `Estimate` with `error`.
        A backend whose engine has no planner to ask keeps this answer."""
        return Estimate(engine=self.dialect or "warehouse", note="this warehouse gives no estimate")

    # -- connections ------------------------------------------------------------------

    @abc.abstractmethod
    def probe(self, *, timeout: float | None = None) -> None:
        """Try a fresh connection (never the thread's own, which may be the broken one
        or inside a transaction) within `timeout` seconds; WarehouseUnavailable
        (chained from the driver's error) if the warehouse refuses. Creates nothing."""

    def close(self) -> None:
        """Close this thread's connection, if any."""
