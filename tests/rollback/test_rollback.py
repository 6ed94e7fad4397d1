"""Rollback: an audited, compare-and-set pointer move back to the previous verified
version, with the consumers that read the bad version and a one-click rebuild."""
from __future__ import annotations

import pytest
from django.db import connection

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.verify import run_verify
from backfill_portal.warehouse.models import Consumption, Publication, Version
from backfill_portal.recovery import rollback as rollback_service
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request

pytestmark = pytest.mark.django_db(transaction=True)
DAYS = ["2022-10-01", "2022-10-02"]


def runs_by_day(request) -> dict[str, Run]:
    return {r.partition_key: r for r in Run.objects.filter(request=request, run_type=RunType.BACKFILL)}


@pytest.fixture
def incident(personas, ready):
    """A good version of two days, a doubled one over it, and dws built on the doubled one."""
    good = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy(dwd_sql=DOUBLED_SQL)
    bad = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy()
    dws = run_request(personas, ready, job="dws_sales_daily", start=DAYS[0], end=DAYS[-1], approver="sam")
    assert (good.status, bad.status, dws.status) == ("reconciling",) * 3
    return good, bad, dws


def test_request_rollback_restores_every_partition_lists_the_consumers_and_rebuilds_them(
        personas, ready, warehouse, api, incident):
    good, bad, dws = incident
    good_runs, bad_runs, dws_runs = runs_by_day(good), runs_by_day(bad), runs_by_day(dws)
    response = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "amounts doubled"}, format="json")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert {(p["partition_key"], p["from_run_id"], p["to_run_id"]) for p in body["partitions"]} == {
        (d, bad_runs[d].run_id, good_runs[d].run_id) for d in DAYS}

    # Readers see the previous version again, whole.
    for day in DAYS:
        rows = warehouse.read_partition("dwd_order_items", day)
        assert {r["_run_id"] for r in rows} == {good_runs[day].run_id}
        assert len(rows) == Version.objects.get(run=good_runs[day]).row_count
    # Every consumer run that read a bad version is listed, with the dataset it produced.
    consumers = {c["run_id"]: c for c in body["consumers"]}
    assert set(consumers) == {r.run_id for r in dws_runs.values()}
    for day, run in dws_runs.items():
        assert consumers[run.run_id]["dataset"] == "dws_sales_daily"
        assert consumers[run.run_id]["read"] == [{"dataset": "dwd_order_items", "partition_key": day,
                                                  "run_id": bad_runs[day].run_id}]

    # States, history and audit rows.
    bad.refresh_from_db()
    assert bad.status == RequestStatus.ROLLED_BACK
    event = AuditEvent.objects.get(request_id=bad.pk, action="request.rollback")
    assert (event.from_state, event.to_state, event.actor_name, event.reason) == (
        "reconciling", "rolled_back", "oscar", "amounts doubled")
    for day in DAYS:
        bad_runs[day].refresh_from_db()
        good_runs[day].refresh_from_db()
        assert bad_runs[day].status == RunStatus.ROLLED_BACK
        assert good_runs[day].status == RunStatus.PUBLISHED
        assert AuditEvent.objects.filter(action="run.rolled_back", object_id=str(bad_runs[day].pk),
                                         from_state="published", actor_name="oscar").exists()
        assert AuditEvent.objects.filter(action="run.published", object_id=str(good_runs[day].pk),
                                         from_state="superseded", actor_name="oscar").exists()
        assert AuditEvent.objects.filter(action="partition.rollback", object_id=f"dwd_order_items/{day}").exists()
        pub = Publication.objects.filter(dataset__name="dwd_order_items", partition_key=day).first()
        assert (pub.action, pub.version.run, pub.previous_version.run, pub.reason) == (
            "rollback", good_runs[day], bad_runs[day], "amounts doubled")
        assert warehouse.history("dwd_order_items", day)[0].action == "rollback"
        # The rolled-back version stays for diagnosis.
        assert warehouse.marker(bad_runs[day].run_id) is not None
    assert api("audrey").get(f"/api/requests/{bad.pk}/rollback/").json()["consumers"] == body["consumers"]

    # One click files the rebuild; a second click files nothing new.
    rebuild = api("oscar").post(body["rebuild"])
    assert rebuild.status_code == 201, rebuild.json()
    (filed,) = rebuild.json()
    assert api("oscar").post(body["rebuild"]).json()[0]["id"] == filed["id"]
    child = BackfillRequest.objects.get(pk=filed["id"])
    assert (child.job.name, child.first_partition, child.last_partition) == ("dws_sales_daily", DAYS[0], DAYS[-1])
    assert child.parent_id == bad.pk and child.reason == f"rebuild after rollback of #{bad.pk}"
    assert child.status == RequestStatus.PENDING_APPROVAL
    assert AuditEvent.objects.filter(request_id=child.pk, action="request.submit", actor_name="oscar").exists()
    # Its owner approves and it rebuilds the consumers on the restored versions.
    assert api("sam").post(f"/api/requests/{child.pk}/approve/", {}, format="json").status_code == 200
    ready.drain()
    for day, run in runs_by_day(child).items():
        assert run.status == RunStatus.PUBLISHED
        assert Consumption.objects.get(run=run, dataset__name="dwd_order_items").version.run == good_runs[day]
        gmv = sum(float(r["gmv"]) for r in warehouse.read_partition("dws_sales_daily", day))
        amount = sum(float(r["amount"]) for r in warehouse.read_partition("dwd_order_items", day))
        assert gmv == pytest.approx(amount, abs=0.05)


