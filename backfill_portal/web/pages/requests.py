"""Backfill request pages: list, new (with an htmx preview), detail with its live
partial, and the POST actions. Views parse, call one service, and render; the
services decide."""
from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpResponse
from django.shortcuts import render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import HttpResponseStopPolling

from backfill_portal.backfills.choices import Cascade, IntervalStatus, RequestStatus, StepKind
from backfill_portal.web.forms import cleaned
from backfill_portal.web.forms.requests import (
    DecisionForm,
    ReasonForm,
    RequestForm,
    RequestRollbackForm,
    StaleExclusionField,
    SubmitForm,
    partition_format,
)
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest
from backfill_portal.catalog.calendar import dst_notes
from backfill_portal.backfills.preview import request_plan_preview
from backfill_portal.backfills.policy import may_create, request_actions, require_create, require_request_action
from backfill_portal.backfills.selectors import request_get, request_progress, request_rows
from backfill_portal.backfills.staleness import FIELD as STALE_FIELD
from backfill_portal.backfills.services.requests import (
    backfill_request_cancel,
    backfill_request_create,
    backfill_request_decide,
    backfill_request_submit,
)
from backfill_portal.backfills.transitions import REQUEST_TERMINAL
from backfill_portal.catalog.models import Job
from backfill_portal.core.errors import ApplicationError, ConflictError, NotFound, PermissionDenied, ValidationError
from backfill_portal.core.web import (
    application_errors,
    flash_error,
    keyset_page,
    query_without,
    redirect_after_post,
    render_page,
)
from backfill_portal.execution.models import Attempt, Run
from backfill_portal.execution.selectors import progress_with_rollbacks
from backfill_portal.backfills.services.lifecycle import request_pause, request_resume
from backfill_portal.execution.services.dispatch import request_retry_failed
from backfill_portal.warehouse.services.outage import warehouse_outage_current
from backfill_portal.web.calendar_grid import request_calendar
from backfill_portal.recovery.reconciliation import rolled_back_items
from backfill_portal.recovery.rollback import (
    request_rollback,
    request_rollback_blocked,
    rollback_rebuild,
    rollback_state,
)

# Polling stops once nothing will change without a person acting. `failed` is not
# terminal for the lifecycle (it can be retried), but a retry reloads the page.
LIVE_FINAL = REQUEST_TERMINAL | {RequestStatus.FAILED}
RUNS_SHOWN = 25
RECON_SHOWN_STATES = (RequestStatus.RECONCILING, RequestStatus.COMPLETED, RequestStatus.ROLLED_BACK)
# "rolled_back": published intervals whose version was rolled back since (counted
# apart from "published" by execution.selectors.progress_with_rollbacks).
PROGRESS_SEGMENTS = ("published", "rolled_back", "running", "queued", "failed", "skipped", "cancelled")
# Django's Choices.values builds a new list on every access: read it once.
INTERVAL_STATES = tuple(IntervalStatus.values)


# --- Read helpers (selector-like) -------------------------------------------------------


def _progress(req: BackfillRequest, counts: dict[str, int] | None = None) -> dict:
    """Progress bar segments from the counts by status (one aggregate query unless
    given; one more for the rolled-back ones if anything was published)."""
    counts = progress_with_rollbacks(req, request_progress(req) if counts is None else counts)
    total = counts.get("total") or 0
    segments, offset = [], 0.0
    for name in PROGRESS_SEGMENTS:
        n = counts.get(name) or 0
        pct = round(100 * n / total, 3) if total else 0
        segments.append({"name": name, "label": name.replace("_", " "), "count": n, "pct": pct,
                         "offset": offset})  # offset: where it starts
        offset += pct
    return {"total": total, "planned": counts.get("planned") or 0, "segments": segments, "counts": counts,
            "done": sum(counts.get(name) or 0 for name in ("published", "rolled_back", "skipped"))}


def _fingerprint(req: BackfillRequest, progress: dict, outage) -> str:
    counts = progress["counts"]
    return ".".join([req.status, "p" if req.paused else "a", f"o{outage.pk}" if outage else "",
                     *(str(counts.get(s) or 0) for s in (*INTERVAL_STATES, "rolled_back"))])


