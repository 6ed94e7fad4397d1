from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from backfill_portal.ops import views as ops

urlpatterns = [
    # Probes and scrapers: no session, no sign-in (see backfill_portal/ops/views.py).
    path("healthz", ops.healthz, name="healthz"),
    path("readyz", ops.readyz, name="readyz"),
    path("metrics", ops.metrics, name="metrics"),
    path("admin/", admin.site.urls),
    # Browsers ask for /favicon.ico on pages without a <link rel=icon> (the admin, raw files).
    path("favicon.ico", RedirectView.as_view(url=static("img/favicon.svg"), permanent=True)),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/", include("backfill_portal.api_urls")),
    path("", include("backfill_portal.web_urls")),
]

# JSON under /api/ (an id that matches no route is a 404 like a missing object), the
# pages' templates elsewhere. With DEBUG on Django bypasses handler404 for its debug
# page; core.middleware.ApiNotFoundMiddleware keeps /api/ in JSON then.
handler400 = "backfill_portal.core.api.bad_request"
handler404 = "backfill_portal.core.api.not_found"
handler500 = "backfill_portal.core.api.server_error"
