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
    with django_assert_max_num_queries(6):
        client.get(reverse("request-live", args=[large.pk]))


def test_home_audit_and_catalog_do_not_grow_with_rows(web, make_request):
    client = web("olivia")
    file_requests(make_request, 3, offset=0)
    before = {name: count_queries(client, reverse(name)) for name in ("home", "audit", "catalog")}
    file_requests(make_request, 30, offset=100)
    after = {name: count_queries(client, reverse(name)) for name in ("home", "audit", "catalog")}
    assert before == after
