"""Pages cost a fixed number of queries, however many rows they show."""
from __future__ import annotations

from datetime import date, timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from backfill_portal.execution.services.dispatch import dispatch_request


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(ctx.captured_queries)


def days(n: int, offset: int = 0) -> tuple[str, str]:
    first = date(2020, 1, 1) + timedelta(days=offset)
    return first.isoformat(), (first + timedelta(days=n - 1)).isoformat()


def file_requests(make_request, n: int, *, offset: int):
    for i in range(n):
        start, end = days(1, offset + i)
        make_request("pending" if i % 2 else "draft", start=start, end=end, requester="sam" if i % 3 else "alice")


def test_the_api_request_list_costs_the_same_for_5_and_50_requests(web, make_request):
    """The scale QA: each row's side effects were a query of their own (503 queries for
    page_size=500)."""
    client = web("alice")
    file_requests(make_request, 5, offset=0)
    five = count_queries(client, "/api/requests/?page_size=100")
    file_requests(make_request, 45, offset=100)
    assert count_queries(client, "/api/requests/?page_size=100") == five


def test_request_list_costs_the_same_for_5_and_50_requests(web, make_request, django_assert_max_num_queries):
    client = web("alice")
    file_requests(make_request, 5, offset=0)
    five = count_queries(client, reverse("request-list"))
    file_requests(make_request, 45, offset=100)
    fifty = count_queries(client, reverse("request-list"))
    assert five == fifty
    html = client.get(reverse("request-list")).content.decode()
    assert html.count('<tr>\n  <td class="num"><a href="/requests/') == 50
    with django_assert_max_num_queries(five):
        client.get(reverse("request-list") + "?status=pending_approval&mine=1")


def test_request_detail_costs_the_same_for_31_and_500_intervals(web, make_request, django_assert_max_num_queries):
    client = web("olivia")
    small = make_request("running", start="2022-10-01", end="2022-10-31", max_active_intervals=4)
    start, end = days(500)
    large = make_request("running", start=start, end=end, max_active_intervals=16)
    dispatch_request(request_id=small.pk)
    dispatch_request(request_id=large.pk)
    assert large.interval_count == 500
    n_small = count_queries(client, reverse("request-detail", args=[small.pk]))
    n_large = count_queries(client, reverse("request-detail", args=[large.pk]))
    assert n_small == n_large
    with django_assert_max_num_queries(12):
        client.get(reverse("request-detail", args=[large.pk]))
    # The poll of every live section: each section's data (the rolled-back partitions of
    # what it published one of them), then the grid only if it changed.
    with django_assert_max_num_queries(11):
        first = client.get(reverse("request-live", args=[large.pk]))
    keys = first.content.decode().split('id="req-poll"')[1].split("v=")[1].split('"')[0]
    with django_assert_max_num_queries(9):
        assert client.get(reverse("request-live", args=[large.pk]), {"v": keys}).status_code == 204


def test_home_audit_and_catalog_do_not_grow_with_rows(web, make_request):
    client = web("olivia")
    file_requests(make_request, 3, offset=0)
    before = {name: count_queries(client, reverse(name)) for name in ("home", "audit", "catalog")}
    file_requests(make_request, 30, offset=100)
    after = {name: count_queries(client, reverse(name)) for name in ("home", "audit", "catalog")}
    assert before == after


# --- The pages of the dashboard's second part ------------------------------------------------

def _versions(make_request, n: int, *, offset: int, rollback_every: int = 0):
    """n published daily partitions of dwd_order_items, made directly (no warehouse rows:
    these tests count metadata queries), each replacing an older version."""
    from django.utils import timezone

    from backfill_portal.execution.models import Run
    from backfill_portal.warehouse.models import Publication, Version

    start, end = days(n, offset)
    req = make_request("running", start=start, end=end, max_active_intervals=1)
    now = timezone.now()
    for interval in req.intervals.select_related("job__dataset", "job__current_code_version"):
        job = interval.job
        versions = []
        for _ in range(2):
            run = Run.objects.create(job=job, run_type="backfill", request=req, interval=interval,
                                     partition_key=interval.partition_key, data_interval_start=interval.start,
                                     data_interval_end=interval.end, code_version=job.current_code_version,
                                     status="published")
            versions.append(Version.objects.create(run=run, dataset=job.dataset, partition_key=interval.partition_key,
                                                   row_count=10, fingerprint="f" * 64, committed_attempt=1,
                                                   committed_at=now))
        Publication.objects.create(dataset=job.dataset, partition_key=interval.partition_key, version=versions[0],
                                   request=req, published_at=now)
        Publication.objects.create(dataset=job.dataset, partition_key=interval.partition_key, version=versions[1],
                                   previous_version=versions[0], request=req, published_at=now)
        if rollback_every and interval.position % rollback_every == 0:
            Publication.objects.create(dataset=job.dataset, partition_key=interval.partition_key,
                                       version=versions[0], previous_version=versions[1], action="rollback",
                                       request=req, published_at=now, reason="test")
    return req


