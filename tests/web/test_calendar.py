"""The request calendar (web/calendar_grid.py): a row per job in cascade layer order, a
column per partition, labelled axes, a legend, each cell a link to its run; above 2,000
intervals one cell per local day that opens the calendar of that day."""
from __future__ import annotations

import re

from django.urls import reverse

from backfill_portal.backfills.models import Interval
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.dispatch import dispatch_request


def calendar(client, req, **params):
    return client.get(reverse("request-calendar", args=[req.pk]), params)


def row_labels(html: str) -> list[str]:
    return re.findall(r'<th scope="row" class="cal-job">([a-z_]+) ', html)


def test_a_cascade_has_one_row_per_job_in_layer_order_and_a_column_per_partition(web, make_request):
    req = make_request("running", cascade="cascade", start="2022-10-01", end="2022-10-03")
    dispatch_request(request_id=req.pk)
    response = calendar(web("alice"), req)
    assert response.status_code == 200
    html = response.content.decode()
    jobs = row_labels(html)
    assert jobs[0] == "dwd_order_items" and jobs.index("dws_sales_daily") < jobs.index("monthly_summary")
    assert set(jobs) == set(Interval.objects.filter(request=req).values_list("job__name", flat=True))
    assert 'dwd_order_items <span class="muted small">target</span>' in html
    assert 'dws_sales_daily <span class="muted small">layer 1, rebuild</span>' in html
    # Labelled axes: the corner names both, a column group per month, a column per day.
    assert "Job <span aria-hidden=\"true\">↓</span> partition" in html
    assert '<th scope="colgroup" colspan="3" class="cal-group">2022-10</th>' in html
    assert '<th scope="col" class="cal-col" title="2022-10-02">02</th>' in html
    assert "One row per job in cascade layer order, one column per partition" in html
    assert 'aria-label="Legend"' in html and "planned (no run yet)" in html and "no interval" in html
    # Every dispatched interval's cell links to its run; the others say what they are.
    for run in Run.objects.filter(request=req).select_related("job"):
        assert (f'<a href="/runs/{run.run_id}/" title="{run.job.name} {run.partition_key}: queued '
                f'({run.run_id})"></a>') in html
    assert html.count('<td class="c s-') == Interval.objects.filter(request=req).count()
    # The table scrolls inside a region a keyboard can reach (axe: scrollable-region-focusable).
    assert '<div class="cal-wrap" tabindex="0" role="region" aria-labelledby="calendar-caption">' in html


def test_a_long_hourly_request_aggregates_to_days_and_a_day_opens_its_hours(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2022-10-01T00:00-04:00",
                       end="2023-01-31T23:00-05:00")
    client = web("alice")
    html = calendar(client, req).content.decode()
    assert "One cell per local day of each job (123 cells): rows are months, columns days" in html
    assert '<th scope="row" class="cal-row">2022-11</th>' in html and "month <span" in html
    link = f'/requests/{req.pk}/calendar/?job=page_views_hourly&amp;within=2022-11-06'
    assert f'<a href="{link}" title="page_views_hourly 2022-11-06: 25 intervals, 25 planned">' in html

    day = calendar(client, req, job="page_views_hourly", within="2022-11-06").content.decode()
    assert "Calendar of page_views_hourly in 2022-11-06" in day
    assert day.count('<td class="c s-planned"') == 25  # the repeated autumn hour is its own column
    assert ('<th scope="col" class="cal-col" title="2022-11-06T01:00-05:00">01:00 <span class="cal-off">-05:00</span>'
            '</th>') in day

    month = calendar(client, req, job="page_views_hourly", within="2022-11").content.decode()
    assert "rows are local days, columns hours" in month
    assert month.count('<td class="c s-planned"') == 30 * 24 + 1
    assert 'class="c multi"' in month  # 2022-11-06 01:00 twice, side by side in one slot


def test_the_calendar_refuses_a_bad_prefix_or_a_job_outside_the_request(web, make_request):
    req = make_request("pending")
    client = web("alice")
    response = calendar(client, req, within="October")
    assert response.status_code == 400
    assert "is not a partition-key prefix such as 2022, 2022-10 or 2022-10-01" in response.content.decode()
    response = calendar(client, req, job="page_views_hourly")
    assert response.status_code == 400
    assert f"job &#x27;page_views_hourly&#x27; is not part of request #{req.pk}" in response.content.decode()
    assert client.get(reverse("request-calendar", args=[99999])).status_code == 404
    empty = calendar(client, req, within="2021").content.decode()
    assert "No interval in 2021." in empty


def hour_labels(html: str) -> list[str]:
    """The visible text of each hour column's header, in column order."""
    cols = re.findall(r'<th scope="col" class="cal-col" title="[^"]+">(.*?)</th>', html)
    return [re.sub(r"<[^>]+>", "", c) for c in cols]


def test_the_repeated_fall_back_hour_shows_its_offset_in_the_visible_column_label(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2022-11-05T22:00-04:00",
                       end="2022-11-06T03:00-05:00")
    html = calendar(web("alice"), req).content.decode()
    labels = hour_labels(html)
    assert labels == ["22:00", "23:00", "00:00", "01:00 -04:00", "01:00 -05:00", "02:00", "03:00"]
    assert len(set(labels)) == len(labels)  # no two columns read alike


def test_the_spring_forward_gap_shows_the_offsets_either_side_of_the_skipped_hour(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2023-03-12T00:00-05:00",
                       end="2023-03-12T04:00-04:00")
    labels = hour_labels(calendar(web("alice"), req).content.decode())
    assert labels == ["00:00", "01:00 -05:00", "03:00 -04:00", "04:00"]


def test_a_matrix_row_of_a_dst_day_names_the_offset_change_beside_the_day(web, make_request):
    req = make_request("pending", job="page_views_hourly", start="2022-10-20T00:00-04:00",
                       end="2022-11-10T23:00-05:00")
    html = calendar(web("alice"), req).content.decode()
    assert "rows are local days, columns hours" in html
    assert ('<th scope="row" class="cal-row">2022-11-06 <span class="cal-off">UTC-04:00 → -05:00</span></th>'
            in html)
    assert '<th scope="row" class="cal-row">2022-11-05</th>' in html


def test_the_repeated_hour_east_of_utc_is_still_shown_first_occurrence_first(web, make_request):
    # London's repeated hour is 01:00+01:00 then 01:00+00:00: a string sort of the keys
    # would put the second occurrence first.
    from backfill_portal.catalog.models import Dataset

    Dataset.objects.filter(name="page_views_hourly").update(timezone="Europe/London")
    req = make_request("pending", job="page_views_hourly", start="2022-10-30T00:00+01:00",
                       end="2022-10-30T02:00+00:00")
    labels = hour_labels(calendar(web("alice"), req).content.decode())
    assert labels == ["00:00", "01:00 +01:00", "01:00 +00:00", "02:00"]
