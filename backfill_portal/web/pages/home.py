"""Home page and the audit log pages."""
from __future__ import annotations

import json
import threading

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db.models import Max
from django.http import StreamingHttpResponse
from django.utils import timezone

from backfill_portal.backfills.choices import RequestStatus
from backfill_portal.backfills.policy import may_create
from backfill_portal.backfills.selectors import handoffs_waiting_for, request_rows, steps_waiting_for
from backfill_portal.catalog.models import Dataset
from backfill_portal.core.csv_export import csv_writer
from backfill_portal.core.models import AuditEvent
from backfill_portal.core.roles import Role, has_role
from backfill_portal.core.services.audit import audit_events_newest_first, audit_events_read
from backfill_portal.core.web import KeysetPage, keyset_page, query_without, render_page
from backfill_portal.execution.anomalies import partition_anomalies
from backfill_portal.web.context_processors import inbox_count
from backfill_portal.web.forms.audit import AuditFilterForm
from backfill_portal.execution.selectors import run_row_list, run_row_values, runs_failing, runs_stuck
from backfill_portal.recovery.rollback import closure_entries
from backfill_portal.warehouse.models import Contamination, Publication

HOME_ROWS = 10
HOME_RUNNING_ROWS = 20
HOME_WAITING_ROWS = 50
HOME_ROLLBACKS = 10
HOME_ATTENTION_ROWS = 20
# Closure entries read to find the partitions still built from a rolled-back input.
HOME_CLOSURE_SCAN = 200
# The columns the home's panels show, and no more: compiling a query hashes every column
# it selects (Django's ORDER BY resolution), and the inbox's five joined tables were ~80.
WAITING_FIELDS = ("kind", "request_id", "job__name", "dataset__name", "request__first_partition",
                  "request__last_partition", "request__interval_count", "request__reason",
                  "request__requested_by__username")
HANDOFF_FIELDS = ("request_id", "job__name", "first_partition", "last_partition", "deadline")
ROLLBACK_FIELDS = ("dataset__name", "partition_key", "version__run__run_id", "previous_version__run__run_id",
                   "actor__username", "published_at", "request_id", "reason")


@login_required
def home(request):
    """One home per role, panels stacked for a user with several: on-call first (what
    is broken now), then the owner's inbox and datasets, then the requester's own
    requests; everyone sees what runs and what was rolled back. The auditor, who
    changes nothing, is offered nothing to file."""
    user = request.user
    oncall = has_role(user, Role.ONCALL, Role.ADMIN)
    owned = list(Dataset.objects.filter(owner=user, is_source=False).order_by("name"))
    # The navigation counts the inbox anyway; counted here once, it also tells whether
    # the inbox's two panels have anything to read (on-call's usually do not).
    inbox = inbox_count(user)
    ctx = {
        "nav_inbox": inbox,
        "oncall": oncall, "owner": bool(owned) or has_role(user, Role.OWNER),
        "auditor": has_role(user, Role.AUDITOR) and not may_create(user),
        "my_requests": list(request_rows(user=user, mine=True).order_by("-id")[:HOME_ROWS]) if may_create(user)
        else [],
        "waiting": list(steps_waiting_for(user).select_related(None)
                        .select_related("request__requested_by", "dataset", "job").only(*WAITING_FIELDS)
                        [:HOME_WAITING_ROWS]) if inbox else [],
        "running": list(request_rows().filter(status=RequestStatus.RUNNING).order_by("-id")[:HOME_RUNNING_ROWS]),
        "handoffs": list(handoffs_waiting_for(user).select_related(None).select_related("job")
                         .only(*HANDOFF_FIELDS)[:HOME_WAITING_ROWS]) if inbox else [],
        "rollbacks": list(Publication.objects.filter(action=Publication.Action.ROLLBACK)
                          .select_related("dataset", "version__run", "previous_version__run", "actor")
                          .only(*ROLLBACK_FIELDS).order_by("-id")[:HOME_ROLLBACKS]),
        "anomalies": partition_anomalies(),
    }
    contaminated = _contaminated_now() if oncall or owned else []
    if oncall:
        ctx.update({
            "failing": list(run_row_values(runs_failing(run_row_list()).order_by("-id"))[:HOME_ATTENTION_ROWS]),
            "stuck": list(run_row_values(runs_stuck(run_row_list()).order_by("moved_at", "id"))
                          [:HOME_ATTENTION_ROWS]),
            "stuck_minutes": settings.RUN_STUCK_AFTER_SECONDS // 60,
            "contaminated": contaminated[:HOME_ATTENTION_ROWS],
            "reconciling": list(request_rows().filter(status=RequestStatus.RECONCILING)
                                .order_by("id")[:HOME_ATTENTION_ROWS]),
        })
    if owned:
        failing = list(run_row_values(runs_failing(run_row_list().filter(job__dataset__in=owned)).order_by("-id"))
                       [:HOME_CLOSURE_SCAN])
        ctx["health"] = _dataset_health(owned, failing, contaminated)
    return render_page(request, "core/home.html", ctx)