def _live_context(req: BackfillRequest, *, with_grid: bool = True) -> dict:
    if with_grid:
        # The calendar reads every interval's state (one GROUP BY above its cell limit):
        # the progress bar is counted from the same rows, not from a second pass.
        grid = request_calendar(req)
        progress = _progress(req, grid.counts)
    else:
        progress, grid = _progress(req), None
    # A running request's work is held while the warehouse refuses connections.
    outage = warehouse_outage_current() if req.status == RequestStatus.RUNNING else None
    return {
        "req": req, "progress": progress, "grid": grid, "outage": outage,
        "polling": req.status not in LIVE_FINAL, "fingerprint": _fingerprint(req, progress, outage),
    }


def _steps(req: BackfillRequest) -> list[ApprovalStep]:
    return list(ApprovalStep.objects.filter(request=req).select_related("dataset", "job", "approver", "decided_by"))


def _latest_runs(req: BackfillRequest) -> list[Run]:
    # A correlated count per shown run (not a GROUP BY over every run of the request),
    # ordered along the (request, created_at, id) index so an old request's page does
    # not scan the whole runs table backwards.
    attempts = (Attempt.objects.filter(run=OuterRef("pk")).order_by().values("run")
                .annotate(n=Count("pk")).values("n"))
    return list(Run.objects.filter(request=req).select_related("job")
                .annotate(n_attempts=Coalesce(Subquery(attempts, output_field=IntegerField()), 0))
                .order_by("-created_at", "-id")[:RUNS_SHOWN])


# --- The page's live sections -----------------------------------------------------------

# Every section of the request page follows the request: the page polls one URL, which
# answers 204 when no section changed, else the changed sections (swapped out of band
# by id) and the poller carrying their new keys; 286 once the request is final. A
# section is keyed by the data it shows, so a form someone is typing into (a cancel
# reason) is only replaced when what it offers changes.
LIVE_SECTIONS = ("head", "about", "actions", "live", "impact", "related", "steps", "runs")


def _section_keys(ctx: dict) -> dict[str, str]:
    req = ctx["req"]
    state = f"{req.status}.{int(req.paused)}"
    raw = {
        "head": state,
        "about": f"{req.status}.{req.code_version_id}",
        "actions": f"{state}.{','.join(sorted(ctx['actions']))}.{ctx['retry_note']}.{ctx['rollback_blocked']}",
        "live": ctx["fingerprint"],
        "impact": req.status,
        "related": req.status,
        "steps": ";".join(f"{s.pk}:{s.status}:{s.decided_by_id}" for s in ctx["steps"]),
        "runs": ";".join(f"{r.pk}:{r.status}:{r.n_attempts}" for r in ctx["runs"]),
    }
    return {name: format(zlib.crc32(raw[name].encode()), "08x") for name in LIVE_SECTIONS}


def _keys_param(keys: dict[str, str]) -> str:
    return ".".join(keys[name] for name in LIVE_SECTIONS)


def _keys_from_param(value: str) -> dict[str, str]:
    """The client's keys; a malformed value counts as a page that has none."""
    parts = (value or "").split(".")
    return dict(zip(LIVE_SECTIONS, parts)) if len(parts) == len(LIVE_SECTIONS) else {}


def _retry_note(req: BackfillRequest) -> str:
    """What "Retry failed intervals" will run: the code frozen at submission, even when
    the job's code has changed since (invariant 7); "changed" then offers a new request."""
    frozen = req.code_version_id
    if not frozen:
        return ""
    return "same" if req.job.current_code_version_id == frozen else "changed"


def _about_context(req: BackfillRequest) -> dict:
    return {
        "side_effects": list(req.side_effects.order_by("name").values_list("name", flat=True)),
        "stale_shown": {name: s for name, s in (req.stale or {}).items() if s.get("included") or s.get("excluded")},
    }


def _action_forms() -> dict:
    return {"decision_form": DecisionForm(), "cancel_form": ReasonForm(), "rollback_form": RequestRollbackForm()}


