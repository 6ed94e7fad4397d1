"""The approvals inbox: steps and hand-offs waiting for the user, decided inline."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, prefetch_related_objects
from django.http import HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from backfill_portal.backfills.policy import require_decide_handoff, require_decide_step
from backfill_portal.web.forms import cleaned
from backfill_portal.web.forms.requests import DecisionForm, HandoffDecisionForm
from backfill_portal.backfills.models import ApprovalStep, BackfillRequest, HandoffItem, Interval
from backfill_portal.backfills.selectors import handoffs_waiting_for, steps_waiting_for
from backfill_portal.backfills.services.handoff import handoff_accept, handoff_decline
from backfill_portal.backfills.services.requests import approval_step_decide
from backfill_portal.catalog.lineage import LineageGraph
from backfill_portal.web.picture import lineage_picture
from backfill_portal.core.errors import ApplicationError, NotFound, ValidationError
from backfill_portal.core.web import (
    application_errors,
    error_status,
    is_htmx,
    redirect_after_post,
    render_page,
)
from backfill_portal.web.context_processors import inbox_count

INBOX_MAX_STEPS = 200
INBOX_MAX_HANDOFFS = 100


def _inbox_groups(user, steps: list[ApprovalStep], extra: list[BackfillRequest] = ()) -> list[dict]:
    """One card per request: its plan summary, the small lineage picture, the steps.
    Three queries whatever the number of cards: the lineage cache check, the side
    effects (prefetched) and the planned interval counts (one GROUP BY)."""
    groups: dict[int, dict] = {}
    for step in steps:
        groups.setdefault(step.request_id, {"req": step.request, "steps": []})["steps"].append(step)
    for req in extra:
        groups.setdefault(req.pk, {"req": req, "steps": []})
    if not groups:
        return []
    reqs = [g["req"] for g in groups.values()]
    prefetch_related_objects(reqs, "side_effects", "code_version")
    totals = dict(Interval.objects.filter(request_id__in=list(groups)).values_list("request_id")
                  .annotate(n=Count("id")).order_by())
    graph = LineageGraph.cached()
    for pk, group in groups.items():
        req = group["req"]
        group["total"] = totals.get(pk, 0)
        group["effects"] = sorted(j.name for j in req.side_effects.all())
        group["downstream"] = sorted((req.node_actions or {}).items())
        group["picture"] = lineage_picture(graph, req=req, compact=True, uid=f"ln-req{pk}") \
            if req.job.name in graph.jobs else None
    return list(groups.values())


def _step_form(step: ApprovalStep, data=None) -> DecisionForm:
    return DecisionForm(data, auto_id=f"step{step.pk}_%s")


def _handoff_form(item: HandoffItem, data=None) -> HandoffDecisionForm:
    return HandoffDecisionForm(data, auto_id=f"handoff{item.pk}_%s")


def _attach_forms(groups: list[dict], handoffs: list[HandoffItem], bound: dict) -> None:
    for group in groups:
        group["forms"] = [(s, bound.get(("step", s.pk)) or _step_form(s)) for s in group["steps"]]
    for item in handoffs:
        item.form = bound.get(("handoff", item.pk)) or _handoff_form(item)


def _render_inbox(request, *, bound: dict | None = None, status: int = 200) -> HttpResponse:
    user = request.user
    steps = list(steps_waiting_for(user)[:INBOX_MAX_STEPS])
    handoffs = list(handoffs_waiting_for(user)[:INBOX_MAX_HANDOFFS])
    groups = _inbox_groups(user, steps)
    bound = bound or {}
    _attach_forms(groups, handoffs, bound)
    shown = {("step", s.pk) for s in steps} | {("handoff", h.pk) for h in handoffs}
    for key, form in bound.items():
        if key not in shown:  # a refusal about something not in my inbox: say it at the top
            for errors in form.errors.values():
                for text in errors:
                    messages.error(request, text)
    return render_page(request, "backfills/approvals.html", {
        "groups": groups, "handoffs": handoffs, "n_steps": len(steps),
        "more_steps": len(steps) >= INBOX_MAX_STEPS,
    }, status=status)


@login_required
@application_errors
def approval_review(request, pk: int):
    """What the approver approves (execution/review.py): the code version and its diff
    against what produced the published partitions, the first interval's rendered SQL,
    the estimated work and the partitions that will change; my pending steps' forms."""
    from backfill_portal.execution.review import request_review

    req = _object_or_404(BackfillRequest.objects.select_related(
        "job__dataset__owner", "requested_by", "code_version"), pk, "request")
    steps = list(steps_waiting_for(request.user).filter(request=req))
    groups = _inbox_groups(request.user, steps, extra=[req])
    _attach_forms(groups, [], {})
    return render_page(request, "backfills/approval_review.html", {
        "req": req, "g": groups[0], "review": request_review(req), "review_page": True,
    })


