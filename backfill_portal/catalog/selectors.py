from __future__ import annotations

from django.db.models import QuerySet

from backfill_portal.catalog.models import Dataset, Job


def dataset_list() -> QuerySet[Dataset]:
    return Dataset.objects.select_related("owner", "team").prefetch_related("job")


def job_list() -> QuerySet[Job]:
    return Job.objects.select_related("dataset__owner", "dataset__team", "pool", "current_code_version").prefetch_related("upstreams")
