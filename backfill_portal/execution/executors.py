"""Executors: turn one run into one staged version in the warehouse.

Inputs are pinned at run start (the first attempt) and recorded as consumption;
later attempts of the same run read exactly the same versions. A SQL template may
use only the data interval, the partition key and ref('dataset').
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable

import jinja2
from django.db import IntegrityError, transaction
from django.db.models import prefetch_related_objects
from django.utils import timezone

from backfill_portal.catalog.calendar import previous_partition
from backfill_portal.catalog.lineage import covered_partition_keys
from backfill_portal.catalog.choices import JobKind
from backfill_portal.catalog.models import Dataset, Job
from backfill_portal.catalog.sqlcheck import TemplateError, check_template
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Delivery, Run
from backfill_portal.warehouse.adapter import Marker, Warehouse
from backfill_portal.warehouse.models import Consumption, Version
from backfill_portal.warehouse.registry import spec_for

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
    prefetch_related_objects([job], "upstreams")
    return list(job.upstreams.all())


def pin_inputs(run: Run, warehouse: Warehouse) -> PinnedInputs:
    """Pin each upstream's current published versions at run start, once per run."""
    job = run.job
    # Plain columns: a first attempt finds none, and joining the datasets and the
    # versions' runs here cost more to compile than the whole query takes to run.
    existing = list(Consumption.objects.filter(run=run).order_by().values_list("dataset_id", "partition_key",
                                                                                "version_id"))
    pins = PinnedInputs()
    upstreams = upstreams_of(job)
    needs_previous = job.depends_on_past
    if existing:
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
    Consumption.objects.bulk_create(records, ignore_conflicts=True)
    return pins


class LazyPins:
    """The run's pinned inputs, read only if a template asks for them (verification
    renders its checks against them, and most checks read only `this`)."""

    def __init__(self, run: Run, warehouse: Warehouse):
        self._load = lambda: pin_inputs(run, warehouse)
        self._pins: PinnedInputs | None = None

    def __getattr__(self, name: str):
        if self._pins is None:
            self._pins = self._load()
        return getattr(self._pins, name)


def source_watermark(warehouse: Warehouse, source: Dataset, run: Run) -> dict:
    """Row count, max ingested_at and the measure over the interval: a later rerun
    compares them to tell whether the source changed underneath."""
    db = warehouse.db
    columns = set(source.column_names)
    parts = ["COUNT(*)"]
    parts.append('MAX("ingested_at")' if "ingested_at" in columns else "NULL")
    parts.append(f'SUM("{source.core_measure}")' if source.core_measure else "NULL")
    row = db.query(
        f'SELECT {", ".join(parts)} FROM "{source.name}" WHERE "{source.time_column}" >= ? AND "{source.time_column}" < ?',
        (db.ts(run.data_interval_start), db.ts(run.data_interval_end)),
    )[0]
    measure = row[2]
    return {"row_count": int(row[0] or 0), "max_ingested_at": str(row[1]) if row[1] is not None else None,
            "measure": round(float(measure), 4) if measure is not None else None}


def source_sql(warehouse: Warehouse, source: Dataset, run: Run) -> str:
    db = warehouse.db
    return (f'(SELECT * FROM "{source.name}" WHERE "{source.time_column}" >= {db.ts_literal(run.data_interval_start)} '
            f'AND "{source.time_column}" < {db.ts_literal(run.data_interval_end)})')


def render(template: str, *, run: Run, warehouse: Warehouse, pins: PinnedInputs, this_sql: str | None = None) -> str:
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
            data_interval_start=warehouse.db.ts_literal(run.data_interval_start),
            data_interval_end=warehouse.db.ts_literal(run.data_interval_end),
            partition_key=_q(run.partition_key),
            ref=ref, ref_previous=ref_previous, this=this_sql or "",
        )
    except jinja2.TemplateError as exc:
        raise ExecutionError(f"template does not render: {exc}") from None


@dataclass
class RunContext:
    """What a python job receives."""

    run_id: str
    partition_key: str
    data_interval_start: datetime
    data_interval_end: datetime
    params: dict
    read: Callable[[str], list[dict]]


def _resolve(dotted: str) -> Callable:
    module, _, attr = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ExecutionError(f"cannot import {dotted}: {exc}") from None


