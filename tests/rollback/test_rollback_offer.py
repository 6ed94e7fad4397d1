"""The request page offers "Roll back this request" only where it can succeed: a
request that published the first version of a partition has nothing to go back to,
and the page says so instead of a form the service would answer with a 409."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02"]


def page(personas, request_id: int) -> str:
    client = Client()
    client.force_login(personas["oscar"])
    return client.get(reverse("request-detail", args=[request_id])).content.decode()


def test_rollback_is_offered_only_over_an_earlier_version_and_otherwise_the_page_says_why(personas, ready, warehouse, api):
    first = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    html = page(personas, first.pk)
    assert "Roll back this request" in html and 'id="rollback-blocked"' in html
    assert "first version of dwd_order_items/2022-10-01, dwd_order_items/2022-10-02" in html
    assert reverse("request-rollback", args=[first.pk]) not in html
    # What the service answers, had the form been offered.
    refused = api("oscar").post(f"/api/requests/{first.pk}/rollback/", {"reason": "try"}, format="json")
    assert refused.status_code == 409 and "no previous verified version" in refused.json()["detail"]

    # A request over those versions has them to go back to: the form is offered.
    deploy(dwd_sql=DOUBLED_SQL)
    second = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy()
    html = page(personas, second.pk)
    assert reverse("request-rollback", args=[second.pk]) in html and 'id="rollback-blocked"' not in html
