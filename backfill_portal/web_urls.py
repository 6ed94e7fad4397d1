"""Server-rendered pages (htmx). The API lives under /api/ (api_urls.py)."""
from django.contrib.auth import views as auth_views
from django.urls import path

from backfill_portal.backfills import views as backfills
from backfill_portal.catalog import views as catalog
from backfill_portal.core import views as core
from backfill_portal.execution import views as execution

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
    path("runs/<str:run_id>/", execution.run_detail, name="run-detail"),
    path("catalog/", catalog.catalog, name="catalog"),
    path("catalog/jobs/<slug:name>/", catalog.job_detail, name="catalog-job"),
    path("audit/", core.audit, name="audit"),
]
