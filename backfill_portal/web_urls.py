"""Server-rendered pages (htmx). The API lives under /api/ (api_urls.py)."""
from django.contrib.auth import views as auth_views
from django.urls import path

from backfill_portal.web.forms.auth import SignInForm
from backfill_portal.web.pages import approvals, calendar, catalog, datasets, home, reconciliation, requests, runs, stale
import backfill_portal.core.converters  # noqa: F401  (registers <dataset:…> and <partition:…>)

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True, authentication_form=SignInForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", home.home, name="home"),
    path("requests/", requests.request_list, name="request-list"),
    path("requests/new/", requests.request_new, name="request-new"),
    path("requests/preview/", requests.request_preview, name="request-preview"),
    path("requests/<int:pk>/", requests.request_detail, name="request-detail"),
    path("requests/<int:pk>/live/", requests.request_live, name="request-live"),
    path("requests/<int:pk>/calendar/", calendar.request_calendar_page, name="request-calendar"),
    path("requests/<int:pk>/submit/", requests.request_submit, name="request-submit"),
    path("requests/<int:pk>/approve/", requests.request_approve, name="request-approve"),
    path("requests/<int:pk>/reject/", requests.request_reject, name="request-reject"),
    path("requests/<int:pk>/cancel/", requests.request_cancel, name="request-cancel"),
    path("requests/<int:pk>/pause/", requests.request_pause_view, name="request-pause"),
    path("requests/<int:pk>/resume/", requests.request_resume_view, name="request-resume"),
    path("requests/<int:pk>/retry/", requests.request_retry_view, name="request-retry"),
    # Shadows the API's "request-rollback" name, as the other request actions do; nothing reverses it.
    path("requests/<int:pk>/rollback/", requests.request_rollback_view, name="request-rollback"),
    path("requests/<int:pk>/reconciliation/", reconciliation.reconciliation, name="reconciliation"),
    path("requests/<int:pk>/reconciliation/rows/<int:row_pk>/explain/", reconciliation.reconciliation_explain,
         name="reconciliation-explain"),
    path("requests/<int:pk>/reconciliation/explain/", reconciliation.reconciliation_explain_many,
         name="reconciliation-explain-many"),
    path("requests/<int:pk>/reconciliation/signoff/", reconciliation.reconciliation_signoff_view,
         name="reconciliation-signoff"),
    path("requests/<int:pk>/reconciliation/recompute/", reconciliation.reconciliation_recompute_view,
         name="reconciliation-recompute"),
    path("approvals/", approvals.approvals, name="approvals"),
    path("approvals/requests/<int:pk>/", approvals.approval_review, name="approval-review"),
    path("approvals/steps/<int:pk>/decide/", approvals.approval_step_decide_view, name="approval-step-decide"),
    path("approvals/handoffs/<int:pk>/decide/", approvals.handoff_decide_view, name="handoff-decide"),
    path("runs/", runs.run_list, name="run-list"),
    path("runs/<str:run_id>/", runs.run_detail, name="run-detail"),
    path("outbox/", runs.outbox, name="outbox"),
    path("catalog/", catalog.catalog, name="catalog"),
    path("catalog/jobs/<slug:name>/", catalog.job_detail, name="catalog-job"),
    path("catalog/jobs/<slug:name>/stale/", stale.job_stale, name="catalog-job-stale"),
    path("catalog/jobs/<slug:name>/stale/draft/", stale.job_stale_draft, name="catalog-job-stale-draft"),
    path("lineage/", catalog.lineage, name="lineage"),
    path("datasets/<slug:name>/", datasets.dataset_detail, name="dataset"),
    path("datasets/<dataset:name>/partitions/<partition:key>/", datasets.partition_detail, name="partition"),
    # Not "partition-rollback"/"partition-rollback-rebuild": the API's names (web/api/partitions.py reverses one).
    path("datasets/<dataset:name>/partitions/<partition:key>/rollback/", datasets.partition_rollback_confirm,
         name="partition-rollback-confirm"),
    path("datasets/<dataset:name>/partitions/<partition:key>/rebuild-consumers/", datasets.partition_rebuild_consumers,
         name="partition-rebuild-consumers"),
    path("audit/", home.audit, name="audit"),
]
