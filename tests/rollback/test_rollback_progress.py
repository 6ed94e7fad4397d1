"""A rolled-back request's progress says how many of its published intervals were
rolled back, on the request page and in the API: the intervals stay `published` (their
lifecycle ends there); the runs that published them are `rolled_back`."""
from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02"]


@pytest.fixture
def doubled(personas, ready):
    """Two days published over a good version of them, then found doubled."""
    run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy(dwd_sql=DOUBLED_SQL)
    bad = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy()
    return bad


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
