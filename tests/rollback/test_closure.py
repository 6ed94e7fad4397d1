"""Rollback at every depth: the impact is the contaminated closure (transitively through
consumption, including the later partitions of a depends_on_past dataset), every entry
is marked until rebuilt, the requests that published them show them unexplained, and
ONE request, filed once however often it is asked for, rebuilds all of it in layer
order back to the numbers from before the incident."""
from __future__ import annotations

import pytest

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, Interval, Reconciliation
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.warehouse.models import Contamination
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02", "2022-10-03", "2022-10-04"]
BAD_DAY = "2022-10-02"
LAYERS = ["dws_sales_daily", "ads_gmv_report", "gmv_to_date"]
META = {"_run_id", "_partition", "_attempt"}


def content(warehouse, dataset: str, day: str) -> list[tuple]:
    """What readers see, without the version's own identity columns."""
    rows = warehouse.read_partition(dataset, day)
    return sorted(tuple(sorted((k, str(v)) for k, v in r.items() if k not in META)) for r in rows)


def gmv(warehouse, dataset: str, day: str) -> float:
    return round(sum(float(r["gmv"]) for r in warehouse.read_partition(dataset, day)), 2)


def run_of(request, job: str, day: str) -> Run:
    return Run.objects.get(request=request, job__name=job, partition_key=day, run_type=RunType.BACKFILL)


@pytest.fixture
def deep_incident(personas, ready, warehouse):
    """Four good days through three layers; then a doubled dwd 2022-10-02, a cascade
    that rebuilt dws/ads/gmv_to_date 2022-10-02 on it, and the cumulative job run on for
    the later days (reading the contaminated previous partition)."""
    deploy(deep=True)
    run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    base = run_request(personas, ready, job="dws_sales_daily", start=DAYS[0], end=DAYS[-1], approver="sam",
                       cascade="cascade", node_actions={"monthly_summary": "skip"})
    assert base.status == RequestStatus.RECONCILING, base.status
    before = {(ds, day): content(warehouse, ds, day) for ds in LAYERS for day in DAYS}
    assert all(before.values())

    deploy(dwd_sql=DOUBLED_SQL, deep=True)
    bad = run_request(personas, ready, start=BAD_DAY, end=BAD_DAY)
    deploy(deep=True)
    cascade = run_request(personas, ready, job="dws_sales_daily", start=BAD_DAY, end=BAD_DAY, approver="sam",
                          cascade="cascade", node_actions={"monthly_summary": "skip"})
    onward = run_request(personas, ready, job="gmv_to_date", start=DAYS[2], end=DAYS[3], approver="finn")
    assert (bad.status, cascade.status, onward.status) == ("reconciling",) * 3
    # The incident as the issue saw it: the report serves the GMV of the doubled items.
    assert gmv(warehouse, "ads_gmv_report", BAD_DAY) == pytest.approx(2 * before_gmv(before, BAD_DAY), abs=0.05)
    for day in DAYS[1:]:
        assert content(warehouse, "gmv_to_date", day) != before[("gmv_to_date", day)]
    return {"before": before, "bad": bad, "cascade": cascade, "onward": onward}


def before_gmv(before, day: str) -> float:
    return sum(float(dict(r)["gmv"]) for r in before[("ads_gmv_report", day)])


