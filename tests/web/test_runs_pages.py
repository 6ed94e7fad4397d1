"""The runs list (filters; stuck and failing first) and the run page (time per phase,
rendered SQL, its log lines, what it read and wrote, why a verification failed)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape

from backfill_portal.backends import get_warehouse
from backfill_portal.catalog.specs import spec_for
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Attempt, CheckResult, Run
from backfill_portal.execution.services.dispatch import dispatch_request
from backfill_portal.execution.transitions import run_transition
from backfill_portal.web.templatetags.timing import words

RUNS = reverse("run-list")


def section(html: str, section_id: str) -> str:
    return html.split(f'id="{section_id}"')[1].split("</section>")[0]


def walk(run: Run, *states: str, error: str = "") -> None:
    """Move `run` through `states` by its owner's transitions (which keep Run.failing)."""
    for state in states:
        run_transition(run, to=state, updates={"error": error} if state == RunStatus.FAILED else None)


@pytest.fixture
def queued(make_request):
    """A running request with its first four runs queued: (request, [runs])."""
    req = make_request("running")
    dispatch_request(request_id=req.pk)
    return req, list(Run.objects.filter(request=req).order_by("id"))


def test_stuck_and_failing_runs_come_first_and_a_fixed_failure_is_not_failing(web, queued):
    req, runs = queued
    silent, failed, fixed, fresh = runs
    hour_ago = timezone.now() - timedelta(hours=1)
    Run.objects.filter(pk=silent.pk).update(created_at=hour_ago, enqueued_at=hour_ago)
    for run in (failed, fixed):
        walk(run, RunStatus.RUNNING, RunStatus.FAILED, error="the version has no rows")
    # A later run of the same job published `fixed`'s partition: that failure no longer stands.
    later = Run.objects.create(job=fixed.job, run_type="manual", partition_key=fixed.partition_key,
                               data_interval_start=fixed.data_interval_start, data_interval_end=fixed.data_interval_end,
                               code_version=fixed.code_version)
    walk(later, RunStatus.RUNNING, RunStatus.STAGED, RunStatus.VERIFYING, RunStatus.VERIFIED, RunStatus.PUBLISHED)
    html = web("oscar").get(RUNS).content.decode()
    stuck = section(html, "runs-stuck")
    assert silent.run_id in stuck and fresh.run_id not in stuck and "stuck" in stuck
    failing = section(html, "runs-failing")
    assert failed.run_id in failing and "the version has no rows" in failing and fixed.run_id not in failing
    assert html.index('id="runs-stuck"') < html.index('id="runs-failing"') < html.index('id="runs-all"')
    everything = section(html, "runs-all")
    assert all(r.run_id in everything for r in runs)
    only_stuck = web("oscar").get(RUNS, {"state": "stuck"}).content.decode()
    assert 'id="runs-stuck"' not in only_stuck  # the state filter is the list itself
    assert silent.run_id in section(only_stuck, "runs-all") and fresh.run_id not in only_stuck


def test_a_run_waiting_for_its_backoff_is_not_stuck(web, queued):
    _req, runs = queued
    long_ago = timezone.now() - timedelta(hours=2)
    Run.objects.filter(pk=runs[0].pk).update(created_at=long_ago, enqueued_at=long_ago,
                                             retry_at=timezone.now() + timedelta(minutes=5))
    assert 'id="runs-stuck"' not in web("oscar").get(RUNS).content.decode()


def test_filters_by_state_job_dataset_type_request_and_time(web, queued, make_request):
    req, runs = queued
    other = make_request("running", job="dws_sales_daily", start="2022-10-01", end="2022-10-02")
    dispatch_request(request_id=other.pk)
    theirs = list(Run.objects.filter(request=other))
    assert theirs
    client = web("audrey")

    def shown(**params) -> set[str]:
        html = client.get(RUNS, params).content.decode()
        return {r.run_id for r in [*runs, *theirs] if r.run_id in section(html, "runs-all")}

    mine, them = {r.run_id for r in runs}, {r.run_id for r in theirs}
    assert shown() == mine | them
    assert shown(job="dws_sales_daily") == them
    assert shown(dataset="dwd_order_items") == mine
    assert shown(request=req.pk) == mine
    assert shown(run_type="backfill") == mine | them and shown(run_type="scheduled") == set()
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.CANCELLED)
    assert shown(state="cancelled") == {runs[0].run_id}
    today = timezone.now().date()
    assert shown(since=today.isoformat(), until=today.isoformat()) == mine | them
    Run.objects.filter(pk=runs[1].pk).update(created_at=timezone.now() - timedelta(days=3))
    assert shown(until=(today - timedelta(days=1)).isoformat()) == {runs[1].run_id}
    # The last day a date can hold has no day after it: no upper bound, not a 500.
    assert shown(until="9999-12-31") == mine | them and shown(since="9999-12-30", until="9999-12-31") == set()