def test_partition_rollback_restores_one_partition_and_offers_its_rebuild(personas, ready, warehouse, api, incident):
    good, bad, dws = incident
    response = api("olivia").post("/api/datasets/dwd_order_items/partitions/2022-10-02/rollback/",
                                  {"reason": "doubled"}, format="json")  # the dataset owner may
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["to_run_id"] == runs_by_day(good)["2022-10-02"].run_id
    assert [c["run_id"] for c in body["consumers"]] == [runs_by_day(dws)["2022-10-02"].run_id]
    assert warehouse.current("dwd_order_items", "2022-10-01") == runs_by_day(bad)["2022-10-01"].run_id  # untouched
    bad.refresh_from_db()
    assert bad.status == RequestStatus.RECONCILING
    # The bad run's API detail names the rollback away from it, as its page does (it
    # listed only its own publish: the auditor's QA).
    taken_run = runs_by_day(bad)["2022-10-02"].run_id
    moves = api("audrey").get(f"/api/runs/{taken_run}/").json()["publications"]
    assert [(m["action"], m["run_id"], m["previous_run_id"], m["actor"]) for m in moves][0] == (
        "rollback", runs_by_day(good)["2022-10-02"].run_id, taken_run, "olivia")
    assert [m["action"] for m in moves] == ["rollback", "publish"]
    # Its reconciliation is recomputed: the interval readers no longer see is not
    # "matched" (the exploratory test found it still was), the other one still is.
    ready.drain()
    rows = {(r["dataset"], r["partition_key"]): r
            for r in api("audrey").get(f"/api/requests/{bad.pk}/reconciliation/").json()["rows"]}
    taken = rows[("dwd_order_items", "2022-10-02")]
    assert taken["status"] == "unexplained"
    assert any(d.startswith("rolled back by olivia") and runs_by_day(good)["2022-10-02"].run_id in d
               for d in taken["deviations"])
    assert not any("rolled back" in d for d in rows[("dwd_order_items", "2022-10-01")]["deviations"])
    # Explained, it stays explained when recomputed (it became "matched": the exploratory test).
    explained = api("olivia").post(f"/api/requests/{bad.pk}/intervals/2022-10-02/explain/",
                                   {"explanation": "doubled amounts; rolled back on purpose"}, format="json")
    assert explained.status_code == 200 and explained.json()["status"] == "explained", explained.json()
    assert api("olivia").post(f"/api/requests/{bad.pk}/reconciliation/").status_code == 200
    rows = {(r["dataset"], r["partition_key"]): r
            for r in api("audrey").get(f"/api/requests/{bad.pk}/reconciliation/").json()["rows"]}
    assert rows[("dwd_order_items", "2022-10-02")]["status"] == "explained"
    filed = api("olivia").post(body["rebuild"])
    assert filed.status_code == 201
    child = BackfillRequest.objects.get(pk=filed.json()["requests"][0])
    assert (child.first_partition, child.last_partition, child.parent_id) == ("2022-10-02", "2022-10-02", bad.pk)

    # The request's own page says what was rolled back, by whom and why (the auditor's
    # QA: it said "1 rolled back", and who and why took a click to each partition).
    from django.test import Client

    client = Client()
    client.force_login(personas["audrey"])
    page = client.get(f"/requests/{bad.pk}/").content.decode()
    section = page[page.index('id="rolled-back"'):page.index("</section>", page.index('id="rolled-back"'))]
    assert "Rolled back: 1 partition this request published" in section
    assert taken_run in section and runs_by_day(good)["2022-10-02"].run_id in section
    assert "<td>olivia</td>" in section and "<td>doubled</td>" in section

    # The rest of the request can still be rolled back: only what is left moves.
    response = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "the rest"}, format="json")
    assert response.status_code == 200
    assert [p["partition_key"] for p in response.json()["partitions"]] == ["2022-10-01"]


