"""The fixed-statement INSERT used for audit events and outbox rows."""
from __future__ import annotations

import pytest
from django.utils import timezone

from backfill_portal.core.rows import insert_row
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
