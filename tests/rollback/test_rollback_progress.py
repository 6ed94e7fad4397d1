"""A rolled-back request's progress says how many of its published intervals were
rolled back, on the request page and in the API: the intervals stay `published` (their
lifecycle ends there); the runs that published them are `rolled_back`. Its calendar
draws each of them as "rolled back" (struck through, and said in the cell's title), not
as published."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.execution.transitions import run_transition
from backfill_portal.web import calendar_grid
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02"]


@pytest.fixture
def incident(personas, ready):
    """(good, bad): two days published, then published again over them and found doubled."""
    good = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy(dwd_sql=DOUBLED_SQL)
    bad = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy()
    return good, bad


@pytest.fixture
def doubled(incident):
    """Two days published over a good version of them, then found doubled."""
    return incident[1]


def legend(personas, request_id: int) -> dict[str, int]:
    client = Client()
    client.force_login(personas["audrey"])
    html = client.get(reverse("request-detail", args=[request_id])).content.decode()
    return {name: int(n) for name, n in re.findall(r'class="swatch seg-[a-z_]+" aria-hidden="true"></span>([a-z ]+) '
                                                    r"<strong>(\d+)</strong>", html)}


def test_a_rolled_back_request_shows_its_intervals_rolled_back_not_published(personas, warehouse, api, doubled):
    assert api("audrey").get(f"/api/requests/{doubled.pk}/").json()["progress"]["published"] == 2
    response = api("oscar").post(f"/api/requests/{doubled.pk}/rollback/", {"reason": "amounts doubled"},
                                 format="json")
    assert response.status_code == 200, response.json()

    progress = api("audrey").get(f"/api/requests/{doubled.pk}/").json()["progress"]
    assert (progress["total"], progress["published"], progress["rolled_back"]) == (2, 0, 2)
    shown = legend(personas, doubled.pk)
    assert (shown["published"], shown["rolled back"]) == (0, 2)


def test_one_partition_rolled_back_counts_one_interval_rolled_back(personas, warehouse, api, doubled):
    response = api("olivia").post(f"/api/datasets/dwd_order_items/partitions/{DAYS[1]}/rollback/",
                                  {"reason": "doubled"}, format="json")
    assert response.status_code == 200, response.json()

    progress = api("audrey").get(f"/api/requests/{doubled.pk}/").json()["progress"]
    assert (progress["published"], progress["rolled_back"]) == (1, 1)
    shown = legend(personas, doubled.pk)
    assert (shown["published"], shown["rolled back"]) == (1, 1)


# --- the calendar ---------------------------------------------------------------------------


def page(personas, request_id: int, name: str = "request-detail") -> str:
    client = Client()
    client.force_login(personas["audrey"])
    response = client.get(reverse(name, args=[request_id]))
    assert response.status_code == 200
    return response.content.decode()


def cells(html: str) -> dict[str, tuple[str, str]]:
    """partition -> (the cell's state class, its title) of a one-job calendar strip."""
    found = re.findall(r'<td class="c s-([a-z_]+)"><a href="/runs/(run_[0-9a-f]+)/" title="dwd_order_items '
                       r'([0-9-]+): ([^"(]+) \(run_[0-9a-f]+\)"></a></td>', html)
    return {key: (state, said) for state, _, key, said in found}


def rollback_partition(api, key: str) -> None:
    response = api("olivia").post(f"/api/datasets/dwd_order_items/partitions/{key}/rollback/",
                                  {"reason": "doubled"}, format="json")
    assert response.status_code == 200, response.json()


def test_the_calendar_shows_a_rolled_back_interval_as_rolled_back_and_its_legend_says_so(personas, api, incident):
    good, bad = incident
    assert cells(page(personas, bad.pk)) == {DAYS[0]: ("published", "published"), DAYS[1]: ("published", "published")}
    rollback_partition(api, DAYS[1])

    for name in ("request-detail", "request-calendar"):
        html = page(personas, bad.pk, name)
        assert cells(html) == {DAYS[0]: ("published", "published"), DAYS[1]: ("rolled_back", "rolled back")}
        assert ('<li><span class="swatch s-rolled_back" aria-hidden="true"></span>rolled back (published, then '
                "withdrawn)</li>") in html
    # The progress bar counts what the calendar draws.
    shown = legend(personas, bad.pk)
    assert (shown["published"], shown["rolled back"]) == (1, 1)
    # The good request's version of that day is shown to readers again: published, as before.
    assert cells(page(personas, good.pk)) == {DAYS[0]: ("published", "published"),
                                              DAYS[1]: ("published", "published")}


def test_a_calendar_with_nothing_rolled_back_still_has_the_legend_entry(personas, incident):
    good, _ = incident
    html = page(personas, good.pk, "request-calendar")
    assert 'class="swatch s-rolled_back"' in html and "s-rolled_back\"><a" not in html
    assert {state for state, _ in cells(html).values()} == {"published"}


def test_an_interval_whose_run_is_published_again_no_longer_shows_rolled_back(personas, api, doubled):
    rollback_partition(api, DAYS[1])
    assert cells(page(personas, doubled.pk))[DAYS[1]] == ("rolled_back", "rolled back")

    # The run lifecycle's rolled_back -> published edge: its version is published again.
    run = Run.objects.select_related("job__dataset").get(request=doubled, partition_key=DAYS[1],
                                                        status=RunStatus.ROLLED_BACK)
    run_transition(run, to=RunStatus.PUBLISHED, reason="published again")
    assert cells(page(personas, doubled.pk)) == {DAYS[0]: ("published", "published"),
                                                 DAYS[1]: ("published", "published")}
    shown = legend(personas, doubled.pk)
    assert (shown["published"], shown["rolled back"]) == (2, 0)


def test_an_aggregated_calendar_counts_rolled_back_intervals_in_their_bucket(personas, api, doubled, monkeypatch):
    rollback_partition(api, DAYS[1])
    monkeypatch.setattr(calendar_grid, "CALENDAR_MAX_CELLS", 1)  # two intervals: one cell per month
    grid = calendar_grid.request_calendar(doubled)
    assert grid.mode == "buckets"
    assert (grid.counts["published"], grid.counts["rolled_back"], grid.counts["total"]) == (1, 1, 2)
    assert ('<td class="c s-rolled_back"><a href="/requests/%d/calendar/?job=dwd_order_items&amp;within=2022-10" '
            'title="dwd_order_items 2022-10: 2 intervals, 1 published, 1 rolled back"></a></td>' % doubled.pk
            ) in grid.html
