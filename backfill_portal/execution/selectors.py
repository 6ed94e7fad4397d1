from __future__ import annotations

from django.db.models import QuerySet

from backfill_portal.execution.models import Run


def run_list() -> QuerySet[Run]:
    return Run.objects.select_related("job__dataset", "code_version", "request")
