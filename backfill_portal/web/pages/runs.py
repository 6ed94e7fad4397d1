"""Run detail: identity, attempts, checks, pinned inputs, the version written and its
publications; and the side-effect outbox. A fixed number of queries whatever they hold."""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.db.models import Q

from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import NotFound
from backfill_portal.core.web import application_errors, keyset_page, query_without, render_page
from backfill_portal.execution.models import Attempt, CheckResult, Delivery, Run
from backfill_portal.warehouse.models import Consumption, Publication, Version


def _run_or_404(run_id: str) -> Run:
    run = (Run.objects.select_related("job__dataset", "code_version", "request", "interval", "created_by")
           .filter(run_id=run_id).first())
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    return run


@login_required
@application_errors
def run_detail(request, run_id: str):
    run = _run_or_404(run_id)
    version = Version.objects.filter(run=run).select_related("dataset").first()
    publications = []
    if version is not None:
        publications = list(
            # Pointer moves that made this version current, or moved away from it.
            Publication.objects.filter(Q(version=version) | Q(previous_version=version))
            .select_related("version__run", "previous_version__run", "actor", "request")
            .order_by("-id")[:50]
        )
    return render_page(request, "execution/run_detail.html", {
        "run": run,
        "attempts": list(Attempt.objects.filter(run=run).order_by("attempt_no")),
        "checks": list(CheckResult.objects.filter(run=run).order_by("id")),
        "inputs": list(Consumption.objects.filter(run=run).select_related("dataset", "version__run").order_by("id")),
        "version": version,
        "publications": publications,
        "current": _is_current(version, publications),
    })


def _is_current(version: Version | None, publications: list[Publication]) -> bool | None:
    """Whether the last pointer move touching this version left it current. Publications of
    the partition that never mention this version cannot move the pointer away from it
    without naming it as previous, so the newest row touching it decides."""
    if version is None or not publications:
        return None if version is None else False
    return publications[0].version_id == version.pk


@login_required
def outbox(request):
    """Side-effect deliveries, newest first (keyset on id); ?job= narrows to one node."""
    qs = Delivery.objects.select_related("job__dataset", "run__request")
    job = (request.GET.get("job") or "").strip()
    if job:
        qs = qs.filter(job__name=job)
    page = keyset_page(qs, request.GET.get("before"))
    effect_jobs = list(Job.objects.filter(has_side_effects=True).order_by("name").values_list("name", flat=True))
    return render_page(request, "execution/outbox.html", {
        "page": page, "job": job, "effect_jobs": effect_jobs, "keep_query": query_without(request, "before"),
    })
