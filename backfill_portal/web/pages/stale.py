"""A job's partitions built by older code versions (after a re-synced dbt model or an
edited template), and the one click that drafts their rebuild."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.urls import reverse
from django.views.decorators.http import require_POST

from backfill_portal.backfills import policy
from backfill_portal.backfills.code_staleness import stale_backfill_draft, stale_partitions
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import NotFound
from backfill_portal.core.web import application_errors, redirect_after_post, render_page


def _job(name: str) -> Job:
    job = Job.objects.select_related("dataset", "current_code_version").filter(name=name).first()
    if job is None:
        raise NotFound(f"job {name} does not exist")
    return job


@login_required
@application_errors
def job_stale(request, name: str):
    job = _job(name)
    return render_page(request, "catalog/stale.html", {
        "job": job, "stale": stale_partitions(job=job), "can_create": policy.may_create(request.user),
    })


@login_required
@require_POST
@application_errors
def job_stale_draft(request, name: str):
    job = _job(name)
    draft = stale_backfill_draft(actor=request.user, job_names=[job.name])
    return redirect_after_post(request, reverse("request-detail", args=[draft.pk]))