def test_a_publish_between_reading_and_rolling_back_makes_the_rollback_a_conflict(
        personas, ready, warehouse, api, incident, monkeypatch):
    good, bad, dws = incident
    from tests.execution.test_pipeline import approved_request

    third = approved_request(personas, start="2022-10-01", end="2022-10-01")
    ready.drain_to_staged()
    racer = Run.objects.get(request=third)
    assert racer.status == RunStatus.STAGED
    race = {"racer": racer, "published": []}
    read_pointer = type(warehouse).current

    def someone_publishes_right_after_the_read(self, name, partition):
        """The rollback reads the pointer of the racer's partition; the racer's publish
        lands before the rollback moves it (once per racer)."""
        seen = read_pointer(self, name, partition)
        racer = race["racer"]
        if partition == racer.partition_key and racer.run_id not in race["published"]:
            race["published"].append(racer.run_id)
            assert run_verify(run_id=racer.run_id) == "published"
        return seen

    monkeypatch.setattr(type(warehouse), "current", someone_publishes_right_after_the_read)
    audit_before = AuditEvent.objects.filter(action__in=["partition.rollback", "request.rollback"]).count()
    response = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "doubled"}, format="json")
    assert response.status_code == 409
    assert racer.run_id in response.json()["detail"]
    # Not an overwrite: the racer's version stays current, nothing else moved either.
    assert warehouse.current("dwd_order_items", "2022-10-01") == racer.run_id
    assert warehouse.current("dwd_order_items", "2022-10-02") == runs_by_day(bad)["2022-10-02"].run_id
    assert not Publication.objects.filter(action="rollback").exists()
    assert AuditEvent.objects.filter(action__in=["partition.rollback", "request.rollback"]).count() == audit_before
    bad.refresh_from_db()
    assert bad.status == RequestStatus.RECONCILING

    assert race["published"] == [racer.run_id]

    # The same race on a single partition.
    other = approved_request(personas, start="2022-10-02", end="2022-10-02")
    ready.drain_to_staged()
    racer = race["racer"] = Run.objects.get(request=other)
    response = api("oscar").post("/api/datasets/dwd_order_items/partitions/2022-10-02/rollback/",
                                 {"reason": "doubled"}, format="json")
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert race["published"][-1] == racer.run_id
    assert warehouse.current("dwd_order_items", "2022-10-02") == racer.run_id


def test_bad_rollbacks_are_refused_clearly_and_change_nothing(personas, ready, warehouse, api):
    first = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    run = Run.objects.get(request=first)
    url = f"/api/datasets/dwd_order_items/partitions/{DAYS[0]}/rollback/"

    def unchanged():
        assert warehouse.current("dwd_order_items", DAYS[0]) == run.run_id
        assert not Publication.objects.filter(action="rollback").exists()
        assert not AuditEvent.objects.filter(action__in=["partition.rollback", "request.rollback"]).exists()

    # No previous verified version.
    response = api("oscar").post(url, {"reason": "why not"}, format="json")
    assert response.status_code == 409 and "no previous verified version" in response.json()["detail"]
    response = api("oscar").post(f"/api/requests/{first.pk}/rollback/", {"reason": "why not"}, format="json")
    assert response.status_code == 409 and "no previous verified version" in response.json()["detail"]
    unchanged()
    # No reason; no permission; a source; a partition never published.
    response = api("oscar").post(url, {"reason": "  "}, format="json")
    assert response.status_code == 400 and "reason" in response.json()["errors"]
    for name in ("alice", "audrey", "sam"):
        assert api(name).post(url, {"reason": "x"}, format="json").status_code == 403, name
    assert AuditEvent.objects.filter(action="denied.partition.rollback").count() == 3
    assert api("oscar").post("/api/datasets/ods_order_events/partitions/2022-10-01/rollback/",
                             {"reason": "x"}, format="json").status_code == 400
    assert api("oscar").post("/api/datasets/dwd_order_items/partitions/1999-01-01/rollback/",
                             {"reason": "x"}, format="json").status_code == 409
    assert api("oscar").post("/api/datasets/nope/partitions/1999-01-01/rollback/",
                             {"reason": "x"}, format="json").status_code == 404
    unchanged()
    # Nothing rolled back yet: nothing to rebuild.
    assert api("oscar").post(f"/api/requests/{first.pk}/rollback/rebuild/").status_code == 409

    # Rolling back twice.
    second = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    first_time = api("oscar").post(f"/api/requests/{second.pk}/rollback/", {"reason": "bad"}, format="json")
    assert first_time.status_code == 200
    assert warehouse.current("dwd_order_items", DAYS[0]) == run.run_id
    again = api("oscar").post(f"/api/requests/{second.pk}/rollback/", {"reason": "bad"}, format="json")
    assert again.status_code == 409 and "already rolled back" in again.json()["detail"]
    twice = api("oscar").post(url, {"reason": "bad"}, format="json")
    assert twice.status_code == 409 and "already rolled back" in twice.json()["detail"]
    assert warehouse.current("dwd_order_items", DAYS[0]) == run.run_id
    assert Publication.objects.filter(action="rollback").count() == 1
    assert AuditEvent.objects.filter(action="partition.rollback").count() == 1