def _page_context(request, req: BackfillRequest, *, with_grid: bool = True) -> dict:
    """What the page and its live sections show (the grid only if asked)."""
    live = _live_context(req, with_grid=with_grid)
    steps = _steps(req)
    ctx = {
        **live,
        "steps": steps,
        "runs": _latest_runs(req),
        "runs_shown": RUNS_SHOWN,
        # Which actions to offer: backfills.policy, which the services ask too.
        "actions": request_actions(request.user, req, steps, failed=live["progress"]["counts"].get("failed", 0)),
        "retry_note": _retry_note(req),
        "show_reconciliation": req.status in RECON_SHOWN_STATES,
        # What was rolled back of what it published (the whole request, or partitions of
        # it), by whom, when and why, and what was built from it: on its own page, not
        # only in the audit log and on each partition's page.
        "rolled_back": (rolled := rolled_back_items(req)),
        "rollback_impact": rollback_state(request_id=req.pk)["impact"] if rolled else [],
    }
    ctx["rollback_blocked"] = _rollback_blocked(req) if "rollback" in ctx["actions"] else ""
    ctx["section_keys"] = _section_keys(ctx)
    ctx["keys"] = _keys_param(ctx["section_keys"])
    return ctx


def _rollback_blocked(req: BackfillRequest) -> str:
    """Why a rollback of the request cannot succeed, when the metadata already says so
    (recovery.rollback.request_rollback_blocked), else "": the page then shows the
    reason instead of a form the service would answer with a 409."""
    count, names = request_rollback_blocked(req)
    if not count:
        return ""
    more = f" and {count - len(names)} more" if count > len(names) else ""
    return (f"Nothing to roll back to: this request published the first version of {', '.join(names)}{more}, "
            "so there is no previous verified version to restore. To correct the data, file a new request.")


# --- Pages ------------------------------------------------------------------------------


@login_required
def request_list(request):
    status = request.GET.get("status", "")
    job = request.GET.get("job", "")
    mine = request.GET.get("mine") == "1"
    qs = request_rows(user=request.user, mine=mine)
    if status in RequestStatus.values:
        qs = qs.filter(status=status)
    if job:
        qs = qs.filter(job__name=job)
    page = keyset_page(qs, request.GET.get("before"))
    return render_page(request, "backfills/request_list.html", {
        "page": page, "status": status, "job": job, "mine": mine,
        "statuses": RequestStatus.values,
        "jobs": list(Job.objects.filter(dataset__is_source=False).order_by("name").values_list("name", flat=True)),
        "keep_query": query_without(request, "before"),
    })


def _put_errors_on_form(form: RequestForm, exc: ApplicationError) -> None:
    if not exc.fields:
        form.add_error(None, exc.message)
        return
    for field, field_messages in exc.fields.items():
        target = field if field in form.fields and field != "idempotency_key" else None
        for text in field_messages:
            form.add_error(target, text)


