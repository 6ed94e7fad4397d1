"""Server-rendered pages (htmx). The API lives under /api/ (api_urls.py)."""
from django.contrib.auth import views as auth_views
from django.urls import path

from backfill_portal.backfills import views as backfills
from backfill_portal.catalog import views as catalog
from backfill_portal.core import views as core
from backfill_portal.execution import views as execution
from backfill_portal.warehouse import views as warehouse
import backfill_portal.core.converters  # noqa: F401  (registers <dataset:…> and <partition:…>)

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", core.home, name="home"),
    path("requests/", backfills.request_list, name="request-list"),
    path("requests/new/", backfills.request_new, name="request-new"),
    path("requests/preview/", backfills.request_preview, name="request-preview"),
    path("requests/<int:pk>/", backfills.request_detail, name="request-detail"),
    path("requests/<int:pk>/live/", backfills.request_live, name="request-live"),
    path("requests/<int:pk>/submit/", backfills.request_submit, name="request-submit"),
    path("requests/<int:pk>/approve/", backfills.request_approve, name="request-approve"),
    path("requests/<int:pk>/reject/", backfills.request_reject, name="request-reject"),
    path("requests/<int:pk>/cancel/", backfills.request_cancel, name="request-cancel"),
    path("requests/<int:pk>/pause/", backfills.request_pause_view, name="request-pause"),
    path("requests/<int:pk>/resume/", backfills.request_resume_view, name="request-resume"),
    path("requests/<int:pk>/retry/", backfills.request_retry_view, name="request-retry"),
    # Shadows the API's "request-rollback" name, as the other request actions do; nothing reverses it.
    path("requests/<int:pk>/rollback/", backfills.request_rollback_view, name="request-rollback"),
    path("requests/<int:pk>/reconciliation/", backfills.reconciliation, name="reconciliation"),
    path("requests/<int:pk>/reconciliation/rows/<int:row_pk>/explain/", backfills.reconciliation_explain,
         name="reconciliation-explain"),
    path("requests/<int:pk>/reconciliation/signoff/", backfills.reconciliation_signoff_view,
         name="reconciliation-signoff"),
    path("requests/<int:pk>/reconciliation/recompute/", backfills.reconciliation_recompute_view,
         name="reconciliation-recompute"),
    path("approvals/", backfills.approvals, name="approvals"),
    path("approvals/steps/<int:pk>/decide/", backfills.approval_step_decide_view, name="approval-step-decide"),
    path("approvals/handoffs/<int:pk>/decide/", backfills.handoff_decide_view, name="handoff-decide"),
    path("runs/<str:run_id>/", execution.run_detail, name="run-detail"),
    path("outbox/", execution.outbox, name="outbox"),
    path("catalog/", catalog.catalog, name="catalog"),
    path("catalog/jobs/<slug:name>/", catalog.job_detail, name="catalog-job"),
    path("lineage/", catalog.lineage, name="lineage"),
    path("datasets/<slug:name>/", warehouse.dataset_detail, name="dataset"),
    path("datasets/<dataset:name>/partitions/<partition:key>/", warehouse.partition_detail, name="partition"),
    # Not "partition-rollback"/"partition-rollback-rebuild": the API's names (warehouse/api.py reverses one).
    path("datasets/<dataset:name>/partitions/<partition:key>/rollback/", warehouse.partition_rollback_confirm,
         name="partition-rollback-confirm"),
    path("datasets/<dataset:name>/partitions/<partition:key>/rebuild-consumers/", warehouse.partition_rebuild_consumers,
         name="partition-rebuild-consumers"),
    path("audit/", core.audit, name="audit"),
]