@pytest.mark.parametrize("params, field, message", [
    ({"since": "yesterday"}, "since", "Enter a valid date."),
    ({"since": "2022-10-05", "until": "2022-10-01"}, "until", "the last day is before the first one"),
    ({"state": "exploded"}, "state", "Select a valid choice."),
    ({"job": "no_such_job"}, "job", "Select a valid choice."),
    ({"request": "1e99"}, "request", "Enter a whole number."),
])
def test_a_bad_filter_is_a_400_naming_the_field(web, queued, params, field, message):
    response = web("oscar").get(RUNS, params)
    assert response.status_code == 400
    html = response.content.decode()
    assert message in html and f'id="id_{field}"' in html and "runs-all" not in html


def test_runs_list_costs_the_same_for_4_and_40_runs(web, queued, make_request, django_assert_max_num_queries):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = web("oscar")
    with CaptureQueriesContext(connection) as few:
        assert client.get(RUNS).status_code == 200
    for i in range(9):
        more = make_request("running", start=f"2022-11-{i + 1:02d}", end=f"2022-11-{i + 1:02d}")
        dispatch_request(request_id=more.pk)
    for run in Run.objects.order_by("id")[:3]:
        walk(run, RunStatus.RUNNING, RunStatus.FAILED, error="boom")
    assert Run.objects.filter(failing=True).count() == 3
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(RUNS).status_code == 200


def test_the_nav_links_the_runs_list(web, queued):
    html = web("alice").get(RUNS).content.decode()
    assert '<a href="/runs/" aria-current="page">Runs</a>' in html


@pytest.mark.parametrize("seconds, text", [(0.0304, "30 ms"), (0.25, "250 ms"), (4.0, "4.0 s"), (42.4, "42 s"), (60, "1 min"),
                                           (125, "2 min 5 s"), (3600, "1 h"), (3 * 3600 + 120, "3 h 2 min")])
def test_durations_read_in_milliseconds_under_a_second_and_seconds_under_a_minute(seconds, text):
    assert words(seconds) == text


# --- the run page, over real runs --------------------------------------------------------------

# The in-process worker runs what the outbox sends after each commit: real transactions.
pipeline_db = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ready(catalog, demo_sources, task_queue, warehouse, settings, tmp_path):
    settings.RUN_LOG_DIR = str(tmp_path / "runs")
    return task_queue


