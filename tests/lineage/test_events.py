"""OpenLineage out: what each run tells a real HTTP receiver, validated against the spec.

A cascade (dwd_order_items -> dws_sales_daily -> monthly_summary) runs through the real
task functions; its events arrive at an HTTP server this test starts on a loopback port.
"""
from __future__ import annotations

import json
import uuid

import pytest

from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.lineage_out.events import RUN_ID_NAMESPACE, request_uuid, run_uuid
from backfill_portal.execution.models import CheckResult, LineageEvent, Run, TaskOutbox
from backfill_portal.recovery.rollback import partition_rollback
from backfill_portal.warehouse.models import Consumption, Version
from tests.conftest import TEST_CATALOG

pytestmark = pytest.mark.django_db(transaction=True)

DAYS = dict(start="2022-10-01", end="2022-10-03")


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse):
    return task_queue


def file_and_approve(personas, *, job="dwd_order_items", cascade="none", **kwargs):
    request, _ = backfill_request_create(actor=personas["alice"], job=job, reason="bug 4711 fixed", cascade=cascade,
                                         **{**DAYS, **kwargs})
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    for approver in ("olivia", "sam", "rita"):
        request.refresh_from_db()
        if request.status == "pending_approval" and request.approval_steps.filter(
                status="pending", approver=personas[approver]).exists():
            backfill_request_decide(actor=personas[approver], request_id=request.pk, approve=True)
    request.refresh_from_db()
    return request