@login_required
@application_errors
@require_http_methods(["GET", "POST"])
def request_new(request):
    """1. Validate the shape with the form. 2. Create the draft through the service
    (its field errors land on the form's fields). 3. Optionally submit it; an overlap
    asks for confirmation, the draft already saved is reused via the idempotency key.
    A user who may not file requests (the auditor) gets a 403 page, not the form; a
    forged POST is refused by the policy (and audited) before any field is read."""
    if not may_create(request.user):
        if request.method == "POST":
            require_create(request.user)
        raise PermissionDenied("Filing a backfill request needs the requester, owner, on-call or admin role. "
                               "You can read every request, run and audit record, and change nothing.")
    if request.method == "GET":
        # ?job=&start=&end=&cascade= prefill the form (a frozen request's "file a new
        # request with the current code"; the home page's "file the corrective backfill");
        # the POST validates them like anything typed.
        form = RequestForm(initial={key: request.GET.get(key, "")[:64] for key in ("job", "start", "end", "cascade")
                                    if request.GET.get(key)})
        return _render_new(request, form)

    form = RequestForm(request.POST)
    if not form.is_valid():
        if "idempotency_key" in form.errors:
            # The form's hidden key was damaged (no page of ours sends one it refuses): a
            # fresh one, and a visible error, so the next press can file the request.
            data = request.POST.copy()
            data["idempotency_key"] = uuid.uuid4().hex
            form = RequestForm(data)
            form.is_valid()
            form.add_error(None, "This form's hidden key was not one the portal makes; it has a new one now. "
                                 "Check the values and press again.")
        return _render_new(request, form)
    wants_submit = form.cleaned_data["action"] == "submit"
    try:
        obj, created = backfill_request_create(actor=request.user, **form.service_kwargs())
    except ValidationError as exc:
        _put_errors_on_form(form, exc)
        return _render_new(request, form)
    except ConflictError as exc:
        if "idempotency_key" not in exc.fields:
            raise
        # This form already created a draft with other values (edited after a warning):
        # give the form a fresh key so the next press files a new request.
        earlier = BackfillRequest.objects.filter(requested_by=request.user,
                                                 idempotency_key=form.cleaned_data["idempotency_key"]).first()
        data = request.POST.copy()
        data["idempotency_key"] = uuid.uuid4().hex
        form = RequestForm(data)
        form.is_valid()
        what = f"request #{earlier.pk} ({earlier.status.replace('_', ' ')})" if earlier else "a request"
        form.add_error(None, f"Your earlier attempt filed {what} with different values. Press again to file a new "
                             "request, or open that one and cancel it.")
        return _render_new(request, form)

    detail = reverse("request-detail", args=[obj.pk])
    # The whole frozen plan, the cascaded jobs' intervals included (interval_count is the root job's).
    planned = obj.intervals.count()
    if not wants_submit:
        messages.success(request, f"Draft #{obj.pk} saved with {planned} interval{pluralize(planned)}."
                         if created else f"Draft #{obj.pk} was already saved.")
        return redirect_after_post(request, detail)
    if not created and obj.status != RequestStatus.DRAFT:
        # A second press of "Create and submit" (double click, back button): already done.
        messages.info(request, f"Request #{obj.pk} was already submitted; it is {obj.status}.")
        return redirect_after_post(request, detail)
    try:
        backfill_request_submit(actor=request.user, request_id=obj.pk,
                                confirm_overlap=form.cleaned_data.get("confirm_overlap", False))
    except ConflictError as exc:
        if "confirm_overlap" not in exc.fields:
            flash_error(request, exc)
            return redirect_after_post(request, detail)
        form.show_confirm_overlap = True
        form.add_error("confirm_overlap", exc.message)
        form.add_error(None, f"Draft #{obj.pk} is saved but not submitted: it overlaps an active request. "
                             "Tick the confirmation and press “Create and submit” again, or change the range.")
        return _render_new(request, form)
    except ApplicationError as exc:
        flash_error(request, exc)
        return redirect_after_post(request, detail)
    messages.success(request, f"Request #{obj.pk} submitted for approval ({planned} interval{pluralize(planned)}).")
    return redirect_after_post(request, detail)


def _render_new(request, form: RequestForm) -> HttpResponse:
    if form.is_bound and "confirm_overlap" in form.data:
        form.show_confirm_overlap = True
    job = form.selected_job()
    preview = None
    if form.is_bound or job is not None:
        values = form.data if form.is_bound else form.initial
        preview = _preview_context(request.user, job=job, start=values.get("start", ""),
                                   end=values.get("end", ""),
                                   effects=form.data.getlist("side_effects") if form.is_bound else [],
                                   cascade=values.get("cascade", Cascade.NONE),
                                   exclude=form.data.getlist(STALE_FIELD) if form.is_bound else [])
    return render_page(request, "backfills/request_new.html", {"form": form, "preview": preview})


@login_required
@require_POST
def request_preview(request):
    """The htmx preview of the plan: count, UTC bounds, DST notes, overlaps, approvals."""
    name = request.POST.get("job", "")
    job = (Job.objects.select_related("dataset__owner").filter(name=name, dataset__is_source=False).first()
           if name else None)
    ctx = _preview_context(request.user, job=job, start=request.POST.get("start", ""),
                           end=request.POST.get("end", ""), effects=request.POST.getlist("side_effects"),
                           cascade=request.POST.get("cascade", Cascade.NONE),
                           unknown_job=name if name and job is None else "",
                           exclude=request.POST.getlist(STALE_FIELD))
    ctx["oob"] = True
    return render(request, "backfills/partials/_request_preview.html", {"preview": ctx, "oob": True})


