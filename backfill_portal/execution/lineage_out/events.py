"""A run's OpenLineage event, built from what the metadata records (docs/openlineage.md).

Built with openlineage-python's classes (so their validators hold: a UUID run id, ISO
times) and turned into the JSON dict that is stored and sent. Identity:

* job: `OPENLINEAGE_NAMESPACE` / the portal job's name;
* run: a UUID derived from the portal's `run_id` (`run_uuid`), stable across attempts,
  processes and resends; the parent run facet names the request (`request_uuid`, job
  `backfill-request-<id>`);
* datasets: the warehouse's namespace (`postgres://host:port`, or the SQLite file) and
  `database.schema.table` / `table`, as the OpenLineage naming spec says.
"""
from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime, timezone as dt_timezone
from urllib.parse import urlsplit

import attr
from django.conf import settings
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.generated.base import InputDatasetFacet, OutputDatasetFacet, RunFacet
from openlineage.client.generated import (
    data_quality_assertions_dataset,
    data_quality_metrics_dataset,
    dataset_version_dataset,
    error_message_run,
    job_type_job,
    nominal_time_run,
    output_statistics_output_dataset,
    parent_run,
    processing_engine_run,
    schema_dataset,
)
from openlineage.client.serde import Serde

from backfill_portal.backends import get_warehouse, make_warehouse
from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.specs import spec_for
from backfill_portal.execution.choices import RunStatus as S
from backfill_portal.execution.models import CheckResult, Run as PortalRun
from backfill_portal.warehouse.models import Consumption, Version

PRODUCER = "https://github.com/backfill-portal/backfill-portal"
# Where the portal's own facets' JSON schemas live (docs/openlineage/ in the repository).
FACETS_SCHEMA_BASE = f"{PRODUCER}/raw/main/docs/openlineage/"
# UUIDv5 namespace of the portal's run ids: anyone can compute a run's OpenLineage id
# from its run_id (uuid5(RUN_ID_NAMESPACE, run_id)).
RUN_ID_NAMESPACE = uuid.UUID("6f1b3c52-6d2e-5a43-9a57-0c4f1d8a2b10")
REQUEST_JOB_PREFIX = "backfill-request-"
# The language a job kind's failure is in (errorMessage's programmingLanguage); the
# python and side-effect kinds, and any kind not named, run Python.
_LANGUAGE = {"sql": "SQL", "dbt": "SQL"}

logger = logging.getLogger(__name__)


def run_uuid(run_id: str) -> str:
    return str(uuid.uuid5(RUN_ID_NAMESPACE, run_id))


def request_uuid(request_id: int) -> str:
    return str(uuid.uuid5(RUN_ID_NAMESPACE, f"request:{settings.OPENLINEAGE_NAMESPACE}:{request_id}"))