def execute(run: Run, attempt_no: int, warehouse: Warehouse, *, should_stop: Callable[[], bool] = lambda: False) -> Marker:
    """Stage the run's version; the marker commits with the rows."""
    job = run.job
    spec = spec_for(job.dataset)  # staging ensures its tables, once per process and spec
    pins = pin_inputs(run, warehouse)
    definition = run.code_version.definition
    kind = definition.get("kind", job.kind)
    if kind == JobKind.SQL:
        sql = render(definition["sql"], run=run, warehouse=warehouse, pins=pins)
        run.output_columns = warehouse.db.columns_of(sql)
        type(run).objects.filter(pk=run.pk).update(output_columns=run.output_columns)
        return warehouse.stage_select(spec=spec, run_id=run.run_id, attempt_no=attempt_no,
                                      partition=run.partition_key, select_sql=sql, take_over=True)
    if kind == JobKind.PYTHON:
        rows = _python_rows(run, warehouse, pins, definition, should_stop)
        return warehouse.stage_rows(spec=spec, run_id=run.run_id, attempt_no=attempt_no,
                                    partition=run.partition_key, rows=rows, take_over=True)
    if kind == JobKind.SIDE_EFFECT:
        row = deliver_side_effect(run, warehouse, pins, definition)
        return warehouse.stage_rows(spec=spec, run_id=run.run_id, attempt_no=attempt_no,
                                    partition=run.partition_key, rows=[row], take_over=True)
    raise ExecutionError(f"unknown job kind {kind!r}")


def _reader(warehouse: Warehouse, pins: PinnedInputs, run: Run) -> Callable[[str], list[dict]]:
    datasets = {d.name: d for d in run.job.upstreams.all()}

    def read(name: str) -> list[dict]:
        dataset = datasets.get(name)
        if dataset is None:
            raise ExecutionError(f"{run.job.name} does not declare {name} upstream")
        sql = source_sql(warehouse, dataset, run) if dataset.is_source else warehouse.ref_sql(
            spec=spec_for(dataset), pins=pins.versions.get(name, {}))
        return warehouse.db.query_dicts(f"SELECT * FROM {sql} AS q")

    return read


def _python_rows(run, warehouse, pins, definition, should_stop):
    fn = _resolve(definition["callable"])
    spec_columns = [c["name"] for c in run.job.dataset.columns]
    context = RunContext(run_id=run.run_id, partition_key=run.partition_key,
                         data_interval_start=run.data_interval_start, data_interval_end=run.data_interval_end,
                         params=definition.get("params", {}), read=_reader(warehouse, pins, run))
    seen: set[str] = set()
    for i, row in enumerate(fn(context)):
        if i % 1000 == 0 and should_stop():
            raise ExecutionError("stopped: the attempt was fenced or the run cancelled")
        if isinstance(row, dict):
            seen.update(row)
            yield tuple(row.get(c) for c in spec_columns)
        else:
            yield tuple(row)
    run.output_columns = sorted(seen) if seen else spec_columns
    type(run).objects.filter(pk=run.pk).update(output_columns=run.output_columns)


def deliver_side_effect(run: Run, warehouse: Warehouse, pins: PinnedInputs, definition: dict) -> tuple:
    """Deliver once per (job, partition, upstream version). The unique key on the
    outbox row makes a second delivery impossible, from any request or attempt."""
    effect = definition.get("side_effect", {})
    upstream_versions = sorted(f"{name}@{rid}" for name, parts in pins.versions.items() for rid in parts.values())
    if not upstream_versions:
        raise ExecutionError("nothing published upstream to notify about")
    key = f"{run.job.name}:{run.partition_key}:{'+'.join(upstream_versions)}"
    read = _reader(warehouse, pins, run)
    summary: dict[str, Any] = {}
    for name in pins.versions:
        dataset = run.job.upstreams.get(name=name)
        rows = read(name)
        summary[name] = {"rows": len(rows)}
        if dataset.core_measure:
            summary[name][dataset.core_measure] = round(sum(float(r[dataset.core_measure] or 0) for r in rows), 2)
    message = f"{effect.get('subject') or run.job.name} {run.partition_key}: " + ", ".join(
        f"{n} {', '.join(f'{k}={v}' for k, v in s.items())}" for n, s in sorted(summary.items()))
    try:
        with transaction.atomic():
            Delivery.objects.create(job=run.job, run=run, partition_key=run.partition_key, idempotency_key=key,
                                    channel=effect.get("channel", "outbox"), delivered_at=timezone.now(),
                                    payload={"message": message, "summary": summary,
                                             "recipients": effect.get("recipients", [])})
    except IntegrityError:
        pass  # delivered already (another attempt or request): the constraint stopped the second one
    values = {"ds": run.partition_key, "partition": run.partition_key, "channel": effect.get("channel", "outbox"),
              "message": message, "idempotency_key": key}
    return tuple(values.get(c["name"]) for c in run.job.dataset.columns)