@dataclass
class StepPreview:
    kind: str
    subject: str
    approver: str
    note: str = ""


def _preview_context(user, *, job: Job | None, start: str, end: str, effects: list[str],
                     cascade: str = Cascade.NONE, unknown_job: str = "", exclude: list[str] = ()) -> dict:
    ctx: dict = {"job": job, "errors": [], "start": (start or "").strip(), "end": (end or "").strip()}
    if job is None:
        ctx["errors"] = [f"Job {unknown_job!r} does not exist or is a source."] if unknown_job else []
        ctx["hint"] = "Choose a job to preview the plan."
        return ctx
    ds = job.dataset
    ctx["format"] = partition_format(ds.grain, ds.timezone)
    if not ctx["start"] or not ctx["end"]:
        ctx["hint"] = "Enter the first and last partition to preview the plan."
        return ctx
    try:
        plan = request_plan_preview(user=user, job=job, start=ctx["start"], end=ctx["end"], side_effects=effects,
                               cascade=cascade, exclude_stale=StaleExclusionField(required=False).clean(list(exclude)))
    except ValidationError as exc:
        ctx["errors"] = [m for ms in exc.fields.values() for m in ms] or [exc.message]
        return ctx
    except DjangoValidationError as exc:
        ctx["errors"] = list(exc.messages)
        return ctx
    planned, downstream = plan.planned, plan.downstream
    notes = dst_notes(planned)
    ctx.update({
        "count": len(planned), "first": planned[0], "last": planned[-1], "total": plan.total,
        "utc_start": planned[0].start, "utc_end": planned[-1].end,
        "stale": [{"job": s.job.name, "after": s.after, "owner": s.job.dataset.owner.username,
                   "partitions": s.marked()} for s in plan.stale],
        "notes": notes[:24], "more_notes": max(0, len(notes) - 24),
        "overlaps": plan.overlaps,
        "downstream": [{"job": n.job.name, "layer": n.layer, "action": n.action, "intervals": len(n.partitions)}
                       for n in downstream],
        "steps": _step_previews(plan.steps, plan.total),
    })
    return ctx


def _step_previews(plan: list, count: int) -> list[StepPreview]:
    """What submission will create: the same approval_plan, described."""
    steps = []
    for step in plan:
        if step.kind == StepKind.ADMIN:
            steps.append(StepPreview(StepKind.ADMIN.label, f"{count} intervals", "any admin",
                                     f"more than {settings.BACKFILL_ADMIN_APPROVAL_OVER} intervals"))
            continue
        subject = step.job.name if step.kind == StepKind.SIDE_EFFECT else step.dataset.name
        if step.approver is None:
            who, note = "any admin", "you own this dataset, and nobody approves their own request"
        else:
            who, note = step.approver.username, ""
        steps.append(StepPreview(StepKind(step.kind).label, subject, who, note))
    return steps


@login_required
@application_errors
def request_detail(request, pk: int, *, status: int = 200, show_confirm_overlap: bool = False):
    req = request_get(pk)
    return render_page(request, "backfills/request_detail.html", {
        **_page_context(request, req), **_about_context(req), **_action_forms(),
        "show_confirm_overlap": show_confirm_overlap,
    }, status=status)


@login_required
@application_errors
def request_live(request, pk: int):
    """The polled update of every section (see LIVE_SECTIONS): 204 when none changed
    since the client's keys (`v`), no grid query; else the changed sections; 286 once
    the request is final, which stops htmx polling."""
    req = request_get(pk)
    ctx = _page_context(request, req, with_grid=False)
    theirs = _keys_from_param(request.GET.get("v", ""))
    changed = [name for name in LIVE_SECTIONS if theirs.get(name) != ctx["section_keys"][name]]
    if ctx["polling"] and not changed:
        return HttpResponse(status=204)
    if "live" in changed:
        ctx["grid"] = request_calendar(req, total=ctx["progress"]["total"])
    if "about" in changed:
        ctx.update(_about_context(req))
    if "actions" in changed:
        ctx.update(_action_forms())
    ctx["changed"] = [f"backfills/partials/_request_{name}.html" for name in changed]
    html = render(request, "backfills/partials/_request_update.html", ctx).content
    if not ctx["polling"]:
        return HttpResponseStopPolling(html)
    return HttpResponse(html)


