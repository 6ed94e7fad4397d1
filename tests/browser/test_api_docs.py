"""/api/docs/ renders Swagger UI in the browser with every request off this server refused
(as on a machine without internet)."""
from __future__ import annotations

import re

from playwright.sync_api import expect


def test_api_docs_render_with_no_internet(as_user, live_server):
    alice = as_user("alice")
    refused = []

    def only_this_server(route):
        if route.request.url.startswith(live_server.url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    alice.page.route("**/*", only_this_server)
    alice.goto("/api/docs/")
    expect(alice.page.locator("#swagger-ui .info .title")).to_contain_text("Backfill Portal API")
    expect(alice.page.get_by_text(re.compile(r"/api/requests/\{id\}/submit/")).first).to_be_visible()
    alice.shot("api-docs")
    assert refused == []


def test_api_docs_pass_axe_once_swagger_ui_has_rendered_the_operations(as_user):
    from tests.browser.axe import serious_findings

    alice = as_user("alice")
    alice.goto("/api/docs/")
    expect(alice.page.locator("#swagger-ui .opblock-summary-control").first).to_be_visible()
    assert alice.page.evaluate("document.documentElement.lang") == "en"
    assert serious_findings(alice.page) == []
