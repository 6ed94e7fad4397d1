"""What every executor shares: pinned inputs, template rendering, reading an upstream,
and the `ExecutionContext` an executor receives.

Inputs are pinned at run start (the first attempt) and recorded as consumption;
later attempts of the same run read exactly the same versions. A SQL template may
use only the data interval, the partition key and ref('dataset').
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Iterable

import jinja2
from django.db.models import prefetch_related_objects
from django.utils import timezone

from backfill_portal.backends import Marker, WarehouseBackend
from backfill_portal.backfills.staleness import gap_before
from backfill_portal.catalog.calendar import PlannedInterval, previous_partition
from backfill_portal.catalog.lineage import covered_partition_keys
from backfill_portal.catalog.models import Dataset, Job
from backfill_portal.catalog.specs import spec_for
from backfill_portal.catalog.sqlcheck import TemplateError, check_template
from backfill_portal.core.rows import insert_new_rows
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Consumption, Version

_env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
# Every run of a job renders the same frozen template (and verification its checks):
# compile each text once per process. A compiled template renders safely many times.
_compiled = functools.lru_cache(maxsize=512)(_env.from_string)


class ExecutionError(Exception):
    """The run cannot produce its version (bad template, failing callable...)."""


def _q(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def covered_partitions(dataset: Dataset, start: datetime, end: datetime) -> list[str]:
    """Partitions of `dataset` (in its grain and timezone) overlapping [start, end)."""
    return covered_partition_keys(grain=dataset.grain, timezone=dataset.timezone, start=start, end=end)


@dataclass
class PinnedInputs:
    """What this run reads: {dataset: {partition: run_id}} for produced datasets, and
    the source datasets it reads by interval."""

    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    previous: dict[str, str] = field(default_factory=dict)


def upstreams_of(job: Job) -> list[Dataset]:
    """The job's upstream datasets, fetched once per job object: a run renders its
    template, its reconciliation query and every custom check against them."""
    upstreams = job.__dict__.get("_upstreams_of")
    if upstreams is None:
        # As Django's prefetch cache would keep them, without its lookups on every call
        # (a bundle's runs ask several times each).
        prefetch_related_objects([job], "upstreams")
        upstreams = job.__dict__["_upstreams_of"] = tuple(job.upstreams.all())
    return list(upstreams)


def pins_recorded(run: Run) -> PinnedInputs | None:
    """The inputs this run pinned at its start, from its consumption rows; None before
    it pinned any. A read only: the run page renders the SQL against them."""
    job = run.job
    # Plain columns: a first attempt finds none, and joining the datasets and the
    # versions' runs here cost more to compile than the whole query takes to run.
    existing = list(Consumption.objects.filter(run=run).order_by().values_list("dataset_id", "partition_key",
                                                                                "version_id"))
    if not existing:
        return None
    pins = PinnedInputs()
    upstreams = upstreams_of(job)
    datasets = {d.pk: d for d in (*upstreams, job.dataset)}
    datasets.update(Dataset.objects.in_bulk({pk for pk, _, _ in existing} - datasets.keys()))
    run_ids = dict(Version.objects.filter(pk__in=[v for _, _, v in existing if v]).order_by()
                   .values_list("pk", "run__run_id"))
    for dataset_id, partition_key, version_id in existing:
        dataset = datasets[dataset_id]
        if dataset.is_source:
            pins.sources.add(dataset.name)
        elif dataset_id == job.dataset_id:
            if version_id:
                pins.previous[partition_key] = run_ids[version_id]
        elif version_id:
            pins.versions.setdefault(dataset.name, {})[partition_key] = run_ids[version_id]
        else:
            pins.versions.setdefault(dataset.name, {})
    for up in upstreams:
        if not up.is_source:
            pins.versions.setdefault(up.name, {})
    return pins


def pin_inputs(run: Run, warehouse: WarehouseBackend, *, first_attempt: bool = False) -> PinnedInputs:
    """Pin each upstream's current published versions at run start, once per run.
    `first_attempt`: the first attempt of a run that inherits no pins (not a second
    rerun's verification run, which starts with its original's): none can be recorded
    yet, so they are not read."""
    recorded = None if first_attempt else pins_recorded(run)
    if recorded is not None:
        return recorded
    job = run.job
    pins = PinnedInputs()
    upstreams = upstreams_of(job)
    needs_previous = job.depends_on_past
    now = timezone.now()
    records: list[Consumption] = []
    for up in upstreams:
        if up.is_source:
            pins.sources.add(up.name)
            records.append(Consumption(run=run, dataset=up, partition_key=run.partition_key,
                                       watermark=source_watermark(warehouse, up, run), pinned_at=now))
            continue
        partitions = covered_partitions(up, run.data_interval_start, run.data_interval_end)
        current = warehouse.current_many(up.name, partitions)
        if run.request_id:
            # In a cascade, read what this request published upstream, even if
            # someone published another version since.
            current.update(dict(Run.objects.filter(
                request_id=run.request_id, job__dataset=up, status__in=[RunStatus.PUBLISHED, RunStatus.SUPERSEDED],
                partition_key__in=partitions).values_list("partition_key", "run_id")))
        pins.versions[up.name] = current
        versions = {v.run.run_id: v for v in Version.objects.filter(run__run_id__in=list(current.values())).select_related("run")}
        for partition in partitions:
            run_id = current.get(partition)
            records.append(Consumption(run=run, dataset=up, partition_key=partition,
                                       version=versions.get(run_id) if run_id else None, pinned_at=now))
    if needs_previous:
        prev_key = previous_partition(grain=job.dataset.grain, timezone=job.dataset.timezone,
                                      partition_key=run.partition_key)
        prev_run = warehouse.current(job.dataset.name, prev_key)
        if prev_run:
            pins.previous[prev_key] = prev_run
            version = Version.objects.filter(run__run_id=prev_run).first()
            records.append(Consumption(run=run, dataset=job.dataset, partition_key=prev_key, version=version, pinned_at=now))
        else:
            # Where the dataset begins there is no previous partition; in a gap there
            # must be one (the plan refuses it; this holds if it appeared since): the
            # attempt fails naming where to start instead of starting from nothing.
            here = PlannedInterval(run.partition_key, run.data_interval_start, run.data_interval_end,
                                   job.dataset.grain, job.dataset.timezone)
            if gap := gap_before(job=job, first=here):
                raise ExecutionError(gap)
    insert_new_rows(records, ignore_conflicts=True)
    return pins


class LazyPins:
    """The run's pinned inputs, read only if a template asks for them (verification
    renders its checks against them, and most checks read only `this`)."""

    def __init__(self, run: Run, warehouse: WarehouseBackend):
        self._load = lambda: pin_inputs(run, warehouse)
        self._pins: PinnedInputs | None = None

    def __getattr__(self, name: str):
        if self._pins is None:
            self._pins = self._load()
        return getattr(self._pins, name)


def source_watermark(warehouse: WarehouseBackend, source: Dataset, run: Run) -> dict:
    """Row count, max ingested_at and the measure over the interval: a later rerun
    compares them to tell whether the source changed underneath."""
    columns = set(source.column_names)
    parts = ["COUNT(*)"]
    parts.append('MAX("ingested_at")' if "ingested_at" in columns else "NULL")
    parts.append(f'SUM("{source.core_measure}")' if source.core_measure else "NULL")
    row = warehouse.query(f'SELECT {", ".join(parts)} FROM {source_sql(warehouse, source, run)} AS s')[0]
    measure = row[2]
    return {"row_count": int(row[0] or 0), "max_ingested_at": str(row[1]) if row[1] is not None else None,
            "measure": round(float(measure), 4) if measure is not None else None}


def source_sql(warehouse: WarehouseBackend, source: Dataset, run: Run) -> str:
    return warehouse.source_sql(name=source.name, time_column=source.time_column,
                                start=run.data_interval_start, end=run.data_interval_end)


def render(template: str, *, run: Run, warehouse: WarehouseBackend, pins: PinnedInputs,
           this_sql: str | None = None) -> str:
    """Render a template against the pinned inputs. Re-checked with the parser here
    too: a template must not smuggle in now() through a parameter."""
    job = run.job
    datasets = {d.name: d for d in upstreams_of(job)}
    try:
        check_template(template, upstreams=set(datasets))
    except TemplateError as exc:
        raise ExecutionError(str(exc)) from None

    def ref(name: str) -> str:
        dataset = datasets.get(name)
        if dataset is None:
            raise ExecutionError(f"ref('{name}') is not a declared upstream of {job.name}")
        if dataset.is_source:
            return source_sql(warehouse, dataset, run)
        return warehouse.ref_sql(spec=spec_for(dataset), pins=pins.versions.get(name, {}))

    def ref_previous() -> str:
        return warehouse.ref_sql(spec=spec_for(job.dataset), pins=pins.previous)

    try:
        return _compiled(template).render(
            data_interval_start=warehouse.ts_literal(run.data_interval_start),
            data_interval_end=warehouse.ts_literal(run.data_interval_end),
            partition_key=_q(run.partition_key),
            ref=ref, ref_previous=ref_previous, this=this_sql or "",
        )
    except jinja2.TemplateError as exc:
        raise ExecutionError(f"template does not render: {exc}") from None


def reader(warehouse: WarehouseBackend, pins: PinnedInputs, run: Run) -> Callable[[str], list[dict]]:
    """read(name): the rows of a declared upstream as this run pinned it (a source over
    the run's interval)."""
    datasets = {d.name: d for d in run.job.upstreams.all()}

    def read(name: str) -> list[dict]:
        dataset = datasets.get(name)
        if dataset is None:
            raise ExecutionError(f"{run.job.name} does not declare {name} upstream")
        sql = source_sql(warehouse, dataset, run) if dataset.is_source else warehouse.ref_sql(
            spec=spec_for(dataset), pins=pins.versions.get(name, {}))
        return warehouse.query_dicts(f"SELECT * FROM {sql} AS q")

    return read


@dataclass
class ExecutionContext:
    """What an executor receives: one attempt of one run, its inputs already pinned.
    An executor ends by staging the run's version (`stage_select` or `stage_rows`),
    which writes the commit marker with the rows, and returns that marker."""

    run: Run
    attempt_no: int
    warehouse: WarehouseBackend
    pins: PinnedInputs
    definition: dict  # the frozen code version's definition: kind, reads, params, the kind's fields
    spec: object
    should_stop: Callable[[], bool] = lambda: False
    _read: Callable[[str], list[dict]] | None = field(default=None, init=False, repr=False)

    def render(self, template: str) -> str:
        """A template rendered against the pinned inputs (data interval, partition key, ref)."""
        return render(template, run=self.run, warehouse=self.warehouse, pins=self.pins)

    def ref_sql(self, name: str) -> str:
        """The SQL relation of a declared upstream exactly as this run pinned it."""
        dataset = next((d for d in upstreams_of(self.run.job) if d.name == name), None)
        if dataset is None:
            raise ExecutionError(f"{name} is not a declared upstream of {self.run.job.name}")
        if dataset.is_source:
            return source_sql(self.warehouse, dataset, self.run)
        return self.warehouse.ref_sql(spec=spec_for(dataset), pins=self.pins.versions.get(name, {}))

    def read(self, name: str) -> list[dict]:
        """The rows of a declared upstream as this run pinned it."""
        if self._read is None:
            self._read = reader(self.warehouse, self.pins, self.run)
        return self._read(name)

    def record_output_columns(self, columns: list[str]) -> None:
        """What the run produced, for the declared-schema check: kept on the run, and
        written with its move to `staged` (services/runs.py attempt_succeed)."""
        self.run.output_columns = columns

    def stage_select(self, sql: str) -> Marker:
        self.record_output_columns(self.warehouse.columns_of(sql))
        return self.warehouse.stage_select(spec=self.spec, run_id=self.run.run_id, attempt_no=self.attempt_no,
                                           partition=self.run.partition_key, select_sql=sql, take_over=True)

    def stage_rows(self, rows: Iterable[tuple]) -> Marker:
        return self.warehouse.stage_rows(spec=self.spec, run_id=self.run.run_id, attempt_no=self.attempt_no,
                                         partition=self.run.partition_key, rows=rows, take_over=True)