def test_rollback_names_the_whole_closure_and_one_rebuild_restores_the_numbers(
        personas, ready, warehouse, api, web, deep_incident):
    bad, cascade, onward = deep_incident["bad"], deep_incident["cascade"], deep_incident["onward"]
    bad_dwd = run_of(bad, "dwd_order_items", BAD_DAY)
    dws, ads = run_of(cascade, "dws_sales_daily", BAD_DAY), run_of(cascade, "ads_gmv_report", BAD_DAY)
    cum2 = run_of(cascade, "gmv_to_date", BAD_DAY)
    cum3, cum4 = run_of(onward, "gmv_to_date", DAYS[2]), run_of(onward, "gmv_to_date", DAYS[3])
    expected = [  # (dataset, day, run, depth, via run)
        ("dws_sales_daily", BAD_DAY, dws, 1, bad_dwd),
        ("ads_gmv_report", BAD_DAY, ads, 2, dws),
        ("gmv_to_date", BAD_DAY, cum2, 3, ads),
        ("gmv_to_date", DAYS[2], cum3, 4, cum2),
        ("gmv_to_date", DAYS[3], cum4, 5, cum3),
    ]

    def as_rows(impact):
        return [(e["dataset"], e["partition_key"], e["run_id"], e["depth"], e["via"]["run_id"]) for e in impact]

    want = [(ds, day, run.run_id, depth, via.run_id) for ds, day, run, depth, via in expected]

    # The confirmation page shows the whole closure before anything moves.
    page = web("oscar").get(f"/datasets/dwd_order_items/partitions/{BAD_DAY}/rollback/").content.decode()
    impact_html = page.split('id="impact-h"')[1]
    assert "5 published partitions built from it" in impact_html
    for _, _, run, _, via in expected:
        assert run.run_id in impact_html and via.run_id in impact_html

    response = api("oscar").post(f"/api/datasets/dwd_order_items/partitions/{BAD_DAY}/rollback/",
                                 {"reason": "amounts doubled"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert as_rows(body["impact"]) == want
    assert all(e["rolled_back"]["run_id"] == bad_dwd.run_id for e in body["impact"])
    assert {e["state"] for e in body["impact"]} == {"pending"}
    # The direct consumers are still listed as before: only dws read the bad version.
    assert [c["run_id"] for c in body["consumers"]] == [dws.run_id]
    assert AuditEvent.objects.get(action="rollback.contaminated").data["count"] == 5
    # The request's rollback state shows the whole closure too.
    state = api("audrey").get(f"/api/requests/{bad.pk}/rollback/").json()
    assert as_rows(state["impact"]) == want

    # Every contaminated partition says so, on its page and in the API.
    for ds, day, run, _, _ in expected:
        mark = api("audrey").get(f"/api/datasets/{ds}/partitions/{day}/").json()["contamination"]
        assert (mark["state"], mark["run_id"]) == ("pending", run.run_id), (ds, day)
        assert mark["message"] == "built from a rolled-back input: rebuild pending"
        html = web("audrey").get(f"/datasets/{ds}/partitions/{day}/").content.decode()
        assert "Built from a rolled-back input: rebuild pending" in html
        assert '<span class="pill pill-published">published</span>' not in html.split("</h1>")[0]
    clean = api("audrey").get(f"/api/datasets/gmv_to_date/partitions/{DAYS[0]}/").json()
    assert clean["contamination"] is None

    # The requests that published them cannot be signed off: those intervals are unexplained.
    for request, keys in ((cascade, {("dws_sales_daily", BAD_DAY), ("ads_gmv_report", BAD_DAY),
                                     ("gmv_to_date", BAD_DAY)}),
                          (onward, {("gmv_to_date", DAYS[2]), ("gmv_to_date", DAYS[3])})):
        rows = api("audrey").get(f"/api/requests/{request.pk}/reconciliation/").json()["rows"]
        marked = {(r["dataset"], r["partition_key"]) for r in rows
                  if r["status"] == "unexplained"
                  and any(d.startswith("built from a rolled-back input: rebuild pending") and bad_dwd.run_id in d
                          for d in r["deviations"])}
        assert marked == keys, request.pk

    # One rebuild, however often (and by whomever) it is asked for.
    rebuild_url = body["rebuild"]
    first = api("oscar").post(rebuild_url)
    assert first.status_code == 201, first.json()
    (child_id,) = first.json()["requests"]
    for again in (api("oscar").post(rebuild_url), api("olivia").post(rebuild_url)):
        assert (again.status_code, again.json()["requests"]) == (200, [child_id])  # nothing new filed
    again = api("oscar").post(f"/api/requests/{bad.pk}/rollback/rebuild/")
    assert (again.status_code, again.json()[0]["id"]) == (200, child_id)
    assert BackfillRequest.objects.filter(parent=bad).count() == 1
    child = BackfillRequest.objects.get(pk=child_id)
    assert child.status == RequestStatus.PENDING_APPROVAL and child.job.name == "dws_sales_daily"
    planned = sorted(Interval.objects.filter(request=child).values_list("job__name", "partition_key"))
    assert planned == sorted((ds, day) for ds, day, *_ in expected)
    # The usual approval steps: each owner of a rebuilt dataset.
    assert sorted(ApprovalStep.objects.filter(request=child).values_list("kind", "approver__username")) == [
        ("downstream", "finn"), ("downstream", "rita"), ("owner", "sam")]
    marks = api("audrey").get(f"/api/datasets/ads_gmv_report/partitions/{BAD_DAY}/").json()["contamination"]
    assert marks["rebuild_request"] == child_id and marks["state"] == "pending"

    for approver in ("sam", "rita", "finn"):
        assert api(approver).post(f"/api/requests/{child_id}/approve/", {}, format="json").status_code == 200
    ready.drain()
    child.refresh_from_db()
    assert child.status == RequestStatus.RECONCILING, child.status

    # Layer order on the restored inputs: each rebuilt run read what the one above it published.
    rebuilt = {(r.job.name, r.partition_key): r for r in Run.objects.filter(request=child, run_type=RunType.BACKFILL)
               .select_related("job")}
    assert {k: r.status for k, r in rebuilt.items()} == {(ds, day): RunStatus.PUBLISHED for ds, day, *_ in expected}
    reads = {(ds, day): {(c.dataset.name, c.partition_key): c.version.run.run_id
                         for c in run.consumptions.select_related("dataset", "version__run")}
             for (ds, day), run in rebuilt.items()}
    assert reads[("dws_sales_daily", BAD_DAY)][("dwd_order_items", BAD_DAY)] == warehouse.current(
        "dwd_order_items", BAD_DAY) != bad_dwd.run_id
    assert reads[("ads_gmv_report", BAD_DAY)][("dws_sales_daily", BAD_DAY)] == rebuilt[
        ("dws_sales_daily", BAD_DAY)].run_id
    assert reads[("gmv_to_date", DAYS[2])][("gmv_to_date", BAD_DAY)] == rebuilt[("gmv_to_date", BAD_DAY)].run_id
    assert reads[("gmv_to_date", DAYS[3])][("gmv_to_date", DAYS[2])] == rebuilt[("gmv_to_date", DAYS[2])].run_id

    # The numbers equal the ones from before the incident, in every layer and day.
    before = deep_incident["before"]
    for ds in LAYERS:
        for day in DAYS:
            assert content(warehouse, ds, day) == before[(ds, day)], (ds, day)

    # The marks say who rebuilt them.
    for ds, day, *_ in expected:
        mark = api("audrey").get(f"/api/datasets/{ds}/partitions/{day}/").json()["contamination"]
        assert (mark["state"], mark["rebuilt_by"]) == ("rebuilt", child_id), (ds, day)
        assert mark["message"] == f"built from a rolled-back input: rebuilt by #{child_id}"
        assert f"Built from a rolled-back input: rebuilt by #{child_id}" in web("audrey").get(
            f"/datasets/{ds}/partitions/{day}/").content.decode()
    assert {e["state"] for e in api("audrey").get(f"/api/requests/{bad.pk}/rollback/").json()["impact"]} == {
        "rebuilt"}
    # Asking for the rebuild again still files nothing.
    assert api("oscar").post(rebuild_url).json()["requests"] == [child_id]
    assert BackfillRequest.objects.count() == 6


def test_a_completed_request_whose_input_is_rolled_back_is_reopened_unexplained(personas, ready, warehouse, api):
    deploy(deep=True)
    run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    deploy(dwd_sql=DOUBLED_SQL, deep=True)
    bad = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    deploy(deep=True)
    dws = run_request(personas, ready, job="dws_sales_daily", start=DAYS[0], end=DAYS[0], approver="sam")
    recon = api("sam").get(f"/api/requests/{dws.pk}/reconciliation/").json()
    for row in recon["rows"]:
        if row["status"] == "unexplained":
            assert api("alice").post(f"/api/requests/{dws.pk}/intervals/{row['partition_key']}/explain/",
                                     {"explanation": "upstream changed on purpose"}, format="json").status_code == 200
    assert api("sam").post(f"/api/requests/{dws.pk}/signoff/", {"comment": "ok"}, format="json").status_code == 200
    dws.refresh_from_db()
    assert dws.status == RequestStatus.COMPLETED

    response = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "amounts doubled"}, format="json")
    assert response.status_code == 200, response.json()
    dws.refresh_from_db()
    assert (dws.status, dws.finished_at) == (RequestStatus.RECONCILING, None)
    event = AuditEvent.objects.get(action="request.reopen", request_id=dws.pk)
    assert (event.from_state, event.to_state, event.actor_name) == ("completed", "reconciling", "oscar")
    assert event.data["signed_off"]["by"] == "sam" and "amounts doubled" in event.reason
    assert Reconciliation.objects.get(request=dws).signed_off_at is None
    ready.drain()
    recon = api("sam").get(f"/api/requests/{dws.pk}/reconciliation/").json()
    (row,) = recon["rows"]
    assert row["status"] == "unexplained"  # the explanation written before the rollback explained something else
    assert any("built from a rolled-back input" in d and "amounts doubled" in d for d in row["deviations"])
    refused = api("sam").post(f"/api/requests/{dws.pk}/signoff/", {"comment": "ok"}, format="json")
    assert refused.status_code == 409 and DAYS[0] in refused.json()["detail"]
    # Explained after the rollback, it can be signed off again.
    assert api("alice").post(f"/api/requests/{dws.pk}/intervals/{DAYS[0]}/explain/",
                             {"explanation": "superseded by the rebuild"}, format="json").json()["status"] == "explained"
    assert api("sam").post(f"/api/requests/{dws.pk}/signoff/", {"comment": "ok"}, format="json").status_code == 200


