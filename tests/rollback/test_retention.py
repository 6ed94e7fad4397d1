"""Retention: old versions are purged, never one a reader or a rollback still needs."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from backfill_portal.catalog.specs import spec_for
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.models import Run
from backfill_portal.recovery.tasks import purge_versions
from backfill_portal.warehouse.models import Version
from backfill_portal.recovery.rollback import partition_rollback
from tests.conftest import ALSO_ON_ICEBERG
from tests.reconciliation.helpers import run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAY = "2022-10-01"


def stored_rows(warehouse, run) -> int:
    table = warehouse.version_table(spec_for(run.job.dataset), run.run_id)
    if not warehouse.table_exists(table):
        return 0
    return warehouse.query(f'SELECT COUNT(*) FROM "{table}" WHERE "_run_id" = ?', (run.run_id,))[0][0]


def test_retention_purges_old_versions_but_keeps_current_previous_verified_and_recently_rolled_back(
        personas, ready, warehouse, settings):
    settings.VERSION_RETENTION_DAYS = 30
    v1, v2, v3 = (Run.objects.get(request=run_request(personas, ready, start=DAY, end=DAY)) for _ in range(3))
    Version.objects.update(committed_at=timezone.now() - timedelta(days=40))

    assert purge_versions.apply().get()["purged"] == 1
    assert purge_versions.apply().get()["purged"] == 0  # twice: nothing more to do
    purged = Version.objects.get(run=v1)
    assert purged.purged_at is not None and stored_rows(warehouse, v1) == 0 and warehouse.marker(v1.run_id) is None
    event = AuditEvent.objects.get(action="version.purge")
    assert event.object_id == str(purged.pk) and event.data["run_id"] == v1.run_id
    for kept in (v2, v3):  # previous verified, current
        assert Version.objects.get(run=kept).purged_at is None and stored_rows(warehouse, kept) > 0

    # After a rollback to v2, the rolled-back v3 stays for diagnosis within the window...
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key=DAY, reason="bad v3")
    assert purge_versions.apply().get()["purged"] == 0
    assert stored_rows(warehouse, v3) > 0 and stored_rows(warehouse, v2) > 0
    # ...and goes once the window has passed since the rollback; the current never does.
    from backfill_portal.recovery.retention import versions_purge_expired

    later = versions_purge_expired(now=timezone.now() + timedelta(days=31))
    assert later["purged"] == 1
    assert Version.objects.get(run=v3).purged_at is not None
    assert warehouse.current("dwd_order_items", DAY) == v2.run_id and stored_rows(warehouse, v2) > 0
    assert len(warehouse.read_partition("dwd_order_items", DAY)) == Version.objects.get(run=v2).row_count


def test_a_purged_version_is_never_a_rollback_target(personas, ready, warehouse, api):
    v1, v2 = (Run.objects.get(request=run_request(personas, ready, start=DAY, end=DAY)) for _ in range(2))
    Version.objects.filter(run=v1).update(committed_at=timezone.now() - timedelta(days=400),
                                          purged_at=timezone.now())
    response = api("oscar").post(f"/api/datasets/dwd_order_items/partitions/{DAY}/rollback/", {"reason": "x"},
                                 format="json")
    assert response.status_code == 409 and "no previous verified version" in response.json()["detail"]
    assert warehouse.current("dwd_order_items", DAY) == v2.run_id


def test_retention_window_comes_from_the_environment(monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import backfill_portal.settings as portal_settings

    monkeypatch.setenv("VERSION_RETENTION_DAYS", "7")
    assert importlib.reload(portal_settings).VERSION_RETENTION_DAYS == 7
    monkeypatch.setenv("VERSION_RETENTION_DAYS", "0")
    with pytest.raises(ImproperlyConfigured):
        importlib.reload(portal_settings)
    monkeypatch.delenv("VERSION_RETENTION_DAYS")
    assert importlib.reload(portal_settings).VERSION_RETENTION_DAYS == 30
    assert portal_settings.CELERY_BEAT_SCHEDULE["purge-versions"]["task"] == "execution.purge_versions"


@ALSO_ON_ICEBERG
def test_retention_sweeps_what_a_dead_writer_left_and_nothing_a_reader_or_a_marker_needs(
        personas, ready, warehouse, warehouse_url):
    import pyarrow as pa

    published = Run.objects.get(request=run_request(personas, ready, start=DAY, end=DAY))
    spec = spec_for(published.job.dataset)
    before = warehouse.read_partition(spec.name, DAY)
    dead = []
    if hasattr(warehouse, "run_files"):  # a files layout: a writer killed before its marker left a file
        directory = warehouse.run_location(spec, DAY, "run-killed-writer")
        warehouse.storage.make_dir(directory)
        dead = [warehouse.storage.join(directory, "part-001-00000.parquet")]
        warehouse.storage.write_parquet(dead[0], pa.table({"order_id": ["o-1"]}))

    counts = purge_versions.apply().get()

    assert counts["orphan_files_deleted"] == len(dead)
    assert not any(warehouse.storage.exists(f) for f in dead)
    events = AuditEvent.objects.filter(action="warehouse.orphans_swept")
    assert [(e.dataset, e.data["files"]) for e in events] == ([(spec.name, 1)] if dead else [])
    assert warehouse.read_partition(spec.name, DAY) == before
    assert warehouse.marker(published.run_id) is not None
    assert purge_versions.apply().get()["orphan_files_deleted"] == 0
