"""The fixed-statement INSERT and conditional UPDATE used on the hot path (audit events,
outbox rows, runs, state claims)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from backfill_portal.catalog.models import Team
from backfill_portal.core.rows import insert_new_rows, insert_row, update_row
from backfill_portal.execution.models import TaskOutbox

pytestmark = pytest.mark.django_db


def test_insert_row_stores_the_instance_with_its_fields_defaults_and_auto_now_add():
    before = timezone.now()
    row = insert_row(TaskOutbox(task="execution.verify_run", args=["run_x", 2]))

    stored = TaskOutbox.objects.get(pk=row.pk)
    assert (stored.task, stored.args, stored.headers, stored.queue, stored.sent_at) == (
        "execution.verify_run", ["run_x", 2], {}, "backfill", None)
    assert stored.created_at == row.created_at and stored.created_at >= before
    assert not row._state.adding


def test_insert_row_gives_each_row_its_own_key():
    first = insert_row(TaskOutbox(task="a"))
    second = insert_row(TaskOutbox(task="b"))
    assert first.pk != second.pk
    assert dict(TaskOutbox.objects.values_list("pk", "task")) == {first.pk: "a", second.pk: "b"}


def test_update_row_changes_the_row_only_while_its_conditions_hold():
    row = insert_row(TaskOutbox(task="a"))
    first, later = timezone.now(), timezone.now() + timedelta(minutes=1)

    assert update_row(TaskOutbox, row.pk, {"sent_at": first}, where={"sent_at": None}) == 1
    assert update_row(TaskOutbox, row.pk, {"sent_at": later}, where={"sent_at": None}) == 0
    assert update_row(TaskOutbox, row.pk, {"queue": "production"}, where={"task": "b"}) == 0
    assert update_row(TaskOutbox, row.pk, {"queue": "production", "args": [7]}, where={"task": "a"}) == 1

    stored = TaskOutbox.objects.get(pk=row.pk)
    assert (stored.sent_at, stored.queue, stored.args) == (first, "production", [7])


def test_insert_new_rows_writes_every_row_with_its_defaults_by_one_statement_in_one_call():
    before = timezone.now()
    rows = [TaskOutbox(task=f"t{n}", args=[n]) for n in range(60)]  # more than one multi-row INSERT held
    with CaptureQueriesContext(connection) as queries:
        insert_new_rows(rows)
    assert len(queries.captured_queries) == 1 and queries.captured_queries[0]["sql"].startswith("60 times: INSERT")
    stored = list(TaskOutbox.objects.order_by("pk").values_list("task", "args", "queue", "created_at"))
    assert [(task, args, queue) for task, args, queue, _ in stored] == [(f"t{n}", [n], "backfill") for n in range(60)]
    assert all(created >= before for *_, created in stored)
    assert not any(row._state.adding for row in rows)


def test_insert_new_rows_ignoring_conflicts_skips_only_the_rows_a_unique_constraint_refuses():
    Team.objects.create(name="core", max_concurrent_runs=3)
    insert_new_rows([Team(name="core", max_concurrent_runs=9), Team(name="finance", max_concurrent_runs=5)],
                    ignore_conflicts=True)
    assert dict(Team.objects.values_list("name", "max_concurrent_runs")) == {"core": 3, "finance": 5}
    with pytest.raises(IntegrityError), transaction.atomic():
        insert_new_rows([Team(name="core", max_concurrent_runs=1)])
    with pytest.raises(IntegrityError), transaction.atomic():  # not a unique conflict: refused, not skipped
        insert_new_rows([Team(name="ops", max_concurrent_runs=None)], ignore_conflicts=True)
    assert Team.objects.count() == 2
