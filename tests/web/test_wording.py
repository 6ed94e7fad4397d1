"""Words on the pages read as English: counts agree with their nouns."""
from __future__ import annotations

import re

from django.urls import reverse


def _text(response) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", response.content.decode()))


def test_a_one_day_request_says_one_daily_interval(web, make_request):
    req = make_request("running", start="2022-10-05", end="2022-10-05")
    text = _text(web("alice").get(reverse("request-detail", args=[req.pk])))
    assert "1 daily interval," in text
    assert "1 daily intervals" not in text
    assert "1 intervals" not in text


def test_a_month_request_keeps_the_plural(web, make_request):
    req = make_request("running")
    text = _text(web("alice").get(reverse("request-detail", args=[req.pk])))
    assert "31 daily intervals," in text


def test_states_are_shown_in_words_on_the_request_page_and_the_list(web, make_request):
    req = make_request("pending")
    client = web("alice")
    detail = client.get(reverse("request-detail", args=[req.pk])).content.decode()
    assert '<span class="pill pill-pending_approval">pending approval</span>' in detail
    listing = client.get(reverse("request-list")).content.decode()
    assert '<span class="pill pill-pending_approval">pending approval</span>' in listing
    assert '<option value="pending_approval">pending approval</option>' in listing
    assert ">pending_approval<" not in detail + listing
