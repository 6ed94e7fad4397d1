"""/api/docs/ works without internet: Swagger UI comes from vendored static files
(drf-spectacular-sidecar), served by this server, never from a CDN."""
from __future__ import annotations

import re
import urllib.request
from urllib.parse import urljoin, urlsplit

from django.test import Client


def _logged_in_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def _get(url: str, cookie: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.read()


def test_docs_page_references_only_local_assets_and_each_is_served(live_server, personas):
    cookie = _logged_in_cookie(personas["alice"])
    docs_url = live_server.url + "/api/docs/"
    status, body = _get(docs_url, cookie)
    assert status == 200
    html = body.decode()
    refs = re.findall(r'<(?:script|link)\b[^>]*?\b(?:src|href)="([^"]+)"', html)
    # The stylesheet, the favicon, the two Swagger UI bundles and the init script.
    assert len(refs) >= 5, refs
    assert "<script>" not in html, "the init script must not be inline (CSP script-src 'self')"
    for ref in refs:
        url = urljoin(docs_url, ref.replace("&amp;", "&"))
        assert urlsplit(url).netloc == urlsplit(live_server.url).netloc, f"{ref} is not served by us"
        status, content = _get(url, cookie)
        assert status == 200 and content, url
    assert any("/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in ref for ref in refs)


def test_docs_init_script_points_swagger_at_our_schema(live_server, personas):
    cookie = _logged_in_cookie(personas["alice"])
    status, body = _get(live_server.url + "/api/docs/?script=", cookie)
    assert status == 200
    assert b"/api/schema/" in body
    assert b"SwaggerUIBundle" in body