# --- Actions ---------------------------------------------------------------------------


def _cleaned(form, user, pk: int, action: str) -> dict:
    """The action's form, cleaned; refused (audited 403) first when it is invalid and the
    user may not act on the request at all."""
    return cleaned(form, permission=lambda: require_request_action(user, request_get(pk), action))


def _run_action(verb: str, request, pk: int) -> str:
    user = request.user
    if verb == "submit":
        form = SubmitForm(request.POST)
        form.is_valid()
        backfill_request_submit(actor=user, request_id=pk,
                                confirm_overlap=form.cleaned_data.get("confirm_overlap", False))
        return f"Request #{pk} submitted for approval."
    if verb in ("approve", "reject"):
        data = _cleaned(DecisionForm(request.POST), user, pk, verb)
        req = backfill_request_decide(actor=user, request_id=pk, approve=verb == "approve",
                                      comment=data.get("comment", ""))
        return f"You {'approved' if verb == 'approve' else 'rejected'} request #{pk}; it is now {req.status}."
    if verb == "cancel":
        data = _cleaned(ReasonForm(request.POST), user, pk, "cancel")
        backfill_request_cancel(actor=user, request_id=pk, reason=data.get("reason", ""))
        return f"Request #{pk} cancelled."
    if verb == "pause":
        request_pause(actor=user, request_id=pk)
        return f"Request #{pk} paused: running work finishes, nothing new is dispatched."
    if verb == "resume":
        request_resume(actor=user, request_id=pk)
        return f"Request #{pk} resumed."
    if verb == "retry":
        request_retry_failed(actor=user, request_id=pk)
        return f"Failed intervals of request #{pk} queued again."
    if verb == "rollback":
        data = _cleaned(RequestRollbackForm(request.POST), user, pk, "rollback")
        result = request_rollback(actor=user, request_id=pk, reason=data.get("reason", ""))
        text = (f"Request #{pk} rolled back: {len(result['partitions'])} partition(s) show their previous verified "
                f"version again; {len(result['consumers'])} consumer run(s) had read the rolled-back versions; "
                f"{len(result['impact'])} published partition(s) were built from them and are marked until rebuilt.")
        if result["restored_tainted"]:
            text += (f" {len(result['restored_tainted'])} partition(s) went back to versions that were themselves built "
                     "from a rolled-back input: they are marked again until a new rebuild replaces them.")
        if data.get("rebuild") and result["impact"]:
            try:
                filed = rollback_rebuild(actor=user, request_id=pk)
            except ApplicationError as exc:
                text += f" The rebuild was not filed: {exc.message}"
            else:
                text += (" Filed to rebuild them: " if filed.new else " Already filed to rebuild them: ") + ", ".join(f"#{r.pk} ({r.job.name})" for r in filed) + "."
        return text
    raise NotFound(f"unknown action {verb!r}")


def _action_view(verb: str):
    @login_required
    @application_errors
    @require_POST
    def view(request, pk: int):
        request_get(pk)  # a missing request is a 404 page, not a message on a page that cannot render
        try:
            text = _run_action(verb, request, pk)
        except ApplicationError as exc:
            status = flash_error(request, exc)
            return request_detail(request, pk, status=status,
                                  show_confirm_overlap=verb == "submit" and "confirm_overlap" in exc.fields)
        messages.success(request, text)
        return redirect_after_post(request, reverse("request-detail", args=[pk]))

    view.__name__ = f"request_{verb}"
    return view


request_submit = _action_view("submit")
request_approve = _action_view("approve")
request_reject = _action_view("reject")
request_cancel = _action_view("cancel")
request_pause_view = _action_view("pause")
request_resume_view = _action_view("resume")
request_retry_view = _action_view("retry")
request_rollback_view = _action_view("rollback")
