"""The transactional outbox: a task is sent only after its transaction commits, once;
what was committed but never sent (broker down, process died) is sent by the sweeper."""
from __future__ import annotations

import pytest
from django.db import transaction

from backfill_portal.execution import queue
from backfill_portal.execution.models import TaskOutbox

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def broker():
    sent: list[tuple] = []
    state = {"down": False}

    def publish(task, args, headers, queue_name, eta=None):
        if state["down"]:
            raise ConnectionError("broker unreachable")
        sent.append((task, args, headers, queue_name))

    with queue.use_publisher(publish):
        yield sent, state


def test_a_task_is_sent_after_commit_and_marked_sent(broker):
    sent, _ = broker
    with transaction.atomic():
        row = queue.enqueue("execution.execute_run", "run_a", headers={"run_id": "run_a"})
        assert sent == []  # not before the commit
    assert sent == [("execution.execute_run", ["run_a"], {"run_id": "run_a"}, queue.BACKFILL_QUEUE)]
    row.refresh_from_db()
    assert row.sent_at is not None
    assert queue.outbox_resend(older_than_seconds=0) == 0  # nothing left to send


def test_a_rolled_back_transaction_sends_nothing_and_leaves_no_row(broker):
    sent, _ = broker
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            queue.enqueue("execution.execute_run", "run_b")
            raise RuntimeError("the caller fails after enqueueing")
    assert sent == []
    assert not TaskOutbox.objects.exists()


def test_committed_but_not_sent_is_sent_once_by_the_sweeper(broker):
    sent, state = broker
    state["down"] = True
    with transaction.atomic():
        row = queue.enqueue("execution.verify_run", "run_c", queue=queue.PRODUCTION_QUEUE)
    row.refresh_from_db()
    assert sent == [] and row.sent_at is None
    assert queue.outbox_resend(older_than_seconds=0) == 0  # still down: stays unsent
    state["down"] = False
    assert queue.outbox_resend(older_than_seconds=3600) == 0  # too recent for the sweeper
    assert queue.outbox_resend(older_than_seconds=0) == 1
    assert sent == [("execution.verify_run", ["run_c"], {}, queue.PRODUCTION_QUEUE)]
    assert queue.outbox_resend(older_than_seconds=0) == 0
    assert len(sent) == 1


def test_a_second_send_keeps_the_first_stamp(broker):
    sent, _ = broker
    with transaction.atomic():
        row = queue.enqueue("execution.execute_run", "run_d")
    first = TaskOutbox.objects.get(pk=row.pk).sent_at
    assert first is not None
    assert queue.send(row)
    assert len(sent) == 2  # a duplicate delivery, which tasks tolerate
    assert TaskOutbox.objects.get(pk=row.pk).sent_at == first


def test_retention_deletes_rows_sent_before_the_window_never_an_unsent_one(broker, settings, warehouse):
    from datetime import timedelta

    from django.utils import timezone

    from backfill_portal.core.models import AuditEvent
    from backfill_portal.recovery.tasks import purge_versions

    _sent, state = broker
    settings.TASK_OUTBOX_RETENTION_DAYS = 7
    with transaction.atomic():
        old, recent = (queue.enqueue("execution.execute_run", f"run_{n}") for n in ("old", "recent"))
    state["down"] = True
    with transaction.atomic():
        unsent = queue.enqueue("execution.execute_run", "run_unsent")
    now = timezone.now()
    TaskOutbox.objects.filter(pk=old.pk).update(sent_at=now - timedelta(days=8))
    TaskOutbox.objects.filter(pk=recent.pk).update(sent_at=now - timedelta(days=6))
    TaskOutbox.objects.filter(pk=unsent.pk).update(created_at=now - timedelta(days=400))

    counts = purge_versions.apply().get()  # the beat's retention task
    assert counts["task_outbox_purged"] == 1
    assert set(TaskOutbox.objects.values_list("pk", flat=True)) == {recent.pk, unsent.pk}
    (audit,) = AuditEvent.objects.filter(action="task_outbox.purge")
    assert audit.data["rows"] == 1 and audit.object_id == f"{old.pk}-{old.pk}" and "7-day" in audit.reason
    assert purge_versions.apply().get()["task_outbox_purged"] == 0  # safe twice