def iso(moment: datetime) -> str:
    return moment.astimezone(dt_timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


# -- the portal's own facets (their schemas: docs/openlineage/*.json) -----------------------


def _portal_schema(name: str) -> str:
    return f"{FACETS_SCHEMA_BASE}{name}.json#/$defs/{name}"


@attr.define
class BackfillPortalRunFacet(RunFacet):
    """The portal's identity of the run: its run_id, type, partition, code version."""

    runId: str  # noqa: N815
    runType: str  # noqa: N815
    status: str
    partition: str
    codeVersion: str  # noqa: N815
    requestId: int | None = attr.field(default=None)  # noqa: N815
    attempt: int | None = attr.field(default=None)
    reason: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return _portal_schema("BackfillPortalRunFacet")


@attr.define
class BackfillPortalReadInputDatasetFacet(InputDatasetFacet):
    """Exactly what the run read of this input: per partition the version (run_id) it
    pinned; the partitions it covered where nothing was published; for a source, its
    watermark."""

    partitions: dict[str, str]
    unpublished: list[str] = attr.field(factory=list)
    watermark: dict | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return _portal_schema("BackfillPortalReadInputDatasetFacet")


@attr.define
class BackfillPortalPublicationOutputDatasetFacet(OutputDatasetFacet):
    """A move of the partition's current pointer: `publish` (this run's version became
    current, replacing `previousVersion`) or `rollback` (the pointer moved back from
    `previousVersion` to `version`). `state`: what this run's version is after it."""

    action: str
    partition: str
    version: str
    state: str
    previousVersion: str | None = attr.field(default=None)  # noqa: N815
    actor: str | None = attr.field(default=None)
    reason: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return _portal_schema("BackfillPortalPublicationOutputDatasetFacet")


# -- naming ---------------------------------------------------------------------------------


def dataset_identity(name: str) -> tuple[str, str]:
    """(namespace, name) of a warehouse table, per OpenLineage's naming spec: a
    PostgreSQL table by its server, database and schema; an Iceberg table by where its
    files are (`s3://<bucket>` and the key path, or `file` and the local path), as
    Spark's and Trino's integrations name Iceberg tables."""
    url = urlsplit(settings.WAREHOUSE_URL)
    scheme = url.scheme.split("+")[0]
    if scheme == "iceberg":  # the backend says where its tables are (its URL's defaults included)
        location = urlsplit(make_warehouse(settings.WAREHOUSE_URL).table_uri(name))
        if location.scheme == "file":
            namespace, qualified = "file", location.path
        else:
            namespace, qualified = f"{location.scheme}://{location.netloc}", location.path.lstrip("/")
    elif scheme in ("postgres", "postgresql"):
        namespace = f"postgres://{url.hostname or 'localhost'}:{url.port or 5432}"
        qualified = f"{url.path.lstrip('/') or 'postgres'}.public.{name}"
    elif scheme == "sqlite":
        namespace, qualified = f"sqlite://{url.path}", name
    else:
        namespace, qualified = f"{scheme}://{url.hostname or ''}", name
    return settings.OPENLINEAGE_DATASET_NAMESPACE or namespace, qualified


# -- the event --------------------------------------------------------------------------------


@attr.define
class Transition:
    """What `run_transition` just did: the edge, who and why, and what it recorded."""

    before: str
    to: str
    actor: object = None
    reason: str = ""
    data: dict = attr.field(factory=dict)


def run_event(run: PortalRun, *, event_type: str, transition: Transition, now: datetime) -> dict:
    """The event as the JSON dict that is stored and sent."""
    job = run.job
    dataset = job.dataset
    event = RunEvent(
        eventType=RunState[event_type], eventTime=iso(now), producer=PRODUCER,
        run=Run(runId=run_uuid(run.run_id), facets=_run_facets(run, event_type, transition)),
        job=Job(namespace=settings.OPENLINEAGE_NAMESPACE, name=job.name, facets={
            "jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration="BACKFILL_PORTAL",
                                                    jobType=str(job.kind).upper(), producer=PRODUCER)}),
        inputs=_inputs(run, event_type),
        outputs=[_output(run, dataset, event_type, transition)],
    )
    return Serde.to_dict(event)


def _run_facets(run: PortalRun, event_type: str, transition: Transition) -> dict:
    attempt = max((a.attempt_no for a in run.attempts.all()), default=None)
    facets: dict = {
        "nominalTime": nominal_time_run.NominalTimeRunFacet(
            nominalStartTime=iso(run.data_interval_start), nominalEndTime=iso(run.data_interval_end),
            producer=PRODUCER),
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version=_portal_version(), name="backfill-portal", openlineageAdapterVersion=_client_version(),
            producer=PRODUCER),
        "backfillPortal_run": BackfillPortalRunFacet(
            runId=run.run_id, runType=run.run_type, status=transition.to, partition=run.partition_key,
            codeVersion=run.code_version.hash, requestId=run.request_id, attempt=attempt,
            reason=transition.reason or None, producer=PRODUCER),
    }
    if run.request_id:
        facets["parent"] = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=request_uuid(run.request_id)),
            job=parent_run.Job(namespace=settings.OPENLINEAGE_NAMESPACE, name=f"{REQUEST_JOB_PREFIX}{run.request_id}"),
            producer=PRODUCER)
    if event_type == "FAIL":
        facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=(run.error or transition.reason or transition.to)[:4000],
            programmingLanguage=_LANGUAGE.get(str(run.job.kind), "PYTHON"), producer=PRODUCER)
    return facets


def _inputs(run: PortalRun, event_type: str) -> list[InputDataset]:
    """The pinned inputs with the exact versions read (Consumption); before they are
    pinned (a START), the declared upstreams."""
    pins: dict[int, dict[str, str | None]] = defaultdict(dict)
    watermarks: dict[int, dict] = {}
    for c in Consumption.objects.filter(run=run).select_related("version__run").order_by("dataset_id", "partition_key"):
        pins[c.dataset_id][c.partition_key] = c.version.run.run_id if c.version_id else None
        if c.watermark:
            watermarks[c.dataset_id] = c.watermark
    datasets = {d.pk: d for d in run.job.upstreams.all()}
    datasets.update(Dataset.objects.in_bulk(set(pins) - set(datasets)))
    inputs = []
    for pk in sorted(datasets, key=lambda k: datasets[k].name):
        upstream = datasets[pk]
        namespace, name = dataset_identity(upstream.name)
        facets, input_facets = {}, {}
        if pk in pins:
            read = pins[pk]
            versions = [v for v in read.values() if v]
            if versions:
                facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(
                    datasetVersion=versions[0] if len(read) == 1 else
                    ",".join(f"{key}={value}" for key, value in sorted(read.items()) if value),
                    producer=PRODUCER)
            input_facets["backfillPortal_read"] = BackfillPortalReadInputDatasetFacet(
                partitions={key: value for key, value in sorted(read.items()) if value},
                unpublished=sorted(key for key, value in read.items() if not value),
                watermark=watermarks.get(pk), producer=PRODUCER)
        inputs.append(InputDataset(namespace=namespace, name=name, facets=facets, inputFacets=input_facets))
    return inputs


