"""The demo's live feed: the scheduler's production runs of the latest closed day and
hour read real source events and publish, instead of failing on an empty interval
(today's date is years after the demo's 2022 data)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from backfill_portal.catalog.models import Dataset
from backfill_portal.catalog.services.sync import catalog_sync_file
from backfill_portal.catalog.specs import spec_for
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.schedule import schedule_production
from backfill_portal.web.demo.sources import demo_sources_loaded, feed_demo_sources
from backfill_portal.web.management.commands.load_demo import DEMO_CATALOG, ensure_demo_users

pytestmark = pytest.mark.django_db(transaction=True)
NOW = datetime(2026, 11, 30, 17, 45, tzinfo=timezone.utc)


def test_scheduled_production_runs_publish_on_the_fed_demo(warehouse, task_queue):
    ensure_demo_users()
    catalog_sync_file(path=DEMO_CATALOG, actor=None, reason="test: the demo catalog")
    for dataset in Dataset.objects.filter(is_source=False):
        warehouse.ensure_dataset(spec_for(dataset))
    assert not demo_sources_loaded(warehouse)
    fed = feed_demo_sources(warehouse, now=NOW, orders_per_day=60, page_views_per_hour=8)
    assert all(fed.values()) and demo_sources_loaded(warehouse)
    assert not any(feed_demo_sources(warehouse, now=NOW, orders_per_day=60, page_views_per_hour=8).values())

    only = schedule_production(now=NOW, jobs=["dwd_order_items"])  # one job's schedule, as the story replays it
    assert [r.job.name for r in Run.objects.filter(run_id__in=only)] == ["dwd_order_items"]
    created = only + schedule_production(now=NOW)
    task_queue.drain()
    runs = {r.job.name: r for r in Run.objects.filter(run_id__in=created).select_related("job")}
    assert set(runs) == {"dwd_order_items", "dwd_page_views_hourly"}
    # Shanghai's latest closed business day at 17:45 UTC on the 30th is the 30th (01:45 on the 1st there).
    assert runs["dwd_order_items"].partition_key == "2026-11-30"
    for run in runs.values():
        assert (run.run_type, run.status, run.error) == (RunType.SCHEDULED, RunStatus.PUBLISHED, "")
        assert run.version.row_count > 0
