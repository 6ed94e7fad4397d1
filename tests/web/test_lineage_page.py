"""The lineage page: a server-rendered SVG (layers as columns, side-effect nodes marked,
a request's nodes highlighted, skipped ones dashed), with a title, a description and a
table of the same nodes."""
from __future__ import annotations

import re

from django.urls import reverse

URL = "/lineage/"


def node(html: str, name: str) -> str:
    match = re.search(rf'<g class="([^"]*)" data-node="{re.escape(name)}"', html)
    assert match, name
    return match.group(1)


def layer(html: str, name: str) -> int:
    return int(re.search(rf'data-node="{re.escape(name)}" data-layer="(-?\d+)"', html).group(1))


def test_whole_catalog_starts_from_the_sources_with_every_job(web, catalog):
    html = web("audrey").get(URL).content.decode()
    assert '<svg class="lineage" role="img" aria-labelledby="lineage-title lineage-desc"' in html
    assert '<title id="lineage-title">Lineage of the whole catalog</title>' in html
    assert '<desc id="lineage-desc">7 job(s) in 3 layer(s)' in html and "Inputs: ods_order_events." in html
    assert "Side-effect nodes: notify_finance." in html
    assert "ln-source" in node(html, "dataset:ods_order_events")
    assert node(html, "notify_finance") == "ln-node ln-side_effect"
    assert node(html, "dwd_order_items") == "ln-node ln-job"
    # Columns are layers: the source, then jobs reading only sources, then their consumers.
    assert layer(html, "dataset:ods_order_events") == -1
    assert layer(html, "dwd_order_items") == layer(html, "slow_items") == layer(html, "page_views_hourly") == 0
    assert layer(html, "dws_sales_daily") == 1
    assert layer(html, "monthly_summary") == layer(html, "notify_finance") == 2
    assert len(re.findall(r'<path d="[^"]+" class="ln-edge', html)) == 5  # 3 job->job, 2 from the source
    table = html.split('id="nodes-h"')[1]
    for name in ("dwd_order_items", "dwd_order_items_py", "slow_items", "page_views_hourly", "dws_sales_daily",
                 "monthly_summary", "notify_finance"):
        assert f'href="/catalog/jobs/{name}/"' in table
    assert '<span class="tag tag-warn">side effect</span>' in table
    assert 'side-effect node ⚑' in html  # the legend


def test_root_draws_its_closure_and_its_inputs(web, catalog):
    html = web("alice").get(URL, {"root": "dws_sales_daily"}).content.decode()
    assert "Lineage of dws_sales_daily</title>" in html
    assert 'data-node="dwd_order_items"' not in html.split("</svg>")[0].replace(
        'data-node="dataset:dwd_order_items"', "")
    assert "ln-upstream" in node(html, "dataset:dwd_order_items")  # an input produced upstream
    for name in ("dws_sales_daily", "monthly_summary", "notify_finance"):
        assert f'data-node="{name}"' in html
    assert '<option value="dws_sales_daily" selected>' in html


def test_request_highlights_target_rebuilt_and_skipped_nodes(web, make_request):
    req = make_request("pending", cascade="cascade", start="2022-10-01", end="2022-10-03")
    html = web("olivia").get(URL, {"request": req.pk}).content.decode()
    assert f"highlighting request #{req.pk}</title>" in html
    assert "act-target" in node(html, "dwd_order_items")
    assert "act-rebuild" in node(html, "dws_sales_daily") and "act-rebuild" in node(html, "monthly_summary")
    assert node(html, "notify_finance") == "ln-node ln-side_effect act-skip"
    assert "skipped</text>" in html and "target</text>" in html
    assert f"Request #{req.pk} touches: dwd_order_items (target), dws_sales_daily (rebuild), " in html
    assert 'class="ln-edge skipped"' in html and 'class="ln-edge on"' in html
    assert '<span class="pill pill-act-skip">skipped</span>' in html  # the table says it in words too


def test_a_request_without_cascade_leaves_downstream_untouched(web, make_request):
    req = make_request("pending", start="2022-10-01", end="2022-10-01")
    html = web("olivia").get(URL, {"request": req.pk}).content.decode()
    assert "act-target" in node(html, "dwd_order_items")
    assert "act-untouched" in node(html, "dws_sales_daily")


def test_unknown_root_or_request_is_a_404(web, catalog):
    client = web("alice")
    assert client.get(URL, {"root": "nope"}).status_code == 404
    assert client.get(URL, {"request": 99999}).status_code == 404
    assert client.get(URL, {"request": "abc"}).status_code == 404
    assert reverse("lineage") == URL