def _output(run: PortalRun, dataset: Dataset, event_type: str, transition: Transition) -> OutputDataset:
    namespace, name = dataset_identity(dataset.name)
    facets: dict = {"schema": schema_dataset.SchemaDatasetFacet(
        fields=[schema_dataset.SchemaDatasetFacetFields(name=c["name"], type=c["type"]) for c in dataset.columns],
        producer=PRODUCER)}
    output_facets: dict = {}
    version = Version.objects.filter(run=run).first()
    if version is not None:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=run.run_id,
                                                                               producer=PRODUCER)
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=version.row_count, producer=PRODUCER)
        checks = list(CheckResult.objects.filter(run=run).order_by("id"))
        if checks:
            facets["dataQualityMetrics"] = _metrics(run, dataset, version)
            facets["dataQualityAssertions"] = data_quality_assertions_dataset.DataQualityAssertionsDatasetFacet(
                assertions=[data_quality_assertions_dataset.Assertion(
                    assertion=c.name, success=c.passed, severity="error" if c.blocking else "warn",
                    name=c.name, description=c.message or None) for c in checks],
                producer=PRODUCER)
    publication = _publication(run, transition)
    if publication is not None:
        output_facets["backfillPortal_publication"] = publication
    return OutputDataset(namespace=namespace, name=name, facets=facets, outputFacets=output_facets)


def _metrics(run: PortalRun, dataset: Dataset, version: Version):
    """The version's numbers as its commit marker holds them (taken with its rows, what
    verification compared): rows; for a one-column business key its NULLs and distinct
    values; the core measure's sum. Rows alone when the marker cannot be read."""
    columns = {}
    try:
        marker = get_warehouse().marker(run.run_id)
        numbers = marker.numbers_for(spec_for(dataset)) if marker is not None else None
    except Exception as exc:  # the warehouse is unreachable: the event still goes, with less
        logger.warning("lineage: the numbers of %s could not be read (%s); rows only", run.run_id, exc)
        numbers = None
    if numbers is not None:
        key = dataset.business_key or []
        if len(key) == 1:
            columns[key[0]] = data_quality_metrics_dataset.ColumnMetrics(
                nullCount=numbers.null_keys, distinctCount=numbers.distinct_keys)
        if dataset.core_measure and numbers.measure_sum is not None:
            columns[dataset.core_measure] = data_quality_metrics_dataset.ColumnMetrics(sum=float(numbers.measure_sum))
    return data_quality_metrics_dataset.DataQualityMetricsDatasetFacet(
        rowCount=version.row_count, columnMetrics=columns, producer=PRODUCER)


def _publication(run: PortalRun, transition: Transition):
    actor = getattr(transition.actor, "username", None)
    if transition.to == S.PUBLISHED and transition.before == S.VERIFIED:
        return BackfillPortalPublicationOutputDatasetFacet(
            action="publish", partition=run.partition_key, version=run.run_id, state="published",
            previousVersion=run.expected_previous_run_id or None, actor=actor, producer=PRODUCER)
    if transition.to == S.PUBLISHED:  # restored by a rollback
        return BackfillPortalPublicationOutputDatasetFacet(
            action="rollback", partition=run.partition_key, version=run.run_id, state="published",
            previousVersion=transition.data.get("rolled_back"), actor=actor, reason=transition.reason or None,
            producer=PRODUCER)
    if transition.to == S.ROLLED_BACK:
        return BackfillPortalPublicationOutputDatasetFacet(
            action="rollback", partition=run.partition_key, version=transition.data.get("restored") or "",
            state="rolled_back", previousVersion=run.run_id, actor=actor, reason=transition.reason or None,
            producer=PRODUCER)
    return None


def _portal_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("backfill-portal")
    except PackageNotFoundError:
        return "0"


def _client_version() -> str:
    from importlib.metadata import version

    return version("openlineage-python")