def test_a_rollback_interrupted_before_its_mirror_is_finished_not_repeated(personas, ready, warehouse):
    first = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    second = run_request(personas, ready, start=DAYS[0], end=DAYS[0])
    good, bad = Run.objects.get(request=first), Run.objects.get(request=second)
    publications = connection.ops.quote_name(Publication._meta.db_table)

    def killed_at_the_mirror(execute, sql, params, many, context):
        """The process dies as it writes the rollback's first metadata row (the pointer
        moved in the warehouse just before)."""
        if sql.lstrip().upper().startswith("INSERT") and publications in sql:
            raise SystemExit("worker killed between the warehouse and the metadata")
        return execute(sql, params, many, context)

    with pytest.raises(SystemExit), connection.execute_wrapper(killed_at_the_mirror):
        rollback_service.partition_rollback(actor=personas["oscar"], dataset="dwd_order_items",
                                            partition_key=DAYS[0], reason="doubled")
    assert warehouse.current("dwd_order_items", DAYS[0]) == good.run_id  # the truth moved
    bad.refresh_from_db()
    assert bad.status == RunStatus.PUBLISHED  # the mirror did not
    with pytest.raises(Exception) as refused:
        rollback_service.partition_rollback(actor=personas["oscar"], dataset="dwd_order_items",
                                            partition_key=DAYS[0], reason="doubled")
    assert "already rolled back" in str(refused.value)
    bad.refresh_from_db()
    good.refresh_from_db()
    assert (bad.status, good.status) == (RunStatus.ROLLED_BACK, RunStatus.PUBLISHED)
    assert Publication.objects.filter(action="rollback").count() == 1
    assert warehouse.current("dwd_order_items", DAYS[0]) == good.run_id


def test_rolling_back_a_rebuild_names_the_tainted_versions_it_restores_and_a_new_rebuild_is_filed(
        personas, ready, warehouse, api, web, incident):
    """The exploratory test: after the rebuild request was itself rolled back, readers
    saw the versions built from the bad input again, the rollback's answer did not say
    so, and "rebuild" handed back the rolled-back rebuild, filing nothing."""
    good, bad, dws = incident
    dws_runs = runs_by_day(dws)
    body = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "doubled"}, format="json").json()
    assert body["restored_tainted"] == []  # the good versions came back
    (first,) = api("oscar").post(body["rebuild"]).json()
    assert api("sam").post(f"/api/requests/{first['id']}/approve/", {}, format="json").status_code == 200
    ready.drain()

    # The confirmation page of a partition rollback says so before anything moves.
    page = web("oscar").get(f"/datasets/dws_sales_daily/partitions/{DAYS[0]}/rollback/").content.decode()
    assert 'id="target-tainted"' in page and dws_runs[DAYS[0]].run_id in page.split('id="target-tainted"')[1]
    # The rebuild is rolled back: dws goes back to the versions built on the doubled input.
    undo = api("oscar").post(f"/api/requests/{first['id']}/rollback/", {"reason": "rebuild was wrong"},
                             format="json")
    assert undo.status_code == 200, undo.json()
    restored = undo.json()["restored_tainted"]
    assert {(m["partition_key"], m["to_run_id"]) for m in restored} == {(d, r.run_id) for d, r in dws_runs.items()}
    for day, run in dws_runs.items():
        assert warehouse.current("dws_sales_daily", day) == run.run_id
        mark = api("oscar").get(f"/api/datasets/dws_sales_daily/partitions/{day}/").json()["contamination"]
        assert mark["state"] == "pending"

    # Rebuild again: a NEW request (the first one was rolled back), which clears the marks.
    again = api("oscar").post(body["rebuild"])
    assert again.status_code == 201, again.json()
    (second,) = again.json()
    assert second["id"] != first["id"] and second["status"] == RequestStatus.PENDING_APPROVAL
    assert api("oscar").post(body["rebuild"]).json()[0]["id"] == second["id"]  # and only one
    assert api("sam").post(f"/api/requests/{second['id']}/approve/", {}, format="json").status_code == 200
    ready.drain()
    for day in DAYS:
        mark = api("oscar").get(f"/api/datasets/dws_sales_daily/partitions/{day}/").json()["contamination"]
        assert mark["state"] == "rebuilt" and mark["rebuilt_by"] == second["id"]
        gmv = sum(float(r["gmv"]) for r in warehouse.read_partition("dws_sales_daily", day))
        amount = sum(float(r["amount"]) for r in warehouse.read_partition("dwd_order_items", day))
        assert gmv == pytest.approx(amount, abs=0.05)


