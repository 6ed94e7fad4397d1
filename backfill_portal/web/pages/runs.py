"""The runs list (failing and stuck first, filtered); run detail: identity, time per
phase, attempts, checks, the rendered SQL, its log lines, what it read, the version it
wrote and its publications; and the side-effect outbox. A fixed number of queries
whatever they hold."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Q

from backfill_portal.catalog.models import Dataset, Job
from backfill_portal.core.errors import NotFound
from backfill_portal.core.logging import run_log_lines
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.web import application_errors, keyset_page, query_without, render_page
from backfill_portal.execution.choices import RunStatus
from backfill_portal.execution.models import Attempt, CheckResult, Delivery, Run
from backfill_portal.execution.selectors import (
    RunFilters,
    run_phases,
    run_rendered_sql,
    run_row_values,
    run_rows,
    run_verdict,
    runs_failing,
    runs_stuck,
)
from backfill_portal.web.forms.runs import RunFilterForm
from backfill_portal.warehouse.models import Consumption, Publication, Version

# Failing and stuck runs come first, above the paged list; this many of each (the
# newest), then a link to all of them: the list filtered by state, paged.
ATTENTION_SHOWN = 20


@login_required
def run_list(request):
    """Every run, newest first (keyset on id), under the runs that need a person: stuck
    (no sign of life) and failing (not fixed since). Bad filters are a 400 that names
    the field."""
    form = RunFilterForm(request.GET or None,
                         jobs=list(Job.objects.order_by("name").values_list("name", flat=True)),
                         datasets=list(Dataset.objects.filter(is_source=False).order_by("name")
                                       .values_list("name", flat=True)))
    if form.is_bound and not form.is_valid():
        return render_page(request, "execution/run_list.html", {"form": form, "page": None}, status=400)
    filters = form.filters() if form.is_bound else RunFilters()
    qs = run_rows(filters)
    stuck = failing = []
    if not filters.state:
        stuck = list(run_row_values(runs_stuck(qs).order_by("-id"))[:ATTENTION_SHOWN])
        failing = list(run_row_values(runs_failing(qs).order_by("-id"))[:ATTENTION_SHOWN])
    return render_page(request, "execution/run_list.html", {
        "form": form, "filters": filters, "stuck": stuck, "failing": failing, "attention_shown": ATTENTION_SHOWN,
        "stuck_ids": {r["pk"] for r in stuck}, "page": keyset_page(run_row_values(qs), request.GET.get("before")),
        "keep_query": query_without(request, "before"), "state_query": query_without(request, "before", "state"),
        "stuck_after": settings.RUN_STUCK_AFTER_SECONDS,
    })


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
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt_no"))
    checks = list(CheckResult.objects.filter(run=run).order_by("id"))
    sql, sql_note = run_rendered_sql(run)
    log_lines, log_total = run_log_lines(settings.RUN_LOG_DIR, run.run_id)
    for line in log_lines:
        # The error a line carries, as its last line says it ("ValueError: ..."): the
        # traceback stays in the worker's log for whoever operates it, not on a page.
        exc = [text for text in str(line.get("exc") or "").splitlines() if text.strip()]
        line["error"] = exc[-1].strip() if exc else ""
    return render_page(request, "execution/run_detail.html", {
        "run": run,
        "attempts": attempts,
        "checks": checks,
        "verdict": run_verdict(run, attempts, checks),
        # Who stopped a cancelled run, and why (the cancel of its request, or of the run).
        "cancelled": (AuditEvent.objects.filter(object_type="run", object_id=str(run.pk), action="run.cancelled")
                      .order_by("-id").first() if run.status == RunStatus.CANCELLED else None),
        "phases": run_phases(run),
        "sql": sql, "sql_note": sql_note,
        "log_lines": log_lines, "log_total": log_total,
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
