"""The Content-Security-Policy: on every response, strict on our pages (no inline
script or style of any kind in what they render), style-src relaxed only under the
third-party prefixes. The browser tests (tests/browser) check that no page violates it."""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from tests.web.test_pages import objects, page_urls  # noqa: F401  (the fixture)

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def directives(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


class InlineCode(HTMLParser):
    """What a strict policy refuses: <script> without src, <style>, style="", on*=, javascript: URLs."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []
        self._script = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script":
            executable = attrs.get("type") in (None, "", "text/javascript", "module")
            self._script = executable and not attrs.get("src")
        if tag == "style":
            self.found.append("<style>")
        for name, value in attrs.items():
            if name == "style" or name.startswith("on"):
                self.found.append(f"<{tag} {name}=...>")
            if name in ("href", "src", "action") and (value or "").strip().lower().startswith("javascript:"):
                self.found.append(f"<{tag} {name}=javascript:...>")

    def handle_data(self, data):
        if self._script and data.strip():
            self.found.append("inline <script>")

    def handle_endtag(self, tag):
        if tag == "script":
            self._script = None


def inline_code(html: str) -> list[str]:
    parser = InlineCode()
    parser.feed(html)
    return parser.found


def test_the_checker_finds_each_kind_of_inline_code():
    found = inline_code('<script>alert(1)</script><script src="/s.js"></script><script type="application/json">{}'
                        '</script><style>b{}</style><p style="x" onclick="y"><a href="javascript:z">')
    assert found == ["inline <script>", "<style>", "<p style=...>", "<p onclick=...>", "<a href=javascript:...>"]


def test_every_page_sends_the_strict_policy_and_renders_no_inline_code(web, objects):  # noqa: F811
    client = web("alice")
    urls = {**page_urls(objects), "partition": reverse("partition", args=["dwd_order_items", "2022-10-01"]),
            "not-found": "/no/such/page/"}
    for name, url in urls.items():
        response = client.get(url)
        policy = directives(response)
        assert policy["default-src"] == ["'self'"] and policy["object-src"] == ["'none'"], name
        assert policy["script-src"] == ["'self'"] and policy["style-src"] == ["'self'"], name
        assert policy["frame-ancestors"] == ["'none'"] and policy["base-uri"] == ["'self'"], name
        assert inline_code(response.content.decode()) == [], (name, inline_code(response.content.decode()))
    login = Client().get(reverse("login"))
    assert directives(login)["script-src"] == ["'self'"] and inline_code(login.content.decode()) == []


def test_the_server_error_page_renders_no_inline_code():
    from django.template import loader

    assert inline_code(loader.get_template("500.html").render()) == []


@pytest.mark.parametrize("path", ["/admin/", "/api/requests/", "/api/docs/", "/api/schema/"])
def test_third_party_pages_may_have_inline_styles_but_never_inline_scripts(web, catalog, path):
    response = web("admin").get(path)
    assert response.status_code == 200, path
    policy = directives(response)
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'", "'unsafe-inline'"]


def test_swagger_ui_comes_from_our_own_static_files(web, catalog):
    html = web("admin").get("/api/docs/").content.decode()
    assert [code for code in inline_code(html) if code != "<style>"] == []
    sources = re.findall(r'<(?:script|link)[^>]+(?:src|href)="([^"]+)"', html)
    assert sources and all(src.startswith("/") and not src.startswith("//") for src in sources), sources


def test_no_template_holds_inline_code():
    offenders = {}
    for path in TEMPLATES.rglob("*.html"):
        found = inline_code(path.read_text(encoding="utf-8"))
        if found:
            offenders[str(path.relative_to(TEMPLATES))] = found
    assert offenders == {}