def test_rebuild_of_a_closure_that_is_gone_is_a_clear_409(personas, ready, warehouse, api):
    deploy(deep=True)
    run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    second = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    # Nobody read the second version: the rollback contaminates nothing.
    response = api("oscar").post(f"/api/datasets/dwd_order_items/partitions/{DAYS[0]}/rollback/",
                                 {"reason": "wrong"}, format="json")
    assert response.status_code == 200 and response.json()["impact"] == []
    refused = api("oscar").post(response.json()["rebuild"])
    assert refused.status_code == 409 and "consumers" in refused.json()["errors"]
    assert not BackfillRequest.objects.filter(parent=second).exists()
    assert not Contamination.objects.exists()
    # Not allowed: 403, audited, nothing filed.
    assert api("alice").post(response.json()["rebuild"]).status_code == 403
    assert AuditEvent.objects.filter(action="denied.rollback.rebuild", actor_name="alice").exists()


def test_a_run_that_read_a_rolled_back_or_contaminated_input_is_not_published(personas, ready, warehouse, api):
    from backfill_portal.execution.models import CheckResult
    from tests.execution.test_pipeline import approved_request

    deploy(deep=True)
    run_request(personas, ready, start=DAYS[0], end=DAYS[1])
    deploy(dwd_sql=DOUBLED_SQL, deep=True)
    bad = run_request(personas, ready, start=DAYS[0], end=DAYS[1])
    deploy(deep=True)
    bad_runs = {d: run_of(bad, "dwd_order_items", d) for d in DAYS[:2]}
    # dws 2022-10-02 is published from the bad version; dws 2022-10-01 pinned it and waits for verification.
    published = run_request(personas, ready, job="dws_sales_daily", start=DAYS[1], end=DAYS[1], approver="sam")
    in_flight = approved_request(personas, job="dws_sales_daily", start=DAYS[0], end=DAYS[0], approver="sam")
    ready.drain_to_staged()
    staged = Run.objects.get(request=in_flight)
    assert staged.status == RunStatus.STAGED
    assert api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "doubled"},
                             format="json").status_code == 200

    # 1. Pinned before the rollback, verified after it: refused, nothing becomes visible.
    ready.drain()
    staged.refresh_from_db()
    assert staged.status == RunStatus.VERIFICATION_FAILED
    check = CheckResult.objects.get(run=staged, name="inputs_not_rolled_back")
    assert not check.passed and check.blocking
    assert f"dwd_order_items/{DAYS[0]} {bad_runs[DAYS[0]].run_id} (rolled back)" in check.message
    assert warehouse.current("dws_sales_daily", DAYS[0]) is None

    # 2. Reading a partition still waiting for its rebuild: refused too.
    contaminated = run_of(published, "dws_sales_daily", DAYS[1])
    ads = run_request(personas, ready, job="ads_gmv_report", start=DAYS[1], end=DAYS[1], approver="rita")
    run = run_of(ads, "ads_gmv_report", DAYS[1])
    assert run.status == RunStatus.VERIFICATION_FAILED
    message = CheckResult.objects.get(run=run, name="inputs_not_rolled_back").message
    assert f"dws_sales_daily/{DAYS[1]} {contaminated.run_id} (built from a rolled-back input)" in message
    assert warehouse.current("ads_gmv_report", DAYS[1]) is None
    # What is clean still publishes: ads on a day nothing bad reached.
    clean = run_request(personas, ready, job="ads_gmv_report", start=DAYS[2], end=DAYS[2], approver="rita")
    assert run_of(clean, "ads_gmv_report", DAYS[2]).status == RunStatus.PUBLISHED