def test_approvals_inbox_costs_the_same_for_1_and_8_requests(web, make_request, django_assert_max_num_queries):
    client = web("olivia")
    make_request("pending", cascade="cascade", start="2020-01-01", end="2020-01-03")
    one = count_queries(client, "/approvals/")
    for i in range(7):
        start, end = days(1, 10 + i)
        make_request("pending", cascade="cascade" if i % 2 else "none", start=start, end=end)
    eight = count_queries(client, "/approvals/")
    assert one == eight
    assert client.get("/approvals/").content.decode().count('<svg class="lineage compact"') == 8
    with django_assert_max_num_queries(one):
        client.get("/approvals/")


def test_lineage_page_costs_a_fixed_number_of_queries(web, make_request, django_assert_max_num_queries):
    req = make_request("pending", cascade="cascade")
    client = web("alice")
    with django_assert_max_num_queries(12):
        client.get(reverse("lineage"))
    with django_assert_max_num_queries(12):
        client.get(reverse("lineage") + f"?request={req.pk}")


def test_dataset_partition_and_home_do_not_grow_with_history(web, make_request, warehouse):
    client = web("oscar")
    _versions(make_request, 3, offset=0, rollback_every=2)
    dataset = reverse("dataset", args=["dwd_order_items"])
    partition = reverse("partition", args=["dwd_order_items", "2020-01-02"])
    before = {url: count_queries(client, url) for url in (dataset, partition, reverse("home"))}
    _versions(make_request, 30, offset=100, rollback_every=2)
    after = {url: count_queries(client, url) for url in (dataset, partition, reverse("home"))}
    assert before == after
    assert client.get(dataset).content.decode().count('href="/datasets/dwd_order_items/partitions/') == 33
    assert client.get(reverse("home")).content.decode().split('id="rollbacks-h"')[1].count("<tr>") == 1 + 10


def test_outbox_costs_the_same_for_2_and_40_deliveries(web, make_request, django_assert_max_num_queries):
    from django.utils import timezone

    from backfill_portal.catalog.models import Job
    from backfill_portal.execution.models import Delivery, Run

    req = make_request("running")
    dispatch_request(request_id=req.pk)
    run = Run.objects.filter(request=req).first()
    notify = Job.objects.get(name="notify_finance")

    def deliver(n, offset):
        for i in range(n):
            Delivery.objects.create(job=notify, run=run, partition_key=f"2022-10-{i % 28 + 1:02d}",
                                    idempotency_key=f"notify:{offset + i}", channel="finance-email",
                                    payload={"message": f"GMV {i}"}, delivered_at=timezone.now())

    client = web("audrey")
    deliver(2, 0)
    two = count_queries(client, reverse("outbox"))
    deliver(38, 100)
    forty = count_queries(client, reverse("outbox"))
    assert two == forty
    html = client.get(reverse("outbox")).content.decode()
    assert html.count("<tr>") == 41 and "notify:137" in html
    assert html.index("notify:137") < html.index("notify:0")  # newest first
    with django_assert_max_num_queries(two):
        client.get(reverse("outbox") + "?job=notify_finance")


def test_reconciliation_page_costs_the_same_for_2_and_60_intervals(web, make_request,
                                                                   django_assert_max_num_queries):
    from django.utils import timezone

    from backfill_portal.backfills.models import Reconciliation, ReconciliationRow

    def reconciled(n, offset):
        start, end = days(n, offset)
        req = make_request("running", start=start, end=end)
        Reconciliation.objects.create(request=req, computed_at=timezone.now(), manifest={
            "intervals_planned": n, "exceptions": {"skipped": [], "failed": []}, "verdicts": {}})
        ReconciliationRow.objects.bulk_create([
            ReconciliationRow(request=req, interval=iv, job=iv.job, dataset=iv.job.dataset, position=iv.position,
                              partition_key=iv.partition_key, interval_status="published", rows_before=10,
                              rows_after=10 + iv.position % 3, rows_baseline=10.0, distinct_keys=10, null_keys=0,
                              deviations=["moved"] if iv.position % 3 else [],
                              verdict="unexplained" if iv.position % 3 else "matched", computed_at=timezone.now())
            for iv in req.intervals.select_related("job__dataset")])
        return req

    client = web("olivia")
    small, large = reconciled(2, 0), reconciled(60, 100)
    n_small = count_queries(client, reverse("reconciliation", args=[small.pk]))
    n_large = count_queries(client, reverse("reconciliation", args=[large.pk]))
    assert n_small == n_large
    html = client.get(reverse("reconciliation", args=[large.pk])).content.decode()
    assert html.count('<tr id="rec-row-') == 60 and html.count('class="chart-after"') == 60
    with django_assert_max_num_queries(n_small):
        client.get(reverse("reconciliation", args=[large.pk]) + "?verdict=unexplained")
