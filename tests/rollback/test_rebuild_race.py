"""Two clicks on "rebuild" at the same moment, on PostgreSQL: both read the closure as
not yet claimed, both file a request; the claim (a conditional UPDATE in the same
transaction) lets one commit, and the other is undone and returns the winner's."""
from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections, transaction

from backfill_portal.backfills.models import BackfillRequest
from backfill_portal.core.models import AuditEvent
from backfill_portal.warehouse.models import Contamination
from backfill_portal.recovery.rollback import partition_rollback, partition_rollback_rebuild
from tests.reconciliation.helpers import DOUBLED_SQL, deploy, run_request
from tests.conftest import waiting_backends

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="needs PostgreSQL: two concurrent transactions (CI's second pass runs it)"),
]
DAY = "2022-10-01"




def test_two_simultaneous_rebuild_clicks_file_one_request(personas, ready, warehouse):
    deploy()
    run_request(personas, ready, start=DAY, end=DAY)
    deploy(dwd_sql=DOUBLED_SQL)
    bad = run_request(personas, ready, start=DAY, end=DAY)
    deploy()
    run_request(personas, ready, job="dws_sales_daily", start=DAY, end=DAY, approver="sam")
    partition_rollback(actor=personas["oscar"], dataset="dwd_order_items", partition_key=DAY, reason="doubled")
    assert Contamination.objects.count() == 1

    results, news, errors = {}, {}, []

    def click(name):
        try:
            filed = partition_rollback_rebuild(actor=personas[name], dataset="dwd_order_items", partition_key=DAY)
            results[name] = [r.pk for r in filed]
            news[name] = filed.new
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=click, args=(name,)) for name in ("oscar", "olivia")]
    # Hold the closure rows: each click reads them unclaimed, files its request and
    # then waits for the rows (or for the other click's audit lock) - a real race.
    with transaction.atomic():
        list(Contamination.objects.select_for_update())
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while waiting_backends() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting_backends() >= 2, "both clicks should be waiting on the held rows"
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert results["oscar"] == results["olivia"] and len(results["oscar"]) == 1
    assert sorted(news.values()) == [False, True]  # one click filed it, the other was told it was filed
    (winner,) = results["oscar"]
    assert list(BackfillRequest.objects.filter(parent=bad).values_list("pk", flat=True)) == [winner]
    assert Contamination.objects.get().rebuild_id == winner
    assert AuditEvent.objects.filter(action="request.rebuild_after_rollback").count() == 1
    assert AuditEvent.objects.filter(action="request.create", object_id=str(winner)).count() == 1
