"""The reconciliation page: the four numbers per interval, explanations, sign-off,
and the rows chart."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.web.forms.requests import ExplainForm, SignoffForm
from backfill_portal.backfills.models import BackfillRequest, Reconciliation, ReconciliationRow
from backfill_portal.backfills.policy import may_review, may_sign_off, require_request_action
from backfill_portal.web.forms import cleaned
from backfill_portal.backfills.selectors import request_get
from backfill_portal.catalog.tolerances import BASELINE_WINDOW
from backfill_portal.web.pages.approvals import form_errors
from backfill_portal.core.errors import ApplicationError, NotFound
from backfill_portal.core.web import (
    application_errors,
    error_status,
    flash_error,
    is_htmx,
    parse_int,
    redirect_after_post,
    render_page,
)

RECON_ROWS_PER_PAGE = 500
_NOT_RUN_YET = (RequestStatus.DRAFT, RequestStatus.PENDING_APPROVAL, RequestStatus.APPROVED, RequestStatus.REJECTED)
VERDICT_FILTERS = ("unexplained", "explained", "matched", "skipped")


def _verdict_counts(req: BackfillRequest) -> dict[str, int]:
    counts = dict(ReconciliationRow.objects.filter(request=req).values_list("verdict").annotate(n=Count("id"))
                  .order_by())
    return {v: counts.get(v, 0) for v in VERDICT_FILTERS}


def _signoff_context(user, req: BackfillRequest, recon, counts: dict) -> dict:
    decision = may_sign_off(user, req)
    allowed, why = decision.allowed, decision.note
    blocked = ""
    if req.status != RequestStatus.RECONCILING:
        blocked = f"The request is {req.status}; only a reconciling request is signed off."
    elif counts["unexplained"]:
        blocked = (f"{counts['unexplained']} interval{'s are' if counts['unexplained'] != 1 else ' is'} unexplained: "
                   "explain every difference before signing off.")
    return {"signoff_allowed": allowed, "signoff_why": why, "signoff_blocked": blocked,
            "signed": recon is not None and recon.signed_off_at is not None}


def _chart_series(rows: list) -> list[dict]:
    """Per job: rows before (grey bar), after (blue bar) and baseline (dashed line) per
    interval, as SVG coordinates computed here (no charting library)."""
    by_job: dict[str, list] = {}
    for row in rows:
        by_job.setdefault(row.job.name, []).append(row)
    charts = []
    for job, items in by_job.items():
        values = [v for r in items for v in (r.rows_before, r.rows_after, r.rows_baseline) if v is not None]
        top = _nice_ceiling(max(values, default=0) or 1)
        n = len(items)
        slot = max(6, min(64, 880 // max(n, 1)))
        left, plot_h, pad_top = 64, 180, 12
        width = left + slot * n + 16
        def y(v):
            return round(pad_top + plot_h - (v / top) * plot_h, 1)

        bars, baseline_pts, labels = [], [], []
        every = max(1, n // 12)
        for i, r in enumerate(items):
            x = left + i * slot
            bar = {"x": x + slot * 0.1, "w": slot * 0.8, "xa": x + slot * 0.28, "wa": slot * 0.44, "row": r}
            if r.rows_before is not None:
                bar["yb"], bar["hb"] = y(r.rows_before), round(plot_h + pad_top - y(r.rows_before), 1)
            if r.rows_after is not None:
                bar["ya"], bar["ha"] = y(r.rows_after), round(plot_h + pad_top - y(r.rows_after), 1)
            bars.append(bar)
            if r.rows_baseline is not None:
                baseline_pts.append((round(x + slot / 2, 1), y(r.rows_baseline)))
            if i % every == 0:
                labels.append({"x": round(x + slot / 2, 1), "text": r.partition_key[-5:] if len(r.partition_key) == 10
                               else r.partition_key})
        ticks = [{"y": y(top * k / 4), "text": _short_number(top * k / 4)} for k in range(5)]
        charts.append({
            "job": job, "bars": bars, "width": width, "height": pad_top + plot_h + 28, "left": left,
            "axis_y": pad_top + plot_h, "right": width - 8, "ticks": ticks, "labels": labels,
            "label_y": pad_top + plot_h + 18,
            "baseline": " ".join(f"{px},{py}" for px, py in baseline_pts), "baseline_pts": baseline_pts,
            "desc": _chart_desc(job, items),
        })
    return charts


def _nice_ceiling(value: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten at or above value."""
    import math

    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * exp >= value:
            return step * exp
    return 10 * exp


