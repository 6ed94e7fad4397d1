"""/metrics during a backfill: every figure equals what the database holds at that
moment, as Prometheus' own parser reads it; who may scrape; the sweeper's repairs."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.sweep import sweep_run
from backfill_portal.warehouse.models import Publication
from tests.execution.test_pipeline import approved_request
from tests.ops.metrics import assert_matches_database, parse, value

pytestmark = pytest.mark.django_db(transaction=True)


def scrape(client: Client | None = None, **headers) -> dict:
    response = (client or Client()).get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


def test_metrics_follow_a_backfill_run_by_run_and_match_the_database(personas, catalog, demo_sources, task_queue,
                                                                     warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-06")
    seen: dict[str, float] = {}
    for _ in range(200):
        samples = scrape()
        assert_matches_database(samples)
        for state in RunStatus.values:
            seen[state] = max(seen.get(state, 0), value(samples, "backfill_runs", state=state, type="backfill"))
        if not task_queue.drain(limit=1):
            break
    samples = scrape()
    assert_matches_database(samples)
    # The runs were seen waiting, then published one by one (staged, verifying and
    # verified pass inside the execute task); at the end all six are published.
    assert seen[RunStatus.QUEUED] >= 1 and 1 <= seen[RunStatus.PUBLISHED] <= 6
    assert value(samples, "backfill_runs", state="published", type="backfill") == 6
    assert value(samples, "backfill_publish_latency_seconds_count") == 6 == Publication.objects.count()
    assert value(samples, "backfill_queue_depth", queue="backfill") == 0
    assert value(samples, "backfill_requests", state="reconciling") == 1
    assert Run.objects.filter(request=request).count() == 6


def test_the_sweepers_repairs_are_counted_from_its_audit_rows(personas, catalog, demo_sources, task_queue, warehouse):
    request = approved_request(personas, start="2022-10-01", end="2022-10-01")
    # The execute message is "lost" (never delivered): the run waits in the queue.
    task_queue.drain(skip=lambda task, args: task == "execution.execute_run")
    task_queue.sent.clear()
    samples = scrape()
    assert value(samples, "backfill_queue_depth", queue="backfill") == 1
    assert value(samples, "backfill_sweeper_actions_total", action="stale_runs") == 0
    # Nothing to repair yet: no audit row, nothing counted.
    assert sweep_run(actor=None) == {"lost": 0, "verifying": 0, "resent": 0, "stale_runs": 0, "resumed": 0,
                                     "stopped": 0, "started": 0, "dispatched": 0, "reconciled": 0, "handoffs": 0,
                                     "lineage": 0}
    assert value(scrape(), "backfill_sweeper_actions_total", action="stale_runs") == 0
    # An hour later the sweeper re-sends the stale run's task, and the scrape counts it.
    counts = sweep_run(actor=None, now=timezone.now() + timedelta(hours=1))
    assert counts["stale_runs"] == 1
    samples = scrape()
    assert value(samples, "backfill_sweeper_actions_total", action="stale_runs") == 1
    assert_matches_database(samples)
    task_queue.drain()
    samples = scrape()
    assert value(samples, "backfill_runs", state="published", type="backfill") == 1
    assert_matches_database(samples)
    request.refresh_from_db()
    assert request.status == "reconciling"


def test_metrics_answer_direct_loopback_callers_only_when_no_token_is_set(db, settings):
    settings.METRICS_TOKEN = ""
    assert Client().get("/metrics").status_code == 200  # the test client is 127.0.0.1
    elsewhere = Client(REMOTE_ADDR="10.1.2.3").get("/metrics")
    assert elsewhere.status_code == 403 and "METRICS_TOKEN" in elsewhere.json()["detail"]
    # A proxy on the same host relays outside callers from 127.0.0.1: still refused.
    for header in ({"X-Forwarded-For": "203.0.113.9"}, {"X-Real-IP": "203.0.113.9"},
                   {"Forwarded": "for=203.0.113.9;proto=https"},  # RFC 7239's header too
                   # and the CDNs' and load balancers' own (the exploratory test got 200s):
                   {"True-Client-IP": "203.0.113.9"}, {"CF-Connecting-IP": "203.0.113.9"},
                   {"X-Client-IP": "203.0.113.9"}, {"X-Cluster-Client-IP": "203.0.113.9"},
                   {"Fastly-Client-IP": "203.0.113.9"}, {"X-Original-Forwarded-For": "203.0.113.9"}):
        assert Client().get("/metrics", headers=header).status_code == 403, header


def test_metrics_need_the_bearer_token_when_one_is_set(db, settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"
    missing = Client().get("/metrics")
    assert missing.status_code == 401 and missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert Client().get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert Client().get("/metrics", headers={"Authorization": "Token s3cret-scrape-token"}).status_code == 401
    ok = Client(REMOTE_ADDR="10.1.2.3").get("/metrics", headers={"Authorization": "Bearer s3cret-scrape-token"})
    assert ok.status_code == 200 and b"backfill_runs" in ok.content


def test_metrics_refuse_other_methods(db):
    assert Client().post("/metrics").status_code == 405
