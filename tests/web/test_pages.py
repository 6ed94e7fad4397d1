"""Every page renders for a signed-in user and sends anonymous users to the login page."""
from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from backfill_portal.execution.models import Run
from backfill_portal.execution.services.dispatch import dispatch_request


@pytest.fixture
def objects(make_request, warehouse):
    running = make_request("running")
    dispatch_request(request_id=running.pk)
    run = Run.objects.filter(request=running).first()
    return {"request": running, "run": run}


def page_urls(objects) -> dict[str, str]:
    req, run = objects["request"], objects["run"]
    return {
        "home": reverse("home"),
        "request-list": reverse("request-list"),
        "request-new": reverse("request-new"),
        "request-detail": reverse("request-detail", args=[req.pk]),
        "request-live": reverse("request-live", args=[req.pk]),
        "run-detail": reverse("run-detail", args=[run.run_id]),
        "catalog": reverse("catalog"),
        "catalog-job": reverse("catalog-job", args=["dwd_order_items"]),
        "audit": reverse("audit"),
        "approvals": reverse("approvals"),
        "lineage": reverse("lineage"),
        "lineage-root": reverse("lineage") + "?root=dwd_order_items",
        "outbox": reverse("outbox"),
        "dataset": reverse("dataset", args=["dwd_order_items"]),
        "reconciliation": reverse("reconciliation", args=[req.pk]),
    }


def test_every_page_renders_for_a_signed_in_user(web, objects):
    client = web("alice")
    for name, url in page_urls(objects).items():
        response = client.get(url)
        assert response.status_code == 200, (name, response.status_code)


def test_every_page_redirects_anonymous_users_to_login(objects):
    client = Client()
    for name, url in page_urls(objects).items():
        response = client.get(url)
        assert response.status_code == 302, name
        assert response["Location"].startswith(reverse("login") + "?next="), (name, response["Location"])


@pytest.mark.parametrize("name", ["request-submit", "request-approve", "request-reject", "request-cancel",
                                  "request-pause", "request-resume", "request-retry"])
def test_actions_redirect_anonymous_users_to_login_and_change_nothing(objects, name):
    req = objects["request"]
    response = Client().post(reverse(name, args=[req.pk]))
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    req.refresh_from_db()
    assert req.status == "running" and not req.paused


@pytest.mark.parametrize("name, args", [
    ("approval-step-decide", [1]), ("handoff-decide", [1]), ("reconciliation-explain", [1, 1]),
    ("reconciliation-signoff", [1]), ("reconciliation-recompute", [1]),
    ("partition-rollback-confirm", ["dwd_order_items", "2022-10-01"]),
    ("partition-rebuild-consumers", ["dwd_order_items", "2022-10-01"]),
])
def test_new_actions_redirect_anonymous_users_to_login(catalog, name, args):
    response = Client().post(reverse(name, args=args), {"decision": "approve", "reason": "x"})
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))


def test_preview_and_audit_csv_need_login_too(catalog):
    client = Client()
    assert client.post(reverse("request-preview"), {"job": "dwd_order_items"}).status_code == 302
    assert client.get(reverse("audit") + "?format=csv").status_code == 302


def test_login_page_signs_in_and_logout_is_a_post(personas):
    client = Client()
    page = client.get(reverse("login"))
    assert page.status_code == 200 and b'name="password"' in page.content
    response = client.post(reverse("login"), {"username": "alice", "password": "pw-alice"})
    assert response.status_code == 302 and response["Location"] == reverse("home")
    assert client.get(reverse("home")).status_code == 200
    assert client.get(reverse("logout")).status_code == 405  # GET never logs out
    response = client.post(reverse("logout"))
    assert response.status_code == 302 and response["Location"] == reverse("login")
    assert client.get(reverse("home")).status_code == 302


def test_wrong_password_shows_an_error_on_the_login_page(personas):
    response = Client().post(reverse("login"), {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert b'role="alert"' in response.content


def test_base_layout_has_landmarks_nav_roles_and_csrf_header(web, catalog):
    html = web("olivia").get(reverse("home")).content.decode()
    assert '<main id="main"' in html and 'href="#main"' in html  # landmark and skip link
    assert 'hx-headers=\'{"X-CSRFToken": "' in html
    for label, url in [("Home", "/"), ("Requests", "/requests/"), ("New request", "/requests/new/"),
                       ("Approvals", "/approvals/"), ("Lineage", "/lineage/"), ("Outbox", "/outbox/"),
                       ("Catalog", "/catalog/"), ("Audit", "/audit/"), ("API docs", "/api/docs/")]:
        assert f'href="{url}"' in html and label in html
    assert 'aria-current="page"' in html
    assert "olivia" in html
    assert '<span class="role">owner</span>' in html and '<span class="role">requester</span>' in html
    assert 'action="/logout/"' in html
    assert "/static/vendor/htmx-2.0.11.min.js" in html and "/static/css/portal.css" in html


def test_home_shows_my_requests_steps_waiting_for_me_and_running(web, make_request):
    draft = make_request("draft", start="2022-09-01", end="2022-09-02")
    pending = make_request("pending", start="2022-08-01", end="2022-08-02")
    running = make_request("running")
    alice_home = web("alice").get(reverse("home")).content.decode()
    for req in (draft, pending, running):
        assert f'href="/requests/{req.pk}/"' in alice_home
    assert 'id="waiting-h"' not in alice_home  # a requester approves nothing: her home has no inbox
    olivia_home = web("olivia").get(reverse("home")).content.decode()
    waiting = olivia_home.split('id="waiting-h"')[1].split("</section>")[0]
    assert f'href="/requests/{pending.pk}/"' in waiting
    assert f'href="/requests/{draft.pk}/"' not in waiting


def test_admin_sees_admin_steps_waiting_but_not_for_their_own_requests(web, make_request):
    own = make_request("pending", requester="olivia", job="dwd_order_items")  # olivia owns it -> admin step
    html = web("admin").get(reverse("home")).content.decode()
    waiting = html.split('id="waiting-h"')[1].split("</section>")[0]
    assert f'href="/requests/{own.pk}/"' in waiting
    assert f'href="/requests/{own.pk}/"' not in web("olivia").get(reverse("home")).content.decode().split(
        'id="waiting-h"')[1].split("</section>")[0]


def test_missing_objects_are_404_pages(web, catalog):
    client = web("alice")
    assert client.get(reverse("request-detail", args=[999999])).status_code == 404
    assert client.get(reverse("request-live", args=[999999])).status_code == 404
    assert client.get(reverse("run-detail", args=["run_nope"])).status_code == 404
    assert client.get(reverse("catalog-job", args=["nope"])).status_code == 404
    assert client.post(reverse("request-cancel", args=[999999])).status_code == 404


def test_static_files_are_vendored_not_fetched_from_a_cdn(web, catalog):
    from django.contrib.staticfiles import finders

    assert finders.find("vendor/htmx-2.0.11.min.js") and finders.find("css/portal.css")
    html = web("alice").get(reverse("request-new")).content.decode()
    assert "https://" not in html.split("<body")[0]