def _short_number(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


def _chart_desc(job: str, rows: list) -> str:
    parts = []
    for r in rows[:40]:
        base = f", baseline {r.rows_baseline:g}" if r.rows_baseline is not None else ""
        parts.append(f"{r.partition_key}: before {r.rows_before if r.rows_before is not None else 'none'}, "
                     f"after {r.rows_after if r.rows_after is not None else 'none'}{base}")
    more = f"; and {len(rows) - 40} more intervals" if len(rows) > 40 else ""
    return f"Rows per interval of {job}: " + "; ".join(parts) + more + "."


def _recon_or_none(req: BackfillRequest):
    """The stored reconciliation; computed the first time it is read (as the API does),
    once something ran."""
    from backfill_portal.recovery.reconciliation import reconciliation_get

    if req.status in _NOT_RUN_YET:
        return None
    return reconciliation_get(request_id=req.pk)


@login_required
@application_errors
def reconciliation(request, pk: int, *, status: int = 200, bound: dict | None = None):
    """The manifest, the four numbers per interval (500 a page, filterable by verdict),
    explain forms, sign-off and a chart of rows before/after/baseline."""
    from backfill_portal.recovery.reconciliation import manifest_now, reconciliation_rows

    req = request_get(pk)
    recon = _recon_or_none(req)
    rows, counts, after, next_after, verdict = [], {v: 0 for v in VERDICT_FILTERS}, None, None, ""
    if recon is not None:
        verdict = request.GET.get("verdict", "")
        verdict = verdict if verdict in VERDICT_FILTERS else ""  # anything else: every row, said so
        qs = reconciliation_rows(recon, verdict=verdict)
        after = parse_int(request.GET.get("after"))
        if after is not None:
            qs = qs.filter(pk__gt=after)
        rows = list(qs.order_by("pk")[: RECON_ROWS_PER_PAGE + 1])  # rows are created in (job, position) order
        if len(rows) > RECON_ROWS_PER_PAGE:
            rows = rows[:RECON_ROWS_PER_PAGE]
            next_after = rows[-1].pk
        counts = _verdict_counts(req)
    # Who may review: backfills.policy (the requester, the owner of any dataset the
    # request rebuilds, on-call, admins), which the services ask too.
    reviewer = may_review(request.user, req).allowed
    can_explain = reviewer and req.status == RequestStatus.RECONCILING
    for row in rows:
        row.form = (bound or {}).get(row.pk) or _explain_form(row)
    # What a rollback changed read now, not when the numbers were computed (or signed
    # off): a rollback after the sign-off must still be named.
    manifest = manifest_now(req, recon.manifest) if recon is not None else {}
    return render_page(request, "backfills/reconciliation.html", {
        "req": req, "recon": recon, "rows": rows, "counts": counts, "verdict": verdict,
        "after": after, "next_after": next_after, "per_page": RECON_ROWS_PER_PAGE,
        "multi_job": len({r.job_id for r in rows}) > 1 or bool(req.node_actions),
        "manifest": manifest,
        "exceptions": [(name.replace("_", " "), items) for name, items in (manifest.get("exceptions") or {}).items()],
        "explain_many_form": ExplainForm(auto_id="many_%s"),
        "charts": _chart_series(rows), "can_explain": can_explain,
        "can_recompute": reviewer and recon is not None and recon.signed_off_at is None,
        "baseline_window": BASELINE_WINDOW,
        "signoff_form": SignoffForm(), **_signoff_context(request.user, req, recon, counts),
    }, status=status)


def _explain_form(row, data=None) -> ExplainForm:
    return ExplainForm(data, auto_id=f"row{row.pk}_%s", initial={"explanation": row.explanation, "job": row.job.name})


@login_required
@application_errors
@require_POST
def reconciliation_explain(request, pk: int, row_pk: int):
    """One interval's explanation (interval_explain). htmx gets the row back, plus the
    verdict counts and the sign-off panel out of band; a refusal stays on the row."""
    from backfill_portal.recovery.reconciliation import interval_explain

    req = request_get(pk)
    row = ReconciliationRow.objects.select_related("job", "dataset", "explained_by").filter(
        pk=row_pk, request=req).first()
    if row is None:
        raise NotFound(f"request #{pk} has no reconciliation row {row_pk} (recomputed since?); reload the page")
    form = _explain_form(row, request.POST)
    status, notice = 200, ""
    try:
        data = cleaned(form, permission=lambda: require_request_action(request.user, req, "explain"))
        interval_explain(actor=request.user, request_id=req.pk, partition_key=row.partition_key,
                         explanation=data.get("explanation", ""), job=row.job.name)
    except ApplicationError as exc:
        form_errors(form, exc, "explanation")
        status = error_status(exc)
        if status == 403 and not is_htmx(request):
            flash_error(request, exc)  # whoever may not explain is not shown the row's form to carry it
    else:
        row = ReconciliationRow.objects.select_related("job", "dataset", "explained_by").get(pk=row.pk)
        notice = f"Saved: {row.partition_key} is {row.verdict}."
        form = _explain_form(row)
    if not is_htmx(request):
        if status != 200:
            return reconciliation(request, pk, status=status, bound={row.pk: form})
        messages.success(request, notice)
        return redirect_after_post(request, reverse("reconciliation", args=[pk]) + f"#rec-row-{row.pk}")
    row.form = form
    recon = Reconciliation.objects.filter(request=req).select_related("signed_off_by").first()
    counts = _verdict_counts(req)
    return render(request, "backfills/partials/_reconciliation_row_response.html", {
        "req": req, "row": row, "recon": recon, "counts": counts, "notice": notice,
        "multi_job": bool(req.node_actions), "can_explain": True, "oob": True,
        "signoff_form": SignoffForm(), **_signoff_context(request.user, req, recon, counts),
    }, status=status)


@login_required
@application_errors
@require_POST
def reconciliation_signoff_view(request, pk: int):
    from backfill_portal.recovery.reconciliation import reconciliation_signoff

    req = request_get(pk)
    try:
        data = cleaned(SignoffForm(request.POST), permission=lambda: require_request_action(request.user, req, "signoff"))
        req = reconciliation_signoff(actor=request.user, request_id=pk, comment=data.get("comment", ""))
    except ApplicationError as exc:
        return reconciliation(request, pk, status=flash_error(request, exc))
    messages.success(request, f"Signed off: request #{req.pk} is {req.status}.")
    return redirect_after_post(request, reverse("reconciliation", args=[pk]))


@login_required
@application_errors
@require_POST
def reconciliation_recompute_view(request, pk: int):
    from backfill_portal.recovery.reconciliation import reconciliation_recompute

    request_get(pk)
    try:
        reconciliation_recompute(actor=request.user, request_id=pk)
    except ApplicationError as exc:
        return reconciliation(request, pk, status=flash_error(request, exc))
    messages.success(request, "Recomputed from the warehouse; explanations already written are kept.")
    return redirect_after_post(request, reverse("reconciliation", args=[pk]))


@login_required
@application_errors
@require_POST
def reconciliation_explain_many(request, pk: int):
    """One explanation for several intervals (intervals_explain): the ticked ones
    (`intervals` = "job|partition"), or every unexplained one (`scope=unexplained`)."""
    from backfill_portal.recovery.reconciliation import intervals_explain

    req = request_get(pk)
    form = ExplainForm(request.POST)
    if request.POST.get("scope") == "unexplained":
        picked = list(ReconciliationRow.objects.filter(request=req, verdict="unexplained")
                      .order_by("job_id", "position").values_list("job__name", "partition_key"))
    else:
        picked = [tuple(value.split("|", 1)) for value in request.POST.getlist("intervals") if "|" in value]
    try:
        data = cleaned(form, permission=lambda: require_request_action(request.user, req, "explain"))
        rows = intervals_explain(actor=request.user, request_id=req.pk, intervals=picked,
                                 explanation=data.get("explanation", ""))
    except ApplicationError as exc:
        return reconciliation(request, pk, status=flash_error(request, exc))
    messages.success(request, f"Saved one explanation for {len(rows)} interval{'s' if len(rows) != 1 else ''}.")
    return redirect_after_post(request, reverse("reconciliation", args=[pk]))
