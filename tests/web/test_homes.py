"""Role homes: on-call sees what is broken now (failed runs nothing repaired, scheduled
ones too; stuck runs; partitions built from rolled-back inputs; requests waiting in
reconciliation), owners their inbox and their datasets' health, requesters their
requests; the auditor is never offered the request form, nor a link to it."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as tz

import pytest
from django.urls import reverse
from django.utils import timezone

from backfill_portal.catalog.models import Job
from backfill_portal.execution.anomalies import Anomaly
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.schedule import schedule_production
from backfill_portal.recovery.rollback import partition_rollback
from backfill_portal.web.pages import home


def section(html: str, heading_id: str) -> str:
    start = html.index(f'id="{heading_id}"')
    end = html.find("<h2", start + 1)
    return html[start:end if end > 0 else None]


@pytest.mark.django_db(transaction=True)
def test_oncall_owner_and_requester_homes_show_what_each_must_act_on(web, personas, pipeline, incident):
    good, bad, dws = incident
    # 1. A scheduled production run for a day the sources do not have fails ("no rows").
    Job.objects.filter(name="dwd_order_items").update(scheduled=True)
    [failed_id] = schedule_production(now=datetime(2030, 1, 2, 2, 0, tzinfo=tz.utc))
    pipeline.drain()
    failed = Run.objects.get(run_id=failed_id)
    assert (failed.status, failed.run_type) == (RunStatus.VERIFICATION_FAILED, RunType.SCHEDULED)
    # 2. A run whose message was lost an hour ago: queued, nothing moved it since.
    Job.objects.filter(name="dws_sales_daily").update(scheduled=True)
    [stuck_id] = schedule_production(now=datetime(2030, 1, 2, 2, 0, tzinfo=tz.utc))
    hour_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(run_id=stuck_id).update(created_at=hour_ago, enqueued_at=hour_ago)
    # 3. The doubled dwd partition rolled back: dws 2022-10-01, built from it, is contaminated.
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="doubled by the 02:00 deploy")

    html = web("oscar").get(reverse("home")).content.decode()
    failures = section(html, "failing-h")
    assert f'href="/runs/{failed_id}/"' in failures and "scheduled" in failures and "2030-01-01" in failures
    assert "no rows" in failures
    stuck = html[html.index('id="stuck-h"'):html.index('id="contaminated-h"')]
    assert f'href="/runs/{stuck_id}/"' in stuck and "dws_sales_daily" in stuck and "ago)" in stuck
    contaminated = html[html.index('id="contaminated-h"'):html.index('id="reconciling-h"')]
    assert "dws_sales_daily / 2022-10-01" in contaminated and "dwd_order_items / 2022-10-01" in contaminated
    reconciling = html[html.index('id="reconciling-h"'):html.index('id="running-h"')]
    assert f'href="/requests/{bad.pk}/"' in reconciling

    # The owner of dwd_order_items: her dataset is failing (the scheduled run), with the run linked.
    olivia = web("olivia").get(reverse("home")).content.decode()
    assert 'id="failing-h"' not in olivia  # the on-call panel is on-call's
    health = section(olivia, "health-h")
    row = health[health.index('href="/datasets/dwd_order_items/"'):]
    row = row[:row.index("</tr>")]
    assert "pill-health-failing" in row and f'href="/runs/{failed_id}/"' in row
    assert 'id="mine-h"' in olivia and 'id="waiting-h"' in olivia
    # The owner of dws_sales_daily: a partition readers see is built from a rolled-back input.
    sam = section(web("sam").get(reverse("home")).content.decode(), "health-h")
    row = sam[sam.index('href="/datasets/dws_sales_daily/"'):]
    assert "pill-health-contaminated" in row[:row.index("</tr>")]

    alice = web("alice").get(reverse("home")).content.decode()
    assert 'id="failing-h"' not in alice and 'id="health-h"' not in alice
    assert f'href="/requests/{good.pk}/"' in section(alice, "mine-h")


def test_the_auditor_is_never_offered_the_request_form(web, catalog):
    client = web("audrey")
    home = client.get(reverse("home")).content.decode()
    assert reverse("request-new") not in home and "You read everything and change nothing" in home
    assert reverse("request-new") not in client.get(reverse("request-list")).content.decode()
    assert "Backfill this job" not in client.get(reverse("catalog-job", args=["dwd_order_items"])).content.decode()
    response = client.get(reverse("request-new"))
    assert response.status_code == 403
    assert "Filing a backfill request needs the requester, owner, on-call or admin role" in response.content.decode()
    assert "recorded in the audit log" not in response.content.decode()  # opening the page is not recorded
    response = client.post(reverse("request-new"), {"job": "dwd_order_items"})
    assert response.status_code == 403 and "This refusal is recorded in the audit log" in response.content.decode()
    # Everyone who may file still sees it.
    assert reverse("request-new") in web("alice").get(reverse("home")).content.decode()


def test_an_anomaly_offers_the_corrective_backfill_only_to_who_may_file_it(web, catalog, monkeypatch):
    anomaly = Anomaly(dataset="dwd_order_items", job="dwd_order_items", owner="olivia", partition_key="2022-10-05",
                      rows=200, baseline=100.0, run_id="r-doubled", run_pk=1, request_id=None)
    monkeypatch.setattr(home, "partition_anomalies", lambda: [anomaly])
    corrective = f'{reverse("request-new")}?job=dwd_order_items&amp;start=2022-10-05&amp;end=2022-10-05'
    auditor = section(web("audrey").get(reverse("home")).content.decode(), "anomalies-h")
    assert "dwd_order_items 2022-10-05" in auditor and "2.0x baseline" in auditor  # she still sees it
    assert corrective not in auditor and "File the corrective backfill" not in auditor
    for name in ("alice", "oscar"):
        assert corrective in section(web(name).get(reverse("home")).content.decode(), "anomalies-h")


@pytest.mark.django_db(transaction=True)
def test_a_rebuild_that_skips_the_contaminated_job_is_shown_as_not_rebuilding_it(web, personas, incident,
                                                                                  make_request):
    from backfill_portal.backfills.models import BackfillRequest
    from backfill_portal.recovery.rollback import partition_rollback_rebuild
    from backfill_portal.warehouse.models import Contamination

    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key="2022-10-01",
                       reason="doubled by the 02:00 deploy")
    [rebuild] = partition_rollback_rebuild(actor=personas["oscar"], dataset="dwd_order_items",
                                           partition_key="2022-10-01")
    panel = section(web("oscar").get(reverse("home")).content.decode(), "contaminated-h")
    assert f'<a href="/requests/{rebuild.pk}/">#{rebuild.pk}</a>' in panel and "skips" not in panel

    # A cascade over the rolled-back day that leaves dws_sales_daily out (node action skip)
    # is the rebuild on record: it will never clear the mark.
    skipping = make_request("pending", job="dwd_order_items", cascade="cascade", start="2022-10-01",
                            end="2022-10-01")
    BackfillRequest.objects.filter(pk=skipping.pk).update(
        node_actions={**skipping.node_actions, "dws_sales_daily": "skip"})
    Contamination.objects.filter(dataset__name="dws_sales_daily").update(rebuild=skipping)
    panel = section(web("oscar").get(reverse("home")).content.decode(), "contaminated-h")
    assert f'not rebuilt: <a href="/requests/{skipping.pk}/">#{skipping.pk}</a> skips it' in panel
    partition = web("oscar").get(reverse("partition", args=["dws_sales_daily", "2022-10-01"])).content.decode()
    assert f"not being rebuilt (#{skipping.pk} skips dws_sales_daily)" in partition
    assert f"request #{skipping.pk}</a>, filed to rebuild it, skips dws_sales_daily" in partition
