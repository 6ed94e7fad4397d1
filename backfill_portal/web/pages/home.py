"""Home page and the audit log pages."""
from __future__ import annotations

import json

from django.contrib.auth.decorators import login_required
from django.http import StreamingHttpResponse
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.selectors import handoffs_waiting_for, request_rows, steps_waiting_for
from backfill_portal.core.csv_export import csv_writer
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.web import keyset_page, query_without, render_page
from backfill_portal.web.forms.audit import AuditFilterForm
from backfill_portal.warehouse.models import Publication

HOME_ROWS = 10
HOME_RUNNING_ROWS = 20
HOME_WAITING_ROWS = 50
HOME_ROLLBACKS = 10


@login_required
def home(request):
    user = request.user
    return render_page(request, "core/home.html", {
        "my_requests": list(request_rows(user=user, mine=True).order_by("-id")[:HOME_ROWS]),
        "waiting": list(steps_waiting_for(user)[:HOME_WAITING_ROWS]),
        "running": list(request_rows().filter(status=RequestStatus.RUNNING).order_by("-id")[:HOME_RUNNING_ROWS]),
        "handoffs": list(handoffs_waiting_for(user)[:HOME_WAITING_ROWS]),
        "rollbacks": list(Publication.objects.filter(action=Publication.Action.ROLLBACK)
                          .select_related("dataset", "version__run", "previous_version__run", "actor")
                          .order_by("-id")[:HOME_ROLLBACKS]),
    })


# --- Audit ------------------------------------------------------------------------------


CSV_COLUMNS = ["id", "at", "actor", "action", "object_type", "object_id", "request_id", "dataset",
               "from_state", "to_state", "reason", "data", "prev_hash", "hash"]


class _Echo:
    def write(self, value):
        return value


def _csv_rows(qs):
    writer = csv_writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for e in qs.iterator(chunk_size=2000):
        yield writer.writerow([
            e.pk, e.at.isoformat(), e.actor_name, e.action, e.object_type, e.object_id,
            e.request_id, e.dataset, e.from_state, e.to_state, e.reason, json.dumps(e.data, sort_keys=True),
            e.prev_hash, e.hash,
        ])


@login_required
def audit(request):
    """Every authenticated role may read the audit log (as in the API)."""
    form = AuditFilterForm(request.GET or None)
    qs = form.filter(AuditEvent.objects.all()) if form.is_bound else AuditEvent.objects.all()
    if request.GET.get("format") == "csv":
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response = StreamingHttpResponse(_csv_rows(qs.order_by("-id")), content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
        return response
    page = keyset_page(qs, request.GET.get("before"))
    return render_page(request, "core/audit.html", {
        "form": form, "page": page,
        "keep_query": query_without(request, "before", "format"),
        "csv_query": query_without(request, "before", "format"),
    })