def _contaminated_now() -> list[dict]:
    """Partitions readers still see built from a rolled-back input (closure entries
    whose version is current), newest rollback first, one entry per partition."""
    ids = list(Contamination.objects.order_by("-id").values_list("pk", flat=True)[:HOME_CLOSURE_SCAN])
    if not ids:
        return []
    seen, out = set(), []
    for entry in closure_entries(Contamination.objects.filter(pk__in=ids)):
        key = (entry["dataset"], entry["partition_key"])
        if entry["state"] == "pending" and key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def _dataset_health(owned: list[Dataset], failing: list, contaminated: list[dict]) -> list[dict]:
    """Per owned dataset: its unrepaired failed runs, its partitions built from a
    rolled-back input, its last publication; one query for the last publications."""
    last = dict(Publication.objects.filter(dataset__in=owned, action=Publication.Action.PUBLISH).order_by()
                .values("dataset_id").annotate(at=Max("published_at")).values_list("dataset_id", "at"))
    rows = []
    for ds in owned:
        fails = [r for r in failing if r["job__dataset_id"] == ds.pk]
        marks = [c for c in contaminated if c["dataset"] == ds.name]
        state = "failing" if fails else "contaminated" if marks else "healthy" if last.get(ds.pk) else "empty"
        rows.append({"dataset": ds, "failing": fails[:3], "n_failing": len(fails), "contaminated": marks[:3],
                     "n_contaminated": len(marks), "last_published": last.get(ds.pk), "state": state})
    return rows


# --- Audit ------------------------------------------------------------------------------


# key_id last: columns are only ever added at the end, for readers that go by position.
CSV_COLUMNS = ["id", "at", "actor", "action", "object_type", "object_id", "request_id", "dataset",
               "from_state", "to_state", "reason", "data", "prev_hash", "hash", "key_id"]


class _Echo:
    def write(self, value):
        return value


# Exports streaming at once in this process. A whole log's export holds a database
# connection for as long as it streams (18 s for 426,000 events); five at once took
# every pooled connection, and the pages, the API and /readyz answered 503 (scale QA).
EXPORTS_AT_ONCE = 1
_exports = threading.BoundedSemaphore(EXPORTS_AT_ONCE)
EXPORT_BUSY_RETRY_SECONDS = 30


class _ReleasedWhenClosed:
    """An export's rows; closing it (Django closes a streamed response's content when the
    response is closed: sent, or the client gone, even before the first row) releases
    the export's slot once."""

    def __init__(self, rows, release):
        self._rows, self._release = rows, release

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._rows)

    def close(self):
        release, self._release = self._release, None
        self._rows.close()
        if release is not None:
            release()


def _csv_rows(qs):
    """Every event of `qs`, an edited one too: a timestamp that is not a time is written
    as the text stored (verify_audit names that event as altered)."""
    writer = csv_writer(_Echo())
    yield writer.writerow(CSV_COLUMNS)
    for e in audit_events_read(qs):
        at = e.at.isoformat() if e.at_unreadable is None else e.at_unreadable
        yield writer.writerow([
            e.pk, at, e.actor_name, e.action, e.object_type, e.object_id,
            e.request_id, e.dataset, e.from_state, e.to_state, e.reason, json.dumps(e.data, sort_keys=True),
            e.prev_hash, e.hash, e.key_id,
        ])


@login_required
def audit(request):
    """Every authenticated role may read the audit log (as in the API). Bad filters are
    a 400 that names the field, the CSV export's too (as the runs list and the API)."""
    form = AuditFilterForm(request.GET or None)
    ctx = {"form": form, "keep_query": query_without(request, "before", "format")}
    if form.is_bound and not form.is_valid():
        return render_page(request, "core/audit.html", {**ctx, "page": None}, status=400)
    qs = form.filter(AuditEvent.objects.all()) if form.is_bound else AuditEvent.objects.all()
    if request.GET.get("format") == "csv":
        if not _exports.acquire(blocking=False):
            busy = render_page(request, "core/audit.html", {**ctx, "page": None, "export_busy": True}, status=429)
            busy["Retry-After"] = str(EXPORT_BUSY_RETRY_SECONDS)
            return busy
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response = StreamingHttpResponse(_ReleasedWhenClosed(_csv_rows(qs.order_by("-id")), _exports.release),
                                         content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="audit-{stamp}.csv"'
        return response
    # The page's ids first, then its events read as the CSV reads them: on SQLite an
    # event whose timestamp was edited into text that is not a time made the whole page
    # a 500; it is shown with the stored text, flagged (verify_audit names it).
    ids = keyset_page(qs.values("pk"), request.GET.get("before"))
    rows = audit_events_newest_first(r["pk"] for r in ids.rows)
    return render_page(request, "core/audit.html", {
        **ctx, "page": KeysetPage(rows=rows, next_before=ids.next_before, before=ids.before)})
