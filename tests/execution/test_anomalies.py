"""The home's anomalies (execution/anomalies.py): a published partition far from the
baseline it was staged against. Through the real pipeline on the demo catalog: four
days published as they should be, then the demo's append-style variant republishes
one of them with every row doubled; the anomaly names it at 2x its baseline, a
corrective publish clears it, a rollback of the correction brings it back. The stored
baselines are what the migration's fill computes from the published partitions."""
from __future__ import annotations

from importlib import import_module

import pytest
from django.apps import apps as django_apps
from django.db import connection

from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.execution.anomalies import baseline_of, partition_anomalies
from backfill_portal.execution.models import Run
from backfill_portal.recovery.rollback import partition_rollback
from backfill_portal.warehouse.models import Version
from backfill_portal.web.demo.story import DEMO_CATALOG, append_style_catalog
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)

JOB, DAY = "dwd_order_items", "2022-10-05"
fill = import_module("backfill_portal.warehouse.migrations.0004_version_baseline").fill


def test_baseline_needs_three_partitions_and_rows():
    assert baseline_of(10, []) == (None, None)
    assert baseline_of(10, [4, 6]) == (5.0, None)  # a baseline, too few partitions to judge
    assert baseline_of(10, [4, 5, 6]) == (5.0, 2.0)
    assert baseline_of(10, [0, 0, 0]) == (0.0, None)


def publish(personas, queue, start: str, end: str) -> None:
    approved_request(personas, job=JOB, start=start, end=end)
    queue.drain()


def test_a_doubled_partition_is_an_anomaly_until_corrected_and_again_after_the_correction_is_rolled_back(
        personas, catalog, demo_sources, task_queue, warehouse):
    publish(personas, task_queue, "2022-10-01", DAY)
    assert partition_anomalies() == []
    normal = Version.objects.get(dataset__name=JOB, partition_key=DAY, run__status="published")
    assert normal.row_ratio == pytest.approx(normal.row_count / normal.baseline_rows)

    text = DEMO_CATALOG.read_text(encoding="utf-8")
    catalog_sync(text=append_style_catalog(text), actor=personas["olivia"], reason="append-style load")
    publish(personas, task_queue, DAY, DAY)
    (anomaly,) = partition_anomalies()
    doubled = Version.objects.get(dataset__name=JOB, partition_key=DAY, run__status="published")
    assert (anomaly.dataset, anomaly.partition_key, anomaly.rows) == (JOB, DAY, doubled.row_count)
    assert doubled.row_count == 2 * normal.row_count
    assert anomaly.baseline == doubled.baseline_rows and anomaly.ratio > 1.5
    assert anomaly.run_id == Run.objects.get(pk=doubled.run_id).run_id
    assert partition_anomalies(datasets=["dwd_page_views_hourly"]) == []

    # The home's fill, from the published partitions alone, gives the stored baselines.
    stored = dict(Version.objects.values_list("pk", "row_ratio"))
    Version.objects.update(baseline_rows=None, row_ratio=None)
    fill(django_apps, connection.schema_editor())
    assert dict(Version.objects.filter(run__status="published").values_list("pk", "row_ratio")) == {
        pk: ratio for pk, ratio in stored.items() if pk in set(
            Version.objects.filter(run__status="published").values_list("pk", flat=True))}

    catalog_sync(text=text, actor=personas["olivia"], reason="revert")
    publish(personas, task_queue, DAY, DAY)
    assert partition_anomalies() == []
    partition_rollback(actor=personas["oscar"], dataset=JOB, partition_key=DAY, reason="checking the fix")
    assert [a.partition_key for a in partition_anomalies()] == [DAY]
