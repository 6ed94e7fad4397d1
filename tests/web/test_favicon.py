"""Every page names an icon that is served; /favicon.ico is not a 404."""
from __future__ import annotations

import re
import urllib.request
from urllib.parse import urljoin

from django.test import Client


def test_pages_link_an_icon_that_is_served(live_server, personas):
    client = Client()
    client.force_login(personas["alice"])
    html = client.get("/").content.decode()
    icon = re.search(r'<link rel="icon" href="([^"]+)"', html)
    assert icon, "no <link rel=icon> on the home page"
    with urllib.request.urlopen(urljoin(live_server.url, icon.group(1)), timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("image/svg+xml")
        assert b"<svg" in response.read()


def test_favicon_ico_leads_to_the_icon(live_server):
    with urllib.request.urlopen(live_server.url + "/favicon.ico", timeout=10) as response:
        assert response.status == 200
        assert response.url.endswith("/static/img/favicon.svg")