def by_run(events: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for event in events:
        out.setdefault(event["run"]["runId"], []).append(event)
    return out


def output_of(event: dict) -> dict:
    (output,) = event["outputs"]
    return output


def assert_inputs_are_the_pins(run: Run, event: dict) -> None:
    """The event's inputs are exactly the versions the run pinned (its consumption
    records): per dataset, the version facet and the portal's read facet."""
    pinned: dict[str, dict[str, str | None]] = {}
    for c in Consumption.objects.filter(run=run).select_related("dataset", "version__run"):
        pinned.setdefault(c.dataset.name, {})[c.partition_key] = c.version.run.run_id if c.version_id else None
    told = {i["name"].split(".")[-1]: i for i in event["inputs"]}
    assert set(told) == set(pinned)
    for name, read in pinned.items():
        facet = told[name]["inputFacets"]["backfillPortal_read"]
        assert facet["partitions"] == {k: v for k, v in read.items() if v}
        assert facet.get("unpublished", []) == sorted(k for k, v in read.items() if not v)
        versions = [v for v in read.values() if v]
        if versions:  # a produced upstream: its version facet names what was read
            assert told[name]["facets"]["version"]["datasetVersion"] == (
                versions[0] if len(read) == 1 else ",".join(f"{k}={v}" for k, v in sorted(read.items()) if v))
        else:
            assert "version" not in told[name]["facets"]


def test_lineage_is_off_by_default_and_writes_nothing(personas, ready, settings):
    assert settings.OPENLINEAGE_URL == settings.OPENLINEAGE_FILE == ""
    file_and_approve(personas)
    ready.drain()
    assert Run.objects.filter(status=RunStatus.PUBLISHED).count() == 3
    assert not LineageEvent.objects.exists()
    assert not TaskOutbox.objects.filter(task="execution.send_lineage_events").exists()


def test_a_cascade_tells_the_receiver_start_and_complete_of_every_run_as_the_spec_says(
        personas, ready, receiver, openlineage_spec, settings):
    request = file_and_approve(personas, cascade="cascade")
    ready.drain()
    runs = list(Run.objects.filter(request=request).select_related("job__dataset"))
    assert {r.job.name for r in runs} == {"dwd_order_items", "dws_sales_daily", "monthly_summary"}
    assert {r.status for r in runs} == {RunStatus.PUBLISHED}

    for event in receiver.events:
        openlineage_spec.validate(event)
    events = by_run(receiver.events)
    assert set(events) == {run_uuid(r.run_id) for r in runs}  # one OpenLineage run per portal run, no other
    for run in runs:
        mine = events[run_uuid(run.run_id)]
        assert [e["eventType"] for e in mine] == ["START", "COMPLETE"]
        assert str(uuid.uuid5(RUN_ID_NAMESPACE, run.run_id)) == mine[0]["run"]["runId"]
        start, complete = mine
        assert start["eventTime"] < complete["eventTime"]
        assert complete["job"] == {**complete["job"], "namespace": settings.OPENLINEAGE_NAMESPACE, "name": run.job.name}
        facets = complete["run"]["facets"]
        assert facets["parent"]["run"]["runId"] == request_uuid(request.pk)
        assert facets["parent"]["job"]["name"] == f"backfill-request-{request.pk}"
        assert facets["backfillPortal_run"]["runId"] == run.run_id
        assert facets["backfillPortal_run"]["partition"] == run.partition_key
        assert facets["nominalTime"]["nominalStartTime"].startswith(run.data_interval_start.strftime("%Y-%m-%dT%H"))

        assert_inputs_are_the_pins(run, complete)
        if run.job.name == "dwd_order_items":  # a source: its watermark at the pin, no version
            source = {i["name"].split(".")[-1]: i for i in complete["inputs"]}["ods_order_events"]
            assert source["inputFacets"]["backfillPortal_read"]["watermark"]["row_count"] > 0

        # Output: the version written, its numbers, its checks, its publication.
        output = output_of(complete)
        version = Version.objects.get(run=run)
        assert output["name"].split(".")[-1] == run.job.dataset.name
        assert output["facets"]["version"]["datasetVersion"] == run.run_id
        assert output["facets"]["dataQualityMetrics"]["rowCount"] == version.row_count
        assert output["outputFacets"]["outputStatistics"]["rowCount"] == version.row_count
        checks = {c.name: c.passed for c in CheckResult.objects.filter(run=run)}
        assert {a["assertion"]: a["success"] for a in output["facets"]["dataQualityAssertions"]["assertions"]} == checks
        publication = output["outputFacets"]["backfillPortal_publication"]
        assert publication == {**publication, "action": "publish", "version": run.run_id, "state": "published",
                               "partition": run.partition_key}
        assert "version" not in output_of(start)["facets"]  # nothing written yet at START
    # monthly_summary's October reads several dws_sales_daily partitions, each at its version.
    october = next(r for r in runs if r.job.name == "monthly_summary" and r.partition_key == "2022-10")
    complete = events[run_uuid(october.run_id)][-1]
    read = {i["name"].split(".")[-1]: i for i in complete["inputs"]}["dws_sales_daily"]
    assert len(read["inputFacets"]["backfillPortal_read"]["partitions"]) == 3  # the three days it rebuilt
    # The one-column key of dws_sales_daily is not one column: its metrics give the measure.
    dws = next(r for r in runs if r.job.name == "dws_sales_daily")
    metrics = output_of(events[run_uuid(dws.run_id)][-1])["facets"]["dataQualityMetrics"]
    assert metrics["columnMetrics"]["gmv"]["sum"] > 0
    assert LineageEvent.objects.filter(sent_at__isnull=True).count() == 0


def test_a_failed_verification_is_a_fail_with_its_failed_assertion(personas, ready, receiver, openlineage_spec):
    good_start = TEST_CATALOG.index("SELECT order_id, item_id, category, amount FROM (")
    good_end = TEST_CATALOG.index(") AS latest WHERE rn = 1\n") + len(") AS latest WHERE rn = 1\n")
    appending = ("SELECT order_id, item_id, category, amount FROM {{ ref('ods_order_events') }} AS e "
                 "WHERE item_id IS NOT NULL\n")
    catalog_sync(text=TEST_CATALOG[:good_start] + appending + TEST_CATALOG[good_end:])
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    run = Run.objects.get()
    assert run.status == RunStatus.VERIFICATION_FAILED
    events = receiver.of_run(run_uuid(run.run_id))
    assert [e["eventType"] for e in events] == ["START", "FAIL"]
    for event in events:
        openlineage_spec.validate(event)
    fail = events[-1]
    assert "unique_business_key" in fail["run"]["facets"]["errorMessage"]["message"]
    output = output_of(fail)
    assert output["facets"]["version"]["datasetVersion"] == run.run_id  # written, never published
    assertions = {a["assertion"]: a for a in output["facets"]["dataQualityAssertions"]["assertions"]}
    assert assertions["unique_business_key"]["success"] is False
    assert assertions["unique_business_key"]["severity"] == "error"
    assert "backfillPortal_publication" not in output["outputFacets"]


def test_cancelled_runs_are_aborted(personas, ready, receiver, openlineage_spec):
    request = file_and_approve(personas)
    ready.drain(limit=1)  # dispatch only: the runs are queued
    backfill_request_cancel(actor=personas["oscar"], request_id=request.pk, reason="wrong range")
    ready.drain()
    runs = list(Run.objects.filter(request=request))
    assert {r.status for r in runs} == {RunStatus.CANCELLED}
    for run in runs:
        events = receiver.of_run(run_uuid(run.run_id))
        assert [e["eventType"] for e in events] == ["ABORT"]
        openlineage_spec.validate(events[0])
        assert events[0]["run"]["facets"]["backfillPortal_run"]["reason"] == "request cancelled: wrong range"


def test_a_rollback_is_told_on_both_runs_with_the_pointer_it_moved(personas, ready, receiver, openlineage_spec):
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    file_and_approve(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    first, second = Run.objects.order_by("id")
    assert receiver.of_run(run_uuid(second.run_id))[-1]["outputs"][0]["outputFacets"][
        "backfillPortal_publication"]["previousVersion"] == first.run_id
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="doubled revenue")
    ready.drain()
    withdrawn = receiver.of_run(run_uuid(second.run_id))
    restored = receiver.of_run(run_uuid(first.run_id))
    assert [e["eventType"] for e in withdrawn] == ["START", "COMPLETE", "OTHER"]
    assert [e["eventType"] for e in restored] == ["START", "COMPLETE", "OTHER"]
    for event in (*withdrawn, *restored):
        openlineage_spec.validate(event)
    out = output_of(withdrawn[-1])["outputFacets"]["backfillPortal_publication"]
    assert out == {**out, "action": "rollback", "state": "rolled_back", "version": first.run_id,
                   "previousVersion": second.run_id, "actor": "oscar", "reason": "doubled revenue"}
    back = output_of(restored[-1])["outputFacets"]["backfillPortal_publication"]
    assert back == {**back, "action": "rollback", "state": "published", "version": first.run_id,
                    "previousVersion": second.run_id}
    assert output_of(restored[-1])["facets"]["version"]["datasetVersion"] == first.run_id


def test_the_file_transport_appends_one_event_a_line(personas, ready, settings, tmp_path, openlineage_spec):
    settings.OPENLINEAGE_FILE = str(tmp_path / "lineage.jsonl")
    file_and_approve(personas, start="2022-10-01", end="2022-10-02")
    ready.drain()
    lines = (tmp_path / "lineage.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert sorted(e["eventType"] for e in events) == ["COMPLETE", "COMPLETE", "START", "START"]
    for event in events:
        openlineage_spec.validate(event)
    assert events == [e.payload for e in LineageEvent.objects.order_by("id")]


@pytest.mark.parametrize("url, expected", [
    ("postgresql://u@db.example:5433/wh", ("postgres://db.example:5433", "wh.public.orders")),
    ("iceberg+postgresql://u@db/catalog?warehouse=s3://lake/portal&s3.region=eu-west-1",
     ("s3://lake", "portal/backfill/orders")),
    ("iceberg+sqlite:////srv/cat.db?warehouse=/srv/iceberg&namespace=dw", ("file", "/srv/iceberg/dw/orders")),
    ("iceberg+sqlite:////srv/cat.db", ("file", "/srv/iceberg-warehouse/backfill/orders")),
])
def test_datasets_are_named_where_their_rows_are_as_openlineage_names_them(settings, url, expected):
    from backfill_portal.execution.lineage_out.events import dataset_identity

    settings.WAREHOUSE_URL = url
    settings.OPENLINEAGE_DATASET_NAMESPACE = ""
    assert dataset_identity("orders") == expected
