"""The example dbt project synced and backfilled end to end on PostgreSQL: a 3-day
cascade across its two models, published rows equal to a from-scratch SQL of the same
logic; a failing dbt test blocks publication; a changed model yields the stale list."""
from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.backfills.code_staleness import stale_partitions
from backfill_portal.backfills.models import Interval
from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.models import Job
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import CheckResult, Run
from backfill_portal.warehouse.models import Consumption
from tests.dbt.conftest import postgres_only, summary, sync_dbt

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres, postgres_only]
DAYS = ["2022-10-02", "2022-10-03", "2022-10-04"]

# The example's logic written once more by hand, over the whole source at once.
FROM_SCRATCH_ORDERS = """
    SELECT order_id, customer_id, ordered_at, status, CAST(ROUND(amount * 100) / 100.0 AS numeric(12, 2)) AS amount
    FROM raw_orders
    WHERE status <> 'cancelled' AND ordered_at >= '2022-10-02' AND ordered_at < '2022-10-05'
    ORDER BY order_id"""
FROM_SCRATCH_DAILY = """
    SELECT CAST(ordered_at AS date) AS sales_date, COUNT(*) AS order_count,
           SUM(CAST(ROUND(amount * 100) / 100.0 AS numeric(12, 2))) AS amount
    FROM raw_orders
    WHERE status <> 'cancelled' AND ordered_at >= '2022-10-02' AND ordered_at < '2022-10-05'
    GROUP BY 1 ORDER BY 1"""


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url.replace("postgresql://", "postgres://", 1)) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


def cascade(personas, *, start=DAYS[0], end=DAYS[-1]):
    request, _ = backfill_request_create(actor=personas["alice"], job="orders", start=start, end=end,
                                         reason="dbt example, end to end", cascade="cascade")
    backfill_request_submit(actor=personas["alice"], request_id=request.pk, confirm_overlap=True)
    for owner in ("olivia", "sam"):
        backfill_request_decide(actor=personas[owner], request_id=request.pk, approve=True)
    return request


def naive_utc(value):
    """The portal's timestamp columns hold instants; the source's are UTC wall times."""
    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(timezone.utc).replace(tzinfo=None)
    return value


def published(warehouse, dataset: str, key_columns: list[str]) -> list[tuple]:
    out = []
    for day in DAYS:
        out += [tuple(naive_utc(r[c]) for c in key_columns) for r in warehouse.read_partition(dataset, day)]
    return sorted(out)


def test_the_example_cascade_publishes_what_a_from_scratch_sql_computes(personas, dbt_shop, shop_orders,
                                                                           task_queue, warehouse):
    lines = sync_dbt(dbt_shop)
    assert "created job orders" in lines and "created job daily_sales" in lines
    assert summary(sync_dbt(dbt_shop)).startswith("0 created, 0 changed")  # idempotent
    request = cascade(personas)
    task_queue.drain()
    runs = {(r.job.name, r.partition_key): r for r in Run.objects.filter(request=request).select_related("job")}
    assert len(runs) == 6
    for run in runs.values():
        assert run.status == RunStatus.PUBLISHED, (run.job.name, run.partition_key, run.error)
    for day in DAYS:  # daily_sales read exactly the orders versions this request published
        pin = Consumption.objects.get(run=runs[("daily_sales", day)], dataset__name="orders", partition_key=day)
        assert pin.version.run_id == runs[("orders", day)].pk
    columns = ["order_id", "customer_id", "ordered_at", "status", "amount"]
    assert published(warehouse, "orders", columns) == rows(shop_orders, FROM_SCRATCH_ORDERS)
    assert published(warehouse, "daily_sales", ["sales_date", "order_count", "amount"]) == \
        rows(shop_orders, FROM_SCRATCH_DAILY)
    dbt_checks = set(CheckResult.objects.filter(run=runs[("orders", DAYS[0])], name__startswith="dbt_")
                     .values_list("name", "passed"))
    assert ("dbt_unique_orders_order_id", True) in dbt_checks and len(dbt_checks) == 4


def test_a_failing_dbt_test_blocks_publication(personas, dbt_shop, shop_orders, task_queue, warehouse):
    with psycopg.connect(shop_orders.replace("postgresql://", "postgres://", 1), autocommit=True) as conn:
        conn.execute("INSERT INTO raw_orders VALUES (99999, 1, '2022-10-03 12:00', 'lost', 10.00)")
    sync_dbt(dbt_shop)
    request = cascade(personas)
    task_queue.drain()
    bad = Run.objects.get(request=request, job__name="orders", partition_key="2022-10-03")
    assert bad.status == RunStatus.VERIFICATION_FAILED
    check = CheckResult.objects.get(run=bad, name="dbt_accepted_values_orders_status__placed__shipped__returned")
    assert not check.passed and check.blocking
    assert warehouse.current("orders", "2022-10-03") is None  # nothing visible
    assert warehouse.current("orders", "2022-10-02") is not None
    # daily_sales of the blocked day never ran on an unpublished input.
    assert not Run.objects.filter(request=request, job__name="daily_sales", partition_key="2022-10-03",
                                  status=RunStatus.PUBLISHED).exists()


def test_a_changed_model_lists_its_stale_partitions_and_drafts_their_rebuild(personas, dbt_shop, shop_orders,
                                                                             task_queue, warehouse):
    sync_dbt(dbt_shop)
    cascade(personas)
    task_queue.drain()
    old = Job.objects.get(name="daily_sales").current_code_version
    model = dbt_shop / "models" / "daily_sales.sql"
    model.write_text(model.read_text().replace("sum(amount) as amount", "sum(amount) * 1 as amount"))
    lines = sync_dbt(dbt_shop, "--draft-backfill", "alice")
    job = Job.objects.get(name="daily_sales")
    assert job.current_code_version != old
    assert f"changed job daily_sales code version {old.short_hash} -> {job.current_code_version.short_hash}" in lines
    assert (f"stale daily_sales: 3 published partition(s) built by older code "
            f"(now {job.current_code_version.short_hash}): {', '.join(DAYS)}") in lines
    assert not any(line.startswith("stale orders") for line in lines)  # orders did not change
    assert [p.partition_key for p in stale_partitions(job=job)] == DAYS
    draft = next(line for line in lines if line.startswith("draft request"))
    request_id = int(draft.split()[2])
    assert sorted(Interval.objects.filter(request_id=request_id).values_list("job__name", "partition_key")) == \
        [("daily_sales", day) for day in DAYS]
    # The job's page lists them too, and its one click gives the same draft.
    client = Client()
    client.force_login(personas["alice"])
    page = client.get(reverse("catalog-job-stale", args=["daily_sales"])).content.decode()
    assert "3 stale partitions" in page and all(day in page for day in DAYS)
    answer = client.post(reverse("catalog-job-stale-draft", args=["daily_sales"]))
    assert answer.status_code == 302 and answer["Location"] == reverse("request-detail", args=[request_id])
    # Rebuilt with the new code, nothing is stale any more, and the numbers held.
    backfill_request_submit(actor=personas["alice"], request_id=request_id, confirm_overlap=True)
    backfill_request_decide(actor=personas["sam"], request_id=request_id, approve=True)
    task_queue.drain()
    assert stale_partitions(job=job) == []
    assert published(warehouse, "daily_sales", ["sales_date", "order_count", "amount"]) == \
        rows(shop_orders, FROM_SCRATCH_DAILY)
