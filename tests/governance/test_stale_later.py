"""Forward staleness: republishing a partition of a depends_on_past dataset makes its
later published partitions stale. The preview names them, the frozen plan rebuilds them
strictly in order after it on the new inputs, and an explicit exclusion leaves them out
and is audited. Run through the real pipeline (tasks executed by Celery's `apply`)."""
from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
import yaml

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus, StepKind
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval
from backfill_portal.backfills.services.requests import (
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.catalog.services.sync import catalog_sync
from backfill_portal.core.errors import ValidationError
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Run
from backfill_portal.web.demo.sources import correct_source_day
from backfill_portal.warehouse.models import Consumption
from tests.conftest import TEST_CATALOG

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02", "2022-10-03", "2022-10-04", "2022-10-05"]
LATER = DAYS[2:]

def catalog_text() -> str:
    """TEST_CATALOG plus `running_totals` (GMV to date per category: the previous
    partition plus the day, so it depends on its own past) and `totals_snapshot`, a
    plain job that reads it."""
    doc = yaml.safe_load(TEST_CATALOG)
    doc["datasets"].append({
        "name": "running_totals", "owner": "rita", "team": "finance", "timezone": "Asia/Shanghai", "grain": "day",
        "business_key": ["category"], "core_measure": "gmv_to_date",
        "columns": [{"name": "category", "type": "text"}, {"name": "gmv_to_date", "type": "numeric"}]})
    doc["datasets"].append({
        "name": "totals_snapshot", "owner": "sam", "team": "analytics", "timezone": "Asia/Shanghai", "grain": "day",
        "business_key": ["ds"], "core_measure": "gmv_to_date",
        "columns": [{"name": "ds", "type": "text"}, {"name": "gmv_to_date", "type": "numeric"}]})
    doc["jobs"].append({
        "name": "running_totals", "produces": "running_totals", "reads": ["dws_sales_daily"], "kind": "sql",
        "pool": "warehouse", "depends_on_past": True, "max_concurrent_runs": 1,
        "sql": "SELECT u.category AS category, ROUND(CAST(SUM(u.gmv) AS NUMERIC), 2) AS gmv_to_date FROM (\n"
               "  SELECT p.category AS category, p.gmv_to_date AS gmv FROM {{ ref_previous() }} AS p\n"
               "  UNION ALL\n"
               "  SELECT s.category AS category, s.gmv AS gmv FROM {{ ref('dws_sales_daily') }} AS s\n"
               ") AS u GROUP BY u.category\n"})
    doc["jobs"].append({
        "name": "totals_snapshot", "produces": "totals_snapshot", "reads": ["running_totals"], "kind": "sql",
        "pool": "warehouse",
        "sql": "SELECT {{ partition_key }} AS ds, ROUND(CAST(SUM(t.gmv_to_date) AS NUMERIC), 2) AS gmv_to_date "
               "FROM {{ ref('running_totals') }} AS t"})
    return yaml.safe_dump(doc, sort_keys=False)


def deploy() -> None:
    catalog_sync(text=catalog_text())


def run_to_end(personas, queue, *, job: str, start: str, end: str, requester: str = "alice", **kwargs) -> BackfillRequest:
    """File, submit, have every approver decide once (an owner of two datasets has two
    steps and decides both at once), and run the request to its end."""
    request, _ = backfill_request_create(actor=personas[requester], job=job, start=start, end=end,
                                         reason="late order events", **kwargs)
    backfill_request_submit(actor=personas[requester], request_id=request.pk, confirm_overlap=True)
    while step := request.approval_steps.filter(status="pending").select_related("approver").first():
        backfill_request_decide(actor=step.approver or personas["admin"], request_id=request.pk, approve=True)
    queue.drain()
    request.refresh_from_db()
    return request


def gmv(warehouse, dataset: str, day: str, column: str = "gmv") -> dict[str, Decimal]:
    return {r["category"]: Decimal(str(r[column])).quantize(Decimal("0.01"))
            for r in warehouse.read_partition(dataset, day)}


def expected_totals(warehouse) -> dict[str, dict[str, Decimal]]:
    """GMV to date per category, computed from what dws_sales_daily serves now."""
    out, running = {}, {}
    for day in DAYS:
        for category, value in gmv(warehouse, "dws_sales_daily", day).items():
            running[category] = running.get(category, Decimal("0")) + value
        out[day] = dict(running)
    return out


def current_run(warehouse, dataset: str, day: str) -> str:
    return warehouse.current(dataset, day)


@pytest.fixture
def history(personas, catalog, demo_sources, task_queue, warehouse):
    """Five days published everywhere; then late corrections land for 2022-10-02 and
    dwd_order_items and dws_sales_daily 10-02 alone are republished (no cascade). So
    running_totals 10-02 and every partition after it still carry the old 10-02."""
    deploy()
    for job in ("dwd_order_items", "dws_sales_daily", "running_totals", "totals_snapshot"):
        assert run_to_end(personas, task_queue, job=job, start=DAYS[0], end=DAYS[-1]).status == RequestStatus.RECONCILING
    assert correct_source_day(warehouse, day=date(2022, 10, 2), factor_category="apparel", seed=13) > 0
    for job in ("dwd_order_items", "dws_sales_daily"):
        assert run_to_end(personas, task_queue, job=job, start=DAYS[1], end=DAYS[1]).status == RequestStatus.RECONCILING
    old = {day: current_run(warehouse, "running_totals", day) for day in DAYS}
    assert gmv(warehouse, "running_totals", DAYS[-1], "gmv_to_date") != expected_totals(warehouse)[DAYS[-1]]
    return old


def intervals_of(request, job: str) -> list[tuple[str, str]]:
    return list(Interval.objects.filter(request=request, job__name=job).order_by("position")
                .values_list("partition_key", "note"))


def test_a_plain_request_on_a_depends_on_past_dataset_rebuilds_its_later_partitions_in_order(
        personas, task_queue, warehouse, history, api):
    response = api("alice").post("/api/requests/", {"job": "running_totals", "start": DAYS[1], "end": DAYS[1],
                                                    "reason": "dws 10-02 was repaired"}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    # The create response (the draft is the preview) names the stale partitions.
    assert body["stale"] == {"running_totals": {"after": DAYS[1], "included": LATER, "excluded": []}}
    assert [(i["partition_key"], i["note"].startswith("stale:")) for i in body["intervals"]] == [
        (DAYS[1], False), *((d, True) for d in LATER)]
    assert (body["first_partition"], body["last_partition"], body["interval_count"]) == (DAYS[1], DAYS[-1], 4)
    request = BackfillRequest.objects.get(pk=body["id"])
    create = AuditEvent.objects.get(request_id=request.pk, action="request.create")
    assert create.data["stale"]["running_totals"]["included"] == LATER

    assert api("alice").post(f"/api/requests/{request.pk}/submit/", {"confirm_overlap": True},
                             format="json").status_code == 200
    # The usual approval: the dataset's owner (the stale partitions are the same dataset's).
    assert {(s.kind, s.approver.username) for s in ApprovalStep.objects.filter(request=request)} == {
        (StepKind.OWNER, "rita")}
    assert api("rita").post(f"/api/requests/{request.pk}/approve/", {}, format="json").status_code == 200
    task_queue.drain()
    request.refresh_from_db()
    assert request.status == RequestStatus.RECONCILING

    runs = list(Run.objects.filter(request=request).order_by("pk"))
    assert [r.partition_key for r in runs] == DAYS[1:]  # strictly in order after 10-02
    for earlier, later in zip(runs, runs[1:]):
        assert later.created_at >= earlier.finished_at
        # Each read the version its predecessor in this request had just published.
        pin = Consumption.objects.get(run=later, dataset__name="running_totals")
        assert (pin.partition_key, pin.version.run_id) == (earlier.partition_key, earlier.pk)
    assert all(r.status == RunStatus.PUBLISHED for r in runs)
    expected = expected_totals(warehouse)
    for day in DAYS:
        assert gmv(warehouse, "running_totals", day, "gmv_to_date") == expected[day], day
    assert current_run(warehouse, "running_totals", DAYS[0]) == history[DAYS[0]]  # before P: untouched
    # Their numbers moved with 10-02: reconciliation labels each as recomputed, and one
    # that moved beyond the measure tolerance (0.1%) wants an explanation before sign-off.
    rows = {r["partition_key"]: r for r in api("alice").get(f"/api/requests/{request.pk}/reconciliation/").json()["rows"]}
    assert all(rows[day]["recomputed"] for day in DAYS[1:])
    assert rows[DAYS[2]]["status"] == "unexplained"
    assert any(d.startswith("recomputed against") for d in rows[DAYS[2]]["deviations"])


def test_a_cascade_includes_the_stale_partitions_of_a_depends_on_past_node_and_what_reads_them(
        personas, task_queue, warehouse, history):
    request, _ = backfill_request_create(actor=personas["alice"], job="dws_sales_daily", start=DAYS[1], end=DAYS[1],
                                         reason="late corrections for 10-02", cascade="cascade", strategy="backward")
    assert [k for k, _ in intervals_of(request, "dws_sales_daily")] == [DAYS[1]]
    assert [(k, n.startswith("stale:")) for k, n in intervals_of(request, "running_totals")] == [
        (DAYS[1], False), *((d, True) for d in LATER)]
    # The node below the depends_on_past one follows its longer span.
    assert [k for k, _ in intervals_of(request, "totals_snapshot")] == DAYS[1:]
    assert request.stale == {"running_totals": {"after": DAYS[1], "included": LATER, "excluded": []}}

    request = run_to_end(personas, task_queue, job="dws_sales_daily", start=DAYS[1], end=DAYS[1],
                         requester="alice", cascade="cascade", strategy="backward")
    assert request.status == RequestStatus.RECONCILING
    totals = list(Run.objects.filter(request=request, job__name="running_totals").order_by("pk"))
    assert [r.partition_key for r in totals] == DAYS[1:]  # oldest first although the strategy is backward
    expected = expected_totals(warehouse)
    for day in DAYS:
        assert gmv(warehouse, "running_totals", day, "gmv_to_date") == expected[day], day
    for day in DAYS[1:]:
        snapshot = warehouse.read_partition("totals_snapshot", day)
        assert Decimal(str(snapshot[0]["gmv_to_date"])).quantize(Decimal("0.01")) == sum(expected[day].values())


def test_an_explicit_exclusion_leaves_those_partitions_as_they_are_and_is_audited(
        personas, task_queue, warehouse, history):
    request = run_to_end(personas, task_queue, job="running_totals", start=DAYS[1], end=DAYS[1], exclude_stale={"running_totals": [DAYS[-1]]})
    assert request.status == RequestStatus.RECONCILING
    assert [r.partition_key for r in Run.objects.filter(request=request).order_by("pk")] == DAYS[1:-1]
    assert current_run(warehouse, "running_totals", DAYS[-1]) == history[DAYS[-1]]
    expected = expected_totals(warehouse)
    assert gmv(warehouse, "running_totals", DAYS[-2], "gmv_to_date") == expected[DAYS[-2]]
    assert gmv(warehouse, "running_totals", DAYS[-1], "gmv_to_date") != expected[DAYS[-1]]
    recorded = {"running_totals": {"after": DAYS[1], "included": LATER[:-1], "excluded": [DAYS[-1]]}}
    assert request.stale == recorded
    # The partition left out is marked stale where readers look (the exploratory test
    # found such partitions, left by a cancel, unmarked everywhere).
    from django.test import Client

    client = Client()
    client.force_login(personas["oscar"])
    listing = client.get("/datasets/running_totals/").content.decode()
    assert listing.count("stale: built on a replaced") == 1 and f"built on a replaced {DAYS[-2]}" in listing
    page = client.get(f"/datasets/running_totals/partitions/{DAYS[-1]}/").content.decode()
    assert 'id="stale-past"' in page and history[DAYS[-1]] in page
    assert 'id="stale-past"' not in client.get(f"/datasets/running_totals/partitions/{DAYS[-2]}/").content.decode()
    for action in ("request.create", "request.submit"):
        event = AuditEvent.objects.get(request_id=request.pk, action=action)
        assert (event.actor_name, event.data["stale"]) == ("alice", recorded)


def test_the_partitions_after_a_stale_one_are_marked_stale_through_it_until_rebuilt_from_there(
        personas, task_queue, warehouse, history):
    """The exploratory test: only the first partition left out was marked; the ones after
    it read it as readers still see it, so they looked current, yet their totals descend
    from the replaced past just the same."""
    request = run_to_end(personas, task_queue, job="running_totals", start=DAYS[1], end=DAYS[1],
                         exclude_stale={"running_totals": DAYS[-2:]})
    assert request.status == RequestStatus.RECONCILING
    expected = expected_totals(warehouse)
    assert gmv(warehouse, "running_totals", DAYS[-1], "gmv_to_date") != expected[DAYS[-1]]
    from django.test import Client

    client = Client()
    client.force_login(personas["oscar"])
    listing = client.get("/datasets/running_totals/").content.decode()
    assert listing.count(f"stale: built on a replaced {DAYS[-3]}") == 1
    assert listing.count(f"stale: built on a stale {DAYS[-2]}") == 1
    page = client.get(f"/datasets/running_totals/partitions/{DAYS[-1]}/").content.decode()
    assert 'id="stale-past"' in page and "and its past is stale" in page and f"from {DAYS[-2]} rebuilds" in page
    for fresh in DAYS[:-2]:
        assert 'id="stale-past"' not in client.get(f"/datasets/running_totals/partitions/{fresh}/").content.decode()
    # Rebuilt from the stale one on: nothing is marked any more.
    run_to_end(personas, task_queue, job="running_totals", start=DAYS[-2], end=DAYS[-2])
    assert gmv(warehouse, "running_totals", DAYS[-1], "gmv_to_date") == expected_totals(warehouse)[DAYS[-1]]
    assert "stale: built on" not in client.get("/datasets/running_totals/").content.decode()


def test_excluding_a_partition_that_is_not_stale_is_refused_with_the_field_named(
        personas, task_queue, warehouse, history, api):
    before = (BackfillRequest.objects.count(), AuditEvent.objects.count())
    cases = [
        {"job": "running_totals", "exclude_stale": {"running_totals": ["2022-10-09"]}},  # never published
        {"job": "running_totals", "exclude_stale": {"running_totals": [DAYS[1]]}},  # republished, not stale
        {"job": "running_totals", "exclude_stale": {"running_totals": ["10/05/2022"]}},
        {"job": "dws_sales_daily", "exclude_stale": {"dws_sales_daily": [DAYS[2]]}},  # not depends_on_past
        {"job": "dws_sales_daily", "exclude_stale": {"running_totals": [DAYS[2]]}},  # not in a cascade-less plan
        {"job": "running_totals", "exclude_stale": {"running_totals": "2022-10-05"}},  # not a list
    ]
    for case in cases:
        response = api("alice").post("/api/requests/", {"start": DAYS[1], "end": DAYS[1], "reason": "fix", **case},
                                     format="json")
        assert response.status_code == 400, (case, response.json())
        assert "exclude_stale" in response.json()["errors"], (case, response.json())
    assert (BackfillRequest.objects.count(), AuditEvent.objects.count()) == before
    with pytest.raises(ValidationError) as err:  # the service itself, for callers other than the API
        backfill_request_create(actor=personas["alice"], job="running_totals", start=DAYS[1], end=DAYS[1],
                                reason="fix", exclude_stale={"running_totals": [DAYS[0]]})
    assert "2022-10-01" in err.value.fields["exclude_stale"][0]


def test_a_later_partition_published_after_the_draft_was_made_refuses_the_submission(
        personas, task_queue, warehouse, history, api):
    draft = api("alice").post("/api/requests/", {"job": "running_totals", "start": DAYS[1], "end": DAYS[1],
                                                 "reason": "dws 10-02 was repaired"}, format="json").json()
    assert draft["stale"]["running_totals"]["included"] == LATER
    # Meanwhile 2022-10-06 is published: it read 10-05, which the draft rebuilds.
    assert run_to_end(personas, task_queue, job="running_totals", start="2022-10-06",
                      end="2022-10-06").status == RequestStatus.RECONCILING
    before = AuditEvent.objects.count()
    refused = api("alice").post(f"/api/requests/{draft['id']}/submit/", {"confirm_overlap": True}, format="json")
    assert refused.status_code == 409 and "stale" in refused.json()["errors"], refused.json()
    assert "running_totals 2022-10-06" in refused.json()["detail"]
    assert BackfillRequest.objects.get(pk=draft["id"]).status == RequestStatus.DRAFT
    assert AuditEvent.objects.count() == before
    # Filed again, the new plan includes it; nothing published since, so it submits.
    again = api("alice").post("/api/requests/", {"job": "running_totals", "start": DAYS[1], "end": DAYS[1],
                                                 "reason": "dws 10-02 was repaired"}, format="json").json()
    assert again["stale"]["running_totals"]["included"] == [*LATER, "2022-10-06"]
    assert api("alice").post(f"/api/requests/{again['id']}/submit/", {"confirm_overlap": True},
                             format="json").status_code == 200
    # A depends_on_past target with nothing stale is checked too (its entry says so).
    latest = api("alice").post("/api/requests/", {"job": "running_totals", "start": "2022-10-06", "end": "2022-10-06",
                                                  "reason": "recheck"}, format="json").json()
    assert latest["stale"] == {"running_totals": {"after": "2022-10-06", "included": [], "excluded": []}}


def test_the_api_preview_lists_the_stale_partitions_and_writes_nothing(personas, task_queue, warehouse, history, api):
    before = (BackfillRequest.objects.count(), AuditEvent.objects.count())
    body = {"job": "dws_sales_daily", "start": DAYS[1], "end": DAYS[1], "cascade": "cascade"}
    response = api("alice").post("/api/requests/preview/", body, format="json")
    assert response.status_code == 200, response.json()
    plan = response.json()
    assert plan["stale"] == [{"job": "running_totals", "after": DAYS[1], "included": LATER, "excluded": []}]
    nodes = {n["job"]: n for n in plan["downstream"]}
    assert (nodes["running_totals"]["intervals"], nodes["totals_snapshot"]["intervals"]) == (4, 4)
    assert {(s["kind"], s["dataset"], s["approver"]) for s in plan["approval_steps"]} == {
        ("owner", "dws_sales_daily", "sam"), ("downstream", "running_totals", "rita"),
        ("downstream", "monthly_summary", "rita"), ("downstream", "totals_snapshot", "sam")}
    excluded = api("alice").post("/api/requests/preview/", {**body, "exclude_stale": {"running_totals": LATER[1:]}},
                                 format="json").json()
    assert excluded["stale"] == [{"job": "running_totals", "after": DAYS[1], "included": LATER[:1],
                                  "excluded": LATER[1:]}]
    # What reads running_totals follows the shorter span: 10-02 and 10-03.
    assert {n["job"]: n["intervals"] for n in excluded["downstream"]}["totals_snapshot"] == 2
    for bad, field in (({"exclude_stale": {"running_totals": ["2022-10-09"]}}, "exclude_stale"),
                       ({"job": "nope"}, "job"), ({"start": "10/02"}, "start"),
                       ({"side_effects": ["dws_sales_daily"]}, "side_effects")):
        refused = api("alice").post("/api/requests/preview/", {**body, **bad}, format="json")
        assert refused.status_code == 400 and field in refused.json()["errors"], (bad, refused.json())
    assert (BackfillRequest.objects.count(), AuditEvent.objects.count()) == before


def test_stale_partitions_count_towards_the_interval_limit_and_the_message_says_how_to_fit(
        personas, task_queue, warehouse, history, api, settings):
    settings.BACKFILL_MAX_INTERVALS = 3
    body = {"job": "running_totals", "start": DAYS[1], "end": DAYS[1], "reason": "fix"}
    refused = api("alice").post("/api/requests/", body, format="json")
    assert refused.status_code == 400
    assert "3 of them stale later partitions" in refused.json()["errors"]["end"][0]
    assert "exclude_stale" in refused.json()["errors"]["end"][0]
    fits = api("alice").post("/api/requests/", {**body, "exclude_stale": {"running_totals": [DAYS[-1]]}},
                             format="json")
    assert fits.status_code == 201 and fits.json()["interval_count"] == 3


def test_the_form_preview_lists_the_stale_partitions_and_a_ticked_box_excludes_one(
        personas, task_queue, warehouse, history):
    from django.test import Client

    client = Client()
    client.force_login(personas["alice"])
    form = {"job": "dws_sales_daily", "start": DAYS[1], "end": DAYS[1], "reason": "doubling fixed",
            "cascade": "cascade", "strategy": "forward", "max_active_intervals": "4"}
    html = client.post("/requests/preview/", form).content.decode()
    assert 'data-testid="stale-later"' in html and "running_totals" in html
    for day in LATER:
        assert f'name="exclude_stale" value="running_totals|{day}" form="request-form"' in html
    ticked = client.post("/requests/preview/", {**form, "exclude_stale": f"running_totals|{DAYS[-1]}"}).content.decode()
    assert f'value="running_totals|{DAYS[-1]}" form="request-form" checked' in ticked
    bad = client.post("/requests/preview/", {**form, "exclude_stale": "running_totals|2022-10-09"}).content.decode()
    assert "not a stale partition of this plan" in bad

    response = client.post("/requests/new/", {**form, "action": "create", "exclude_stale": f"running_totals|{DAYS[-1]}"})
    assert response.status_code == 302
    request = BackfillRequest.objects.get(job__name="dws_sales_daily", status="draft")
    assert [k for k, _ in intervals_of(request, "running_totals")] == DAYS[1:-1]
    assert request.stale["running_totals"]["excluded"] == [DAYS[-1]]
    page = client.get(response["Location"]).content.decode()
    assert "left out by the requester" in page and DAYS[-1] in page

    refused = client.post("/requests/new/", {**form, "action": "create", "exclude_stale": "running_totals"})
    assert refused.status_code == 200 and "is not a job|partition pair" in refused.content.decode()
    refused = client.post("/requests/new/", {**form, "action": "create", "exclude_stale": "running_totals|2022-10-09"})
    assert refused.status_code == 200 and "not a stale partition of this plan" in refused.content.decode()
    assert BackfillRequest.objects.filter(job__name="dws_sales_daily", status="draft").count() == 1
    assert not Interval.objects.filter(request__job__name="dws_sales_daily", status=IntervalStatus.QUEUED).exists()


def test_a_depends_on_past_partition_after_a_gap_is_refused_naming_where_to_start(
        personas, task_queue, warehouse, history, api):
    """The exploratory tests: a request (or a cascade) built a running total whose
    previous partition had never been published: it read it as empty and published one
    day's sum as the total to date, matched by every check; once refused at run time,
    upstream layers and side effects had already been published. The plan refuses it,
    naming the first missing partition (not merely the previous one, itself missing)."""
    gap, after = "2022-10-06", "2022-10-08"
    for job in ("dwd_order_items", "dws_sales_daily"):
        assert run_to_end(personas, task_queue, job=job, start=gap, end=after).status == RequestStatus.RECONCILING
    body = {"job": "running_totals", "start": after, "end": after, "reason": "late rows"}
    response = api("alice").post("/api/requests/", body, format="json")
    assert response.status_code == 400
    (message,) = response.json()["errors"]["start"]
    assert message == ("running_totals 2022-10-08 depends on its previous partition 2022-10-07, which was never "
                       f"published (the latest before it is {DAYS[-1]}): start running_totals from {gap}, or it "
                       "would start from nothing")
    # A cascade that would rebuild it is refused the same way, before anything upstream runs.
    response = api("alice").post("/api/requests/", {**body, "job": "dws_sales_daily", "cascade": "cascade"},
                                 format="json")
    assert response.status_code == 400 and "start running_totals from 2022-10-06" in response.json()["errors"][
        "cascade"][0]
    assert not BackfillRequest.objects.filter(job__name__in=["running_totals", "dws_sales_daily"],
                                              first_partition=after).exists()
    # From the first missing partition it is planned, and the total carries on.
    request = run_to_end(personas, task_queue, job="running_totals", start=gap, end=after)
    assert request.status == RequestStatus.RECONCILING
    day_before = gmv(warehouse, "running_totals", DAYS[-1], "gmv_to_date")
    totals = gmv(warehouse, "running_totals", after, "gmv_to_date")
    assert all(totals[c] >= day_before[c] for c in day_before)


def test_a_gap_that_appears_after_filing_fails_the_attempt_naming_where_to_start(personas, catalog, demo_sources,
                                                                                 task_queue, warehouse):
    """The run-time gap guard: filed while running_totals had nothing published (where a
    dataset begins there is no gap), 10-04..10-05 is accepted; then 10-01..10-02 is
    published by another request. 10-04 would now start from nothing in the middle of
    the history (10-03 never published): the attempt fails naming 10-03, and nothing
    is published for it."""
    deploy()
    for job in ("dwd_order_items", "dws_sales_daily"):
        run_to_end(personas, task_queue, job=job, start=DAYS[0], end=DAYS[-1])
    later, _ = backfill_request_create(actor=personas["alice"], job="running_totals", start=DAYS[3], end=DAYS[4],
                                       reason="late order events")  # accepted: nothing published yet
    assert run_to_end(personas, task_queue, job="running_totals", start=DAYS[0], end=DAYS[1]).status == \
        RequestStatus.RECONCILING
    backfill_request_submit(actor=personas["alice"], request_id=later.pk, confirm_overlap=True)
    while step := later.approval_steps.filter(status="pending").select_related("approver").first():
        backfill_request_decide(actor=step.approver or personas["admin"], request_id=later.pk, approve=True)
    task_queue.drain()
    run = Run.objects.filter(request=later, partition_key=DAYS[3]).order_by("id").first()
    assert run.status == RunStatus.FAILED
    assert (f"running_totals {DAYS[3]} depends on its previous partition {DAYS[2]}, which was never published "
            f"(the latest before it is {DAYS[1]}): start running_totals from {DAYS[2]}") in run.error
    assert warehouse.current("running_totals", DAYS[3]) is None
