"""Partitions built by older code: after a job's definition changes (a re-synced dbt
model, an edited catalog template), the published partitions whose current version a
run of an earlier code version produced, and a draft request that rebuilds exactly them
(what SQLMesh's plan does for its own models).

Read-only except for the draft, which `backfill_request_create_partitions` writes (the
role check, the interval plan and the audit row are its own). The current version of a
partition is the one its latest publication points to (a rollback moves the pointer
back with a publication row of its own)."""
from __future__ import annotations

from dataclasses import dataclass

from backfill_portal.backfills import policy
from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.models import BackfillRequest, Interval
from backfill_portal.backfills.services.rebuild import backfill_request_create_partitions
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ValidationError
from backfill_portal.warehouse.models import Publication


@dataclass(frozen=True)
class StalePartition:
    partition_key: str
    code_version: str  # the short hash that built the published version


def stale_partitions(*, job: Job) -> list[StalePartition]:
    """The job's published partitions built by another code version than its current one,
    in partition order."""
    current = job.current_code_version_id
    latest: dict[str, tuple] = {}
    rows = (Publication.objects.filter(dataset_id=job.dataset_id).order_by("-id")
            .values_list("partition_key", "version__run__code_version_id", "version__run__code_version__hash"))
    for key, version_id, digest in rows:
        latest.setdefault(key, (version_id, digest))
    return [StalePartition(key, (digest or "")[:12]) for key, (version_id, digest) in sorted(latest.items())
            if version_id != current]


def stale_backfill_draft(*, actor, job_names: list[str], reason: str = "") -> BackfillRequest:
    """A draft request that rebuilds every stale partition of `job_names` with their
    current code versions. ValidationError when none is stale; PermissionDenied first
    for whoever may not file requests (an auditor learnt nothing from a 400)."""
    policy.require_create(actor)
    jobs = {j.name: j for j in Job.objects.filter(name__in=job_names).select_related("dataset")}
    unknown = [n for n in job_names if n not in jobs]
    if unknown:
        raise ValidationError(f"job {unknown[0]!r} does not exist", field="jobs")
    partitions = {name: [p.partition_key for p in stale_partitions(job=job)] for name, job in jobs.items()}
    if not any(partitions.values()):
        raise ValidationError("no published partition was built by an older code version", field="jobs")
    existing = _same_draft(actor, partitions)
    if existing is not None:  # pressing the button twice files one draft
        return existing
    reason = reason or ("rebuild the partitions built by older code versions of "
                        + ", ".join(f"{n}@{jobs[n].current_code_version.short_hash}" for n in sorted(jobs)
                                    if partitions[n]))
    return backfill_request_create_partitions(actor=actor, partitions=partitions, reason=reason)


def _same_draft(actor, partitions: dict[str, list[str]]) -> BackfillRequest | None:
    wanted = sorted((job, key) for job, keys in partitions.items() for key in keys)
    for draft in BackfillRequest.objects.filter(requested_by=actor, status=RequestStatus.DRAFT,
                                                job__name__in=list(partitions)).order_by("-id")[:20]:
        planned = sorted(Interval.objects.filter(request=draft).values_list("job__name", "partition_key"))
        if planned == wanted:
            return draft
    return None
