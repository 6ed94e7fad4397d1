"""Scheduled production runs: one per scheduled job for its latest closed interval."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from backfill_portal.catalog.calendar import interval_for_key, partition_for, previous_partition
from backfill_portal.catalog.models import Job
from backfill_portal.core.services.audit import audit_record
from backfill_portal.execution.choices import RunStatus, RunType
from backfill_portal.execution.models import Run
from backfill_portal.execution.services.dispatch import dispatch_serialise, enqueue_execute, free_slots


def schedule_production(*, now=None, jobs: list[str] | None = None) -> list[str]:
    """Create the scheduled run of each scheduled job's latest closed interval, once.
    Production may use the pool's reserved slots; backfills may not. `jobs`: only these
    scheduled jobs (the demo's history replays one job's schedule at past clocks)."""
    now = now or timezone.now()
    created = []
    scheduled = Job.objects.filter(scheduled=True)
    if jobs is not None:
        scheduled = scheduled.filter(name__in=jobs)
    for job in scheduled.select_related("dataset__team", "pool", "current_code_version"):
        ds = job.dataset
        current = partition_for(grain=ds.grain, timezone=ds.timezone, at=now)
        key = previous_partition(grain=ds.grain, timezone=ds.timezone, partition_key=current.partition_key)
        with transaction.atomic():
            dispatch_serialise()
            if Run.objects.filter(job=job, partition_key=key, run_type=RunType.SCHEDULED).exists():
                continue
            if job.current_code_version is None or free_slots(job, production=True) < 1:
                continue
            interval = interval_for_key(grain=ds.grain, timezone=ds.timezone, partition_key=key)
            run = Run.objects.create(job=job, run_type=RunType.SCHEDULED, partition_key=key,
                                     data_interval_start=interval.start, data_interval_end=interval.end,
                                     code_version=job.current_code_version)
            audit_record(actor=None, action="run.created", object_type="run", object_id=run.pk, dataset=ds.name,
                         to_state=RunStatus.QUEUED,
                         data={"run_id": run.run_id, "partition": key, "run_type": RunType.SCHEDULED,
                               "code_version": job.current_code_version.pk,
                               "code_hash": job.current_code_version.hash})
            enqueue_execute(run)
            created.append(run.run_id)
    return created