@pipeline_db
def test_run_page_shows_phases_rendered_sql_log_lines_and_what_it_read_and_wrote(personas, ready, web):
    from tests.execution.test_pipeline import approved_request

    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    dws = approved_request(personas, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    ready.drain()
    run = Run.objects.get(request=dws)
    assert run.status == RunStatus.PUBLISHED
    upstream = Run.objects.get(job__name="dwd_order_items", status=RunStatus.PUBLISHED)
    html = web("audrey").get(reverse("run-detail", args=[run.run_id])).content.decode()
    phases = section(html, "phases-h")
    for name in ("queued", "staging", "verifying", "publishing"):
        assert f'data-phase="{name}"' in phases, name
    assert (" s</td>" in phases or " ms</td>" in phases) and "minutes" not in phases
    sql = section(html, "sql-h")
    # The template rendered against the run's interval and the upstream version it pinned:
    # the warehouse's own SQL over exactly that version (on PostgreSQL, its version table).
    pinned = get_warehouse().ref_sql(spec=spec_for(upstream.job.dataset), pins={"2022-10-01": upstream.run_id})
    assert "GROUP BY category" in sql and "{{" not in sql and escape(pinned) in sql
    log = section(html, "log-h")
    assert "attempt 1 of dws_sales_daily 2022-10-01 started" in log and "published dws_sales_daily/2022-10-01" in log
    read = section(html, "inputs-h")
    assert f'href="/runs/{upstream.run_id}/"' in read and "2022-10-01" in read
    wrote = section(html, "version-h")
    assert "dws_sales_daily / 2022-10-01" in wrote and "current" in wrote
    assert 'id="run-verdict"' not in html


@pipeline_db
def test_a_run_whose_attempt_succeeded_says_why_verification_refused_it(personas, ready, web):
    from backfill_portal.catalog.services.sync import catalog_sync
    from tests.conftest import TEST_CATALOG
    from tests.execution.test_pipeline import approved_request

    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    catalog_sync(text=TEST_CATALOG.replace("FROM {{ ref('dwd_order_items') }} AS d GROUP BY category",
                                           "FROM {{ ref('dwd_order_items') }} AS d WHERE category <> 'books' "
                                           "GROUP BY category"))
    request = approved_request(personas, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    ready.drain()
    run = Run.objects.get(request=request)
    assert run.status == RunStatus.VERIFICATION_FAILED
    assert Attempt.objects.get(run=run).status == "succeeded"
    assert not CheckResult.objects.get(run=run, name="measure_vs_source").passed
    html = web("oscar").get(reverse("run-detail", args=[run.run_id])).content.decode()
    verdict = html.split('id="run-verdict"')[1].split("</div>")[0]
    assert "The attempt succeeded: it wrote the version and its commit marker" in verdict
    assert "never published" in verdict and "measure_vs_source" in verdict
    assert "category &lt;&gt; &#x27;books&#x27;" in section(html, "sql-h")  # the code it ran, rendered
    listed = web("oscar").get(RUNS).content.decode()
    assert run.run_id in section(listed, "runs-failing")


def test_a_queued_run_says_when_its_sql_is_rendered_and_that_nothing_was_logged(web, queued):
    _req, runs = queued
    html = web("alice").get(reverse("run-detail", args=[runs[0].run_id])).content.decode()
    assert "Rendered when the run starts" in section(html, "sql-h")
    assert "No line logged under" in section(html, "log-h")
    assert 'data-phase="queued"' in section(html, "phases-h") and "so far" in section(html, "phases-h")


def test_the_attention_panels_show_the_newest_and_link_to_all_of_them(web, queued):
    from backfill_portal.web.pages.runs import ATTENTION_SHOWN

    _req, (first, *_rest) = queued
    for i in range(ATTENTION_SHOWN):
        Run.objects.create(job=first.job, run_type="backfill", partition_key=f"2021-01-{i + 1:02d}",
                           data_interval_start=first.data_interval_start, data_interval_end=first.data_interval_end,
                           code_version=first.code_version)
    runs = list(Run.objects.order_by("id"))
    assert len(runs) > ATTENTION_SHOWN
    for run in runs:
        walk(run, RunStatus.RUNNING, RunStatus.FAILED, error="boom")
    client = web("oscar")
    failing = section(client.get(RUNS + "?run_type=backfill").content.decode(), "runs-failing")
    assert failing.count("<tr data-run=") == ATTENTION_SHOWN
    assert runs[-1].run_id in failing and runs[0].run_id not in failing  # the newest
    assert f"Failing: {ATTENTION_SHOWN}+" in failing
    assert 'href="?run_type=backfill&amp;state=failing">All failing runs' in failing
    everything = client.get(RUNS + "?run_type=backfill&state=failing").content.decode()
    assert runs[0].run_id in everything and 'id="runs-failing"' not in everything


@pipeline_db
def test_a_logged_error_shows_as_its_one_line_never_as_a_traceback(personas, ready, web):
    """The exploratory test: a failing check's log line showed Celery's whole traceback on
    the run's page."""
    import logging

    from backfill_portal.core.logging import log_context
    from tests.execution.test_pipeline import approved_request

    approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain()
    run = Run.objects.first()
    with log_context(run_id=run.run_id, request_id=run.request_id):
        try:
            raise ValueError("could not convert string to float: 'abc'")
        except ValueError:
            logging.getLogger("backfill_portal.execution").exception("verification could not run")
    html = web("oscar").get(reverse("run-detail", args=[run.run_id])).content.decode()
    log = section(html, "log-h")
    assert "verification could not run" in log and "ValueError: could not convert string to float" in log
    assert "Traceback" not in html and "File &quot;" not in html
