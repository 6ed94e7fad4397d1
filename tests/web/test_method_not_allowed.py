"""A visit to a page's POST-only action address is a page, not Django's blank 405."""
from __future__ import annotations

import pytest
from django.test import Client

from backfill_portal.core.middleware import page_above


@pytest.mark.parametrize(("url", "back"), [("/requests/3/approve/", "/requests/3/"),
                                           ("/requests/3/cancel/", "/requests/3/"),
                                           ("/requests/preview/", "/requests/")])
def test_a_visit_to_an_action_address_is_a_page_with_a_way_back(personas, url, back):
    client = Client()
    client.force_login(personas["olivia"])
    response = client.get(url)
    assert response.status_code == 405
    assert "POST" in response["Allow"]
    html = response.content.decode()
    assert "This address takes a form, not a visit" in html
    assert f'href="{back}"' in html
    assert 'href="/runs/"' in html  # the navigation


def test_logging_out_by_a_visit_gets_the_page_too(db):
    response = Client().get("/logout/")
    assert response.status_code == 405
    assert "This address takes a form, not a visit" in response.content.decode()


def test_the_api_keeps_its_json_405(api, db):
    response = api("alice").get("/api/auth/token/revoke/")
    assert response.status_code == 405
    assert response["Content-Type"].startswith("application/json")


def test_the_page_above_is_the_nearest_route():
    assert page_above("/requests/3/approve/") == "/requests/3/"
    assert page_above("/logout/") == "/"
    assert page_above("/no/such/place/") == "/"