@login_required
def approvals(request):
    """The approvals inbox: steps waiting for me with the plan and its lineage, and my
    pending hand-off items."""
    return _render_inbox(request)


def _card_response(request, req: BackfillRequest, *, alert: dict, bound: dict, status: int) -> HttpResponse:
    """An htmx answer: the request's card again (what is left for me to decide, and what
    just happened), plus the nav badge out of band."""
    steps = [s for s in steps_waiting_for(request.user).filter(request=req)]
    groups = _inbox_groups(request.user, steps, extra=[req])
    _attach_forms(groups, [], bound)
    return render(request, "backfills/partials/_inbox_request.html", {
        "g": groups[0], "alert": alert, "oob_count": True, "nav_inbox": inbox_count(request.user),
    }, status=status)


def _handoff_response(request, item: HandoffItem, *, alert: dict, bound: dict, status: int) -> HttpResponse:
    item.refresh_from_db()
    _attach_forms([], [item], bound)
    return render(request, "backfills/partials/_inbox_handoff.html", {
        "item": item, "alert": alert, "oob_count": True, "nav_inbox": inbox_count(request.user),
    }, status=status)


def form_errors(form, exc: ApplicationError, field: str) -> None:
    if field in exc.fields:
        for text in exc.fields[field]:
            if text not in form.errors.get(field, ()):  # the form's own errors are there already
                form.add_error(field, text)
    else:
        form.add_error(None, exc.message)


@login_required
@application_errors
@require_POST
def approval_step_decide_view(request, pk: int):
    """Approve or reject one step (approval_step_decide, the API's service); a refusal
    is shown on the step's form with its status (400 no comment, 403 not yours, 409
    already decided)."""
    step = _object_or_404(ApprovalStep.objects.select_related(
        "request__job__dataset", "request__requested_by", "dataset", "job", "approver"), pk, "approval step")
    form = _step_form(step, request.POST)
    decision = request.POST.get("decision")
    try:
        data = cleaned(form, permission=lambda: require_decide_step(request.user, step, approve=decision != "reject"))
        if decision not in ("approve", "reject"):
            raise ValidationError("choose Approve or Reject")
        approval_step_decide(actor=request.user, step=step, approve=decision == "approve",
                             comment=data.get("comment", ""))
    except ApplicationError as exc:
        return _refused(request, exc, form, ("step", step.pk),
                        lambda **kw: _card_response(request, step.request, **kw))
    req = BackfillRequest.objects.select_related("job__dataset", "requested_by").get(pk=step.request_id)
    verb = "approved" if decision == "approve" else "rejected"
    text = f"You {verb} the {step.get_kind_display().lower()} step of request #{req.pk}; the request is now {req.status}."
    return _decided(request, text, lambda **kw: _card_response(request, req, **kw))


def _object_or_404(queryset, pk: int, what: str):
    found = queryset.filter(pk=pk).first()
    if found is None:
        raise NotFound(f"{what} {pk} does not exist")
    return found


def _refused(request, exc: ApplicationError, form, key: tuple, card) -> HttpResponse:
    """A refused decision: the errors on its form, the card again (htmx) or the inbox,
    with the refusal's status (400, 403 or 409)."""
    form_errors(form, exc, "comment")
    status = error_status(exc)
    if is_htmx(request):
        return card(bound={key: form}, status=status, alert={"level": "error", "text": exc.message})
    return _render_inbox(request, bound={key: form}, status=status)


def _decided(request, text: str, card) -> HttpResponse:
    if is_htmx(request):
        return card(bound={}, status=200, alert={"level": "success", "text": text})
    messages.success(request, text)
    return redirect_after_post(request, reverse("approvals"))


@login_required
@application_errors
@require_POST
def handoff_decide_view(request, pk: int):
    """Accept (files a linked cascade request in my name) or decline (with a comment)."""
    item = _object_or_404(HandoffItem.objects.select_related(
        "request__job__dataset", "request__requested_by", "job__dataset", "owner"), pk, "hand-off item")
    form = _handoff_form(item, request.POST)
    decision = request.POST.get("decision")
    try:
        comment = cleaned(form, permission=lambda: require_decide_handoff(
            request.user, item, to="declined" if decision == "decline" else "accepted")).get("comment", "")
        if decision == "accept":
            done = handoff_accept(actor=request.user, item_id=item.pk, comment=comment)
            text = f"Accepted: request #{done.follow_up_id} rebuilds {item.job.name} and is waiting for approval."
        elif decision == "decline":
            handoff_decline(actor=request.user, item_id=item.pk, comment=comment)
            text = f"Declined: {item.job.name} stays on its current version."
        else:
            raise ValidationError("choose Accept or Decline")
    except ApplicationError as exc:
        return _refused(request, exc, form, ("handoff", item.pk),
                        lambda **kw: _handoff_response(request, item, **kw))
    return _decided(request, text, lambda **kw: _handoff_response(request, item, **kw))
