from django.urls import path
from rest_framework.routers import DefaultRouter

from backfill_portal.web.api.requests import RequestViewSet
from backfill_portal.web.api.governance import ApprovalStepViewSet, HandoffViewSet
from backfill_portal.web.api.catalog import DatasetViewSet, JobViewSet, lineage
from backfill_portal.web.api.audit_and_tokens import AuditEventViewSet, TokenObtainView, TokenRevokeView
from backfill_portal.web.api.runs import RunViewSet
from backfill_portal.web.api.partitions import partition_detail, partition_rollback_rebuild_view, partition_rollback_view
import backfill_portal.core.converters  # noqa: F401  (registers <dataset:…> and <partition:…>)

router = DefaultRouter()
router.register("datasets", DatasetViewSet, basename="api-dataset")
router.register("jobs", JobViewSet, basename="api-job")
router.register("requests", RequestViewSet, basename="api-request")
router.register("runs", RunViewSet, basename="api-run")
router.register("audit", AuditEventViewSet, basename="api-audit")
router.register("approvals", ApprovalStepViewSet, basename="api-approval")
router.register("handoffs", HandoffViewSet, basename="api-handoff")

urlpatterns = [
    path("auth/token/", TokenObtainView.as_view(), name="auth-token"),
    path("auth/token/revoke/", TokenRevokeView.as_view(), name="auth-token-revoke"),
    path("datasets/<dataset:name>/partitions/<partition:key>/", partition_detail, name="partition-detail"),
    path("datasets/<dataset:name>/partitions/<partition:key>/rollback/", partition_rollback_view, name="partition-rollback"),
    path("datasets/<dataset:name>/partitions/<partition:key>/rollback/rebuild/", partition_rollback_rebuild_view,
         name="partition-rollback-rebuild"),
    path("lineage/", lineage, name="lineage"),
    *router.urls,
]
