"""Olivia (the target owner) explains the intervals whose numbers moved and signs off the
reconciliation; sign-off stays disabled, with the reason, until nothing is unexplained."""
from __future__ import annotations

import csv
import io
import re

import pytest

from backfill_portal.backfills.models import ReconciliationRow
from tests.browser.scenarios import doubled_incident

# Without playwright the module is skipped with this reason (conftest skips without chromium).
expect = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e .[test])").expect
pytestmark = pytest.mark.django_db(transaction=True)


def test_olivia_explains_every_moved_interval_and_signs_off(as_user, personas, demo_sources, task_queue, warehouse):
    _, doubled, _ = doubled_incident(personas, task_queue)
    assert doubled.status == "reconciling"
    olivia = as_user("olivia")
    page = olivia.page
    olivia.goto(f"/requests/{doubled.pk}/")
    page.get_by_role("link", name=re.compile("Reconciliation")).click()
    page.wait_for_url(re.compile(rf"/requests/{doubled.pk}/reconciliation/$"))
    counts = page.locator("#verdict-counts")
    expect(counts).to_contain_text("unexplained 3")
    signoff = page.get_by_role("button", name=re.compile("Sign off"))
    expect(signoff).to_be_disabled()
    expect(page.locator("#signoff-blocked")).to_contain_text("3 intervals are unexplained")
    expect(page.locator("svg.rows-chart .chart-after")).to_have_count(3)
    olivia.shot("unexplained")

    rows = list(ReconciliationRow.objects.filter(request=doubled).order_by("partition_key"))
    for i, row in enumerate(rows):
        tr = page.locator(f"#rec-row-{row.pk}")
        expect(tr).to_contain_text("baseline")
        tr.locator("summary").click()
        tr.get_by_label("Explanation").fill("doubled by the 02:00 deploy; fixed and backfilled again by #corrective")
        if i == 0:
            olivia.shot("explaining")
        tr.get_by_role("button", name="Save explanation").click()
        expect(page.locator(f"#rec-row-{row.pk} .pill-v-explained")).to_be_visible()
        expect(counts).to_contain_text(f"unexplained {len(rows) - i - 1}")
    expect(signoff).to_be_enabled()
    expect(page.locator("#signoff form textarea")).to_have_count(1)  # the form arrived whole
    expect(page.locator("#signoff-blocked")).to_have_count(0)

    with page.expect_download() as download:
        page.get_by_role("link", name="Export CSV").click()
    table = list(csv.reader(io.StringIO(open(download.value.path(), encoding="utf-8").read())))
    assert table[0][:3] == ["job", "dataset", "partition_key"]
    assert {r[2] for r in table[1:4]} == {"2022-10-01", "2022-10-02", "2022-10-03"}
    assert all(r[4] == "explained" for r in table[1:4])

    page.get_by_label("Sign-off comment").fill("explained: the doubled version is superseded by the fix")
    signoff.click()
    expect(page.get_by_role("status").filter(has_text="Signed off")).to_be_visible()
    expect(page.locator("h1 .pill")).to_have_text("completed")
    expect(page.locator("#signoff")).to_contain_text("signed off by olivia")
    olivia.shot("signed-off")
    doubled.refresh_from_db()
    assert doubled.status == "completed"
