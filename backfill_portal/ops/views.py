"""/healthz (liveness), /readyz (readiness), /metrics (Prometheus)."""
from __future__ import annotations

import hmac
import re

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client.exposition import choose_encoder

from backfill_portal.ops.health import readiness
from backfill_portal.ops.metrics import registry

LOOPBACK = {"127.0.0.1", "::1"}
# A header a proxy sets with the client's address: a loopback call carrying one was
# relayed from elsewhere (RFC 7239's Forwarded, X-Forwarded-For, X-Real-IP, and the
# CDNs' and load balancers' own: True-Client-IP, CF-Connecting-IP, X-Client-IP,
# X-Cluster-Client-IP, Fastly-Client-IP, X-Original-Forwarded-For, ...).
RELAYED = re.compile(r"forwarded|client-ip|connecting-ip|real-ip", re.IGNORECASE)


@csrf_exempt  # changes nothing: another method is its 405, not the CSRF page's 403
@never_cache
@require_safe  # GET, and HEAD for the load balancers and uptime checks that probe with it
def healthz(request):
    """Liveness: the process answers. Touches nothing else, so a database outage does
    not get every web process restarted."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@never_cache
@require_safe
def readyz(request):
    """Readiness: 200 when the database, the warehouse and the broker are all reachable,
    else 503 naming the ones that are not."""
    checks = readiness()
    failed = sorted(name for name, result in checks.items() if not result["ok"])
    body = {"status": "unavailable" if failed else "ok", "failed": failed, "checks": checks}
    return JsonResponse(body, status=503 if failed else 200)


def metrics_refusal(request) -> HttpResponse | None:
    """None when the caller may scrape; else the 401/403 to answer."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        response = JsonResponse({"detail": "metrics need Authorization: Bearer <METRICS_TOKEN>"}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    relayed = any(RELAYED.search(name) for name in request.headers)
    if request.META.get("REMOTE_ADDR") in LOOPBACK and not relayed:
        return None
    return JsonResponse({"detail": "metrics answer loopback callers only; set METRICS_TOKEN to scrape "
                                   "from elsewhere"}, status=403)


@never_cache
@csrf_exempt
@require_safe
def metrics(request):
    refusal = metrics_refusal(request)
    if refusal is not None:
        return refusal
    # The client library's own negotiation: OpenMetrics when the scraper asks for it,
    # else the classic text format (0.0.4) every Prometheus reads.
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    return HttpResponse(encoder(registry), content_type=content_type)
