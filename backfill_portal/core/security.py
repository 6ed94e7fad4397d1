"""The Content-Security-Policy header on every response (settings.CONTENT_SECURITY_POLICY).

django-csp's middleware, with one exception by path: the third-party pages under
settings.CSP_INLINE_STYLE_PREFIXES (the admin, the browsable API, Swagger UI) write
inline style attributes we do not control, so there style-src also allows
'unsafe-inline'. Scripts stay 'self' everywhere."""
from __future__ import annotations

from csp.constants import UNSAFE_INLINE
from csp.middleware import CSPMiddleware
from django.conf import settings


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    def get_policy_parts(self, request, response, report_only=False):
        parts = super().get_policy_parts(request, response, report_only)
        if request.path_info.startswith(tuple(settings.CSP_INLINE_STYLE_PREFIXES)):
            update = dict(parts.update or {})
            update["style-src"] = [*update.get("style-src", []), UNSAFE_INLINE]
            parts.update = update
        return parts
