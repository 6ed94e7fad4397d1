"""Second-rerun verification: compute each interval again, in isolation, on the same
pinned inputs; publish only when the fingerprint and the four numbers do not move."""
from __future__ import annotations

import pytest

from backfill_portal.backfills.choices import IntervalStatus, RequestStatus
from backfill_portal.backfills.models import Interval
from backfill_portal.core.models import AuditEvent
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import CheckResult, Run
from backfill_portal.execution.services.verify import run_publish, run_verify
from backfill_portal.warehouse.models import Consumption, Publication, Version
from tests.reconciliation.helpers import run_request

pytestmark = pytest.mark.django_db(transaction=True)


def pins(run) -> set[tuple]:
    return {(c.dataset_id, c.partition_key, c.version_id, str(c.watermark))
            for c in Consumption.objects.filter(run=run)}


def test_non_deterministic_job_is_caught_by_the_second_rerun_and_never_published(personas, ready, warehouse):
    request = run_request(personas, ready, job="dwd_order_items_sample", start="2022-10-01", end="2022-10-02",
                          verify_twice=True)
    assert request.status == RequestStatus.FAILED
    for original in Run.objects.filter(request=request, run_type=RunType.BACKFILL):
        second = Run.objects.get(request=request, run_type=RunType.VERIFICATION, interval=original.interval)
        assert original.status == RunStatus.VERIFICATION_FAILED
        assert "non-deterministic" in original.error
        check = CheckResult.objects.get(run=original, name="second_rerun")
        assert check.passed is False and check.blocking
        assert check.observed["original"]["fingerprint"] == Version.objects.get(run=original).fingerprint
        assert check.observed["second"]["fingerprint"] == Version.objects.get(run=second).fingerprint
        assert check.observed["original"]["fingerprint"] != check.observed["second"]["fingerprint"]
        assert second.status == RunStatus.VERIFICATION_FAILED
        assert second.code_version_id == original.code_version_id
        assert pins(second) == pins(original)  # the same pinned inputs
        # Nothing became visible, and nothing can make it visible.
        assert warehouse.current("dwd_order_items_sample", original.partition_key) is None
        assert run_publish(run_id=original.run_id).startswith("skipped")
        assert run_publish(run_id=second.run_id).startswith("skipped")
        assert not Publication.objects.filter(version__run__in=[original, second]).exists()
        event = AuditEvent.objects.get(action="run.verification_failed", object_id=str(original.pk))
        assert event.from_state == "verifying" and "non-deterministic" in event.reason
    assert set(Interval.objects.filter(request=request).values_list("status", flat=True)) == {IntervalStatus.FAILED}


def test_deterministic_job_with_verify_twice_publishes_the_original_and_never_the_verification_run(
        personas, ready, warehouse):
    request = run_request(personas, ready, start="2022-10-01", end="2022-10-01", verify_twice=True)
    assert request.status == RequestStatus.RECONCILING
    original = Run.objects.get(request=request, run_type=RunType.BACKFILL)
    second = Run.objects.get(request=request, run_type=RunType.VERIFICATION)
    assert original.status == RunStatus.PUBLISHED
    assert warehouse.current("dwd_order_items", "2022-10-01") == original.run_id
    check = CheckResult.objects.get(run=original, name="second_rerun")
    assert check.passed and check.observed["original"] == check.observed["second"]
    assert check.observed["verification_run_id"] == second.run_id
    assert pins(second) == pins(original)
    # The verification run is retired, not published, and holds no slot.
    assert second.status == RunStatus.CANCELLED and "never published" in AuditEvent.objects.get(
        action="run.cancelled", object_id=str(second.pk)).reason
    assert Version.objects.get(run=second).fingerprint == Version.objects.get(run=original).fingerprint
    assert not Publication.objects.filter(version__run=second).exists()
    # Its pages say "retired (verification)", not "cancelled" (which an auditor read as
    # someone having cancelled it): the run page, the runs list and the partition page.
    from django.test import Client

    client = Client()
    client.force_login(personas["audrey"])
    for path in (f"/runs/{second.run_id}/", "/runs/", "/datasets/dwd_order_items/partitions/2022-10-01/",
                 f"/requests/{request.pk}/"):
        html = client.get(path).content.decode()
        assert '<span class="pill pill-cancelled">retired (verification)</span>' in html, path
        assert '<span class="pill pill-cancelled">cancelled</span>' not in html, path
    # The original waited in `verifying` for the comparison: its audit trail shows it.
    trail = list(AuditEvent.objects.filter(object_type="run", object_id=str(original.pk)).order_by("id")
                 .values_list("to_state", flat=True))
    assert trail == ["queued", "running", "staged", "verifying", "verified", "published"]


def test_second_rerun_tasks_are_safe_to_run_twice(personas, ready, warehouse):
    request = run_request(personas, ready, start="2022-10-02", end="2022-10-02", verify_twice=True)
    original = Run.objects.get(request=request, run_type=RunType.BACKFILL)
    second = Run.objects.get(request=request, run_type=RunType.VERIFICATION)
    for run in (original, second):
        assert run_verify(run_id=run.run_id).startswith("skipped")
    assert Run.objects.filter(request=request).count() == 2
    assert Publication.objects.filter(version__run=original).count() == 1


def test_a_second_rerun_that_cannot_complete_fails_its_original_instead_of_stranding_it(personas, ready, warehouse):
    from backfill_portal.catalog.models import Job
    from tests.execution import jobs as test_jobs

    Job.objects.filter(name="dwd_order_items_py").update(max_attempts=2)
    test_jobs.CRASH.update(after_fraction=0.5, times=10, let_through=1)  # the original runs, the rerun never does
    try:
        request = run_request(personas, ready, job="dwd_order_items_py", start="2022-10-01", end="2022-10-01",
                              verify_twice=True)
    finally:
        test_jobs.CRASH.update(after_fraction=None, times=0, let_through=0)
    original = Run.objects.get(request=request, run_type=RunType.BACKFILL)
    second = Run.objects.get(request=request, run_type=RunType.VERIFICATION)
    assert second.status == RunStatus.FAILED and second.attempts.count() == 2
    assert original.status == RunStatus.VERIFICATION_FAILED  # not left in `verifying`, not published unproven
    assert warehouse.current("dwd_order_items_py", "2022-10-01") is None
    assert request.status == RequestStatus.FAILED
