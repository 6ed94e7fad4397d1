"""The request and audit table rows, rendered by the `tables` template filters: every
value escaped, links and times as the templates showed them."""
from __future__ import annotations

from datetime import datetime, timezone
from types import SimpleNamespace

from django.urls import reverse

from backfill_portal.web.templatetags.tables import (
    audit_rows,
    failing_rows,
    request_rows,
    run_list_rows,
    stuck_rows,
    url_filler,
)

AT = datetime(2024, 3, 5, 7, 8, 9, tzinfo=timezone.utc)


def request_row(**overrides):
    row = dict(pk=42, job=SimpleNamespace(name="dwd_order_items"), first_partition="2022-10-01",
               last_partition="2022-10-03", interval_count=3, status="running", paused=False,
               requested_by=SimpleNamespace(username="alice"), requested_at=AT)
    row.update(overrides)
    return SimpleNamespace(**row)


def event(**overrides):
    fields = dict(pk=7, at=AT, actor_name="olivia", action="request.approved", object_type="request",
                  object_id="42", request_id=42, dataset="dwd_order_items", from_state="pending_approval",
                  to_state="approved", reason="looks right", data={})
    fields.update(overrides)
    return SimpleNamespace(**fields)


def test_url_filler_matches_reverse():
    detail, job = url_filler("request-detail"), url_filler("catalog-job")
    assert detail(42) == reverse("request-detail", args=[42])
    assert job("dwd_order_items") == reverse("catalog-job", args=["dwd_order_items"])


def test_request_row_shows_links_range_status_and_time():
    html = request_rows([request_row()])
    assert f'<a href="{reverse("request-detail", args=[42])}">#42</a>' in html
    assert f'<a href="{reverse("catalog-job", args=["dwd_order_items"])}">dwd_order_items</a>' in html
    assert '<td class="mono range">2022-10-01 → 2022-10-03</td>' in html
    assert '<span class="pill pill-running">running</span></td>' in html
    assert 'pill-paused' not in html
    assert ('<time datetime="2024-03-05T07:08:09+00:00" title="2024-03-05 07:08:09 UTC">2024-03-05 07:08</time>'
            in html)


def test_request_row_single_partition_and_paused():
    html = request_rows([request_row(last_partition="2022-10-01", paused=True)])
    assert '<td class="mono range">2022-10-01</td>' in html
    assert '<span class="pill pill-paused">paused</span>' in html


def test_request_row_escapes_every_value():
    html = request_rows([request_row(first_partition="<b>", last_partition='"x"&',
                                     requested_by=SimpleNamespace(username="<script>alert(1)</script>"),
                                     status='a"b')])
    assert "<script>" not in html and "<b>" not in html
    assert "&lt;b&gt; → &quot;x&quot;&amp;" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'class="pill pill-a&quot;b"' in html


def test_audit_row_change_request_link_and_time():
    html = audit_rows([event()])
    assert "<tr>\n" in html  # not a denial
    assert f'<td><a href="{reverse("request-detail", args=[42])}">#42</a></td>' in html
    assert '<td class="mono">pending_approval → approved</td>' in html
    assert '<time datetime="2024-03-05T07:08:09+00:00">2024-03-05 07:08:09</time>' in html
    assert '<td class="mono">request:42</td>' in html


def test_audit_row_denied_empty_states_no_request_and_long_reason():
    reason = "x" * 500 + "<end>"
    html = audit_rows([event(action="denied.request.cancel", request_id=None, from_state="", to_state="",
                             reason=reason)])
    assert '<tr class="row-denied">' in html
    assert "<td></td>" in html  # no request link
    assert '<td class="mono"></td>' in html  # no state change
    assert f'title="{"x" * 500}&lt;end&gt;"' in html  # the full reason on hover, escaped
    assert f'>{"x" * 399}…</td>' in html  # the cell, as wide as the screen, truncated to 400 characters


def test_audit_row_one_sided_change_shows_the_empty_state():
    html = audit_rows([event(from_state="", to_state="draft")])
    assert '<td class="mono">∅ → draft</td>' in html


def run(**overrides):
    """A run table row: execution.selectors.RUN_ROW_VALUES, with moved_at."""
    fields = {"pk": 9, "run_id": "r-20240305-abc", "job__name": "dwd_order_items",
              "job__dataset__name": "dwd_order_items_ds", "job__dataset_id": 3, "partition_key": "2022-10-01",
              "run_type": "backfill", "status": "verification_failed", "request_id": 42, "created_at": AT,
              "started_at": AT, "finished_at": AT.replace(second=21), "error": "the version has no rows",
              "moved_at": AT}
    fields.update(overrides)
    return fields


def test_run_list_row_links_state_took_and_error():
    html = run_list_rows([run()], {9})
    assert '<tr data-run="r-20240305-abc">' in html
    assert f'<a href="{reverse("run-detail", args=["r-20240305-abc"])}">r-20240305-abc</a>' in html
    assert f'<a href="{reverse("catalog-job", args=["dwd_order_items"])}">dwd_order_items</a>' in html
    assert "→ dwd_order_items_ds</span>" in html
    assert ('<span class="pill pill-verification_failed">verification failed</span> '
            '<span class="pill pill-failed">stuck</span>') in html
    assert f'<td><a href="{reverse("request-detail", args=[42])}">#42</a></td>' in html
    assert '<time datetime="2024-03-05T07:08:09+00:00">2024-03-05 07:08:09</time>' in html
    assert '<td class="nowrap">12 s</td>' in html
    assert '<span class="error-text run-error">the version has no rows</span>' in html


def test_run_list_row_scheduled_unfinished_not_stuck_and_long_error():
    html = run_list_rows([run(request_id=None, finished_at=None, error="e" * 300)], "")
    assert "pill-failed" not in html
    assert "<td>—</td>" in html  # no request
    assert '<td class="nowrap">—</td>' in html  # not finished: no duration
    assert "e" * 199 + "…</span>" in html and "e" * 200 not in html


def test_home_failing_and_stuck_rows():
    html = failing_rows([run(error="")])
    assert '<td class="mono"><a href="' in html
    assert '<time datetime="2024-03-05T07:08:21+00:00">2024-03-05 07:08</time>' in html
    assert '<td class="clip error-cell">—</td>' in html
    html = stuck_rows([run(status="running")])
    assert '<span class="pill pill-running">running</span>' in html
    assert '<time datetime="2024-03-05T07:08:09+00:00">2024-03-05 07:08</time> (' in html and " ago)</td>" in html
    from datetime import timedelta

    from django.utils import timezone as dj_timezone

    two_hours_ago = dj_timezone.now() - timedelta(hours=2, seconds=5)
    assert "(2 h ago)</td>" in stuck_rows([run(moved_at=two_hours_ago)])


def test_run_rows_escape_every_value():
    evil = "<script>x</script>"
    item = run(run_id='a"b', partition_key=evil, run_type=evil, error=evil, status='s"', job__name=evil,
               job__dataset__name=evil)
    for html in (run_list_rows([item], ()), failing_rows([item]), stuck_rows([item])):
        assert "<script>" not in html and "&lt;script&gt;" in html
        assert 'data-run="a"b"' not in html and 'pill-s"' not in html


def test_run_row_values_are_what_the_run_tables_read():
    from backfill_portal.execution.selectors import RUN_ROW_VALUES

    assert set(run()) == {*RUN_ROW_VALUES, "moved_at"}
