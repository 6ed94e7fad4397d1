"""Oscar (on-call) rolls back one partition of a doubled backfill from the dataset page:
the confirmation shows the impact (the consumer runs that read the bad version and the
datasets they produced), a lost race is a clear 409, and the rebuild is filed."""
from __future__ import annotations

import re

import pytest

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.execution.models import Run
from backfill_portal.recovery.rollback import partition_rollback
from tests.browser.scenarios import doubled_incident

# Without playwright the module is skipped with this reason (conftest skips without chromium).
expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)


def test_oscar_rolls_back_a_partition_sees_the_impact_and_files_the_rebuild(
        as_user, personas, demo_sources, task_queue, warehouse):
    good, bad, dws = doubled_incident(personas, task_queue, good_range=("2022-10-01", "2022-10-02"),
                                      bad_range=("2022-10-01", "2022-10-02"), with_consumer=True)
    good_run = Run.objects.get(request=good, partition_key="2022-10-01")
    bad_run = Run.objects.get(request=bad, partition_key="2022-10-01")
    dws_run = Run.objects.get(request=dws, partition_key="2022-10-01")
    oscar = as_user("oscar")
    page = oscar.page
    oscar.goto("/datasets/dwd_order_items/")
    expect(page.get_by_role("row", name=re.compile("2022-10-01"))).to_contain_text(bad_run.run_id)
    oscar.shot("dataset")

    # A lost race first: on 2022-10-02 someone else rolls back while oscar's confirmation is open.
    oscar.goto("/datasets/dwd_order_items/partitions/2022-10-02/")
    page.get_by_role("link", name="Roll back…").click()
    expect(page.locator("#rollback-confirm")).to_contain_text("consumer run")
    partition_rollback(actor=personas["admin"], dataset="dwd_order_items", partition_key="2022-10-02",
                       reason="admin got there first")
    page.get_by_label("Reason").fill("amounts doubled by the 02:00 deploy")
    page.get_by_role("button", name=re.compile("^Roll back to")).click()
    alert = page.locator("#rollback-confirm [role=alert]")
    expect(alert).to_contain_text("Conflict (HTTP 409): nothing was changed.")
    expect(alert).to_contain_text("already rolled back")
    oscar.shot("conflict")

    # The real one, on 2022-10-01, from the dataset page.
    oscar.goto("/datasets/dwd_order_items/")
    page.get_by_role("link", name="2022-10-01").click()
    page.wait_for_url(re.compile(r"/datasets/dwd_order_items/partitions/2022-10-01/$"))
    expect(page.locator("#current-h + dl")).to_contain_text(bad_run.run_id)
    page.get_by_role("link", name="Roll back…").click()
    confirm = page.locator("#rollback-confirm")
    expect(confirm).to_contain_text("1 consumer run read the version being rolled back")
    expect(confirm).to_contain_text(dws_run.run_id)
    expect(confirm).to_contain_text("dws_sales_daily / 2022-10-01")
    expect(confirm).to_contain_text(good_run.run_id)  # what readers will see again
    expect(page.locator("#rb-h")).to_be_focused()
    oscar.shot("impact")
    page.get_by_role("button", name=re.compile("^Roll back to")).click()
    expect(page.locator("#id_reason_error, #rollback-confirm .errorlist")).to_contain_text("say why")
    page.get_by_label("Reason").fill("amounts doubled by the 02:00 deploy")
    expect(page.get_by_label("Also file one request to rebuild the consumers and everything built from them")).to_be_checked()
    page.get_by_role("button", name=re.compile("^Roll back to")).click()

    expect(page.get_by_role("status").filter(has_text="Rolled back dwd_order_items/2022-10-01")).to_be_visible()
    expect(page.locator("h1 .pill")).to_have_text("rolled back")
    expect(page.locator("#current-h + dl")).to_contain_text(good_run.run_id)
    expect(page.locator("#rolled-h + p")).to_contain_text("oscar moved the pointer")
    expect(page.get_by_role("status").filter(has_text="Filed for approval")).to_contain_text("dws_sales_daily")
    oscar.shot("rolled-back")
    assert warehouse.current("dwd_order_items", "2022-10-01") == good_run.run_id
    rebuild = BackfillRequest.objects.get(job__name="dws_sales_daily", status="pending_approval")
    assert (rebuild.first_partition, rebuild.requested_by.username) == ("2022-10-01", "oscar")

    # Home shows it among the recent rollbacks.
    oscar.goto("/")
    expect(page.locator("#rollbacks-h + .table-wrap")).to_contain_text("dwd_order_items / 2022-10-01")