def test_what_a_cancelled_request_published_before_the_cancel_can_be_rolled_back(personas, ready, warehouse, api):
    """The exploratory test: a request cancelled after publishing 476 partitions could not
    be rolled back as a request (409: only reconciling, completed or failed)."""
    from tests.execution.test_pipeline import approved_request

    good = run_request(personas, ready, start=DAYS[0], end=DAYS[-1])
    deploy(dwd_sql=DOUBLED_SQL)
    bad = approved_request(personas, start=DAYS[0], end=DAYS[-1])
    executed = []

    def after_the_first(task, args):  # one interval publishes, the other waits in the broker
        if task != "execution.execute_run":
            return False
        executed.append(args)
        return len(executed) > 1

    ready.drain(skip=after_the_first)
    published = [r for r in Run.objects.filter(request=bad) if r.status == RunStatus.PUBLISHED]
    assert len(published) == 1
    day = published[0].partition_key
    assert api("oscar").post(f"/api/requests/{bad.pk}/cancel/", {"reason": "wrong code"},
                             format="json").status_code == 200
    ready.drain()
    page = api("oscar").get(f"/api/requests/{bad.pk}/").json()
    assert page["status"] == "cancelled"
    response = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "doubled"}, format="json")
    assert response.status_code == 200, response.json()
    assert [p["partition_key"] for p in response.json()["partitions"]] == [day]
    assert warehouse.current("dwd_order_items", day) == runs_by_day(good)[day].run_id
    bad.refresh_from_db()
    assert bad.status == RequestStatus.CANCELLED  # an exit of its lifecycle: it stays one
    event = AuditEvent.objects.get(action="request.rollback", request_id=bad.pk)
    assert (event.actor_name, event.reason) == ("oscar", "doubled")
    again = api("oscar").post(f"/api/requests/{bad.pk}/rollback/", {"reason": "doubled"}, format="json")
    assert again.status_code == 409 and "rolled back already" in again.json()["detail"]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL: concurrent transactions")
def test_four_rollbacks_of_one_partition_at_once_roll_it_back_once_credited_to_who_won(
        personas, ready, warehouse, incident):
    """The exploratory test: four clicks at once all got 409, yet the partition was rolled
    back, credited to "system" (a loser took the winner's move, between its warehouse and
    metadata steps, for an interruption and recorded it itself)."""
    import threading

    from django.db import connections

    from backfill_portal.core.errors import ConflictError

    good, bad, _ = incident
    outcomes, barrier = [], threading.Barrier(4)

    def click(name):
        try:
            barrier.wait()
            rollback_service.partition_rollback(actor=personas[name], dataset="dwd_order_items",
                                                partition_key=DAYS[0], reason=f"doubled ({name})")
            outcomes.append(("ok", name))
        except ConflictError as exc:
            outcomes.append(("409", exc.message))
        except Exception as exc:  # noqa: BLE001 - reported below
            outcomes.append(("error", repr(exc)))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(n,)) for n in ("oscar", "olivia", "admin", "oscar")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    winners = [who for kind, who in outcomes if kind == "ok"]
    assert len(winners) == 1 and sorted(k for k, _ in outcomes) == ["409", "409", "409", "ok"], outcomes
    assert warehouse.current("dwd_order_items", DAYS[0]) == runs_by_day(good)[DAYS[0]].run_id
    rollback = Publication.objects.get(action=Publication.Action.ROLLBACK, partition_key=DAYS[0])
    assert rollback.actor.username == winners[0] and rollback.reason == f"doubled ({winners[0]})"
