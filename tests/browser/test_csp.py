"""Every page satisfies the Content-Security-Policy in a real browser: ours, the admin,
the browsable API and Swagger UI. The persona fixture fails a test on any violation;
the first test here proves it catches one."""
from __future__ import annotations

import pytest

from backfill_portal.execution.models import Run
from tests.execution.test_pipeline import approved_request

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_collector_catches_an_inline_script_and_an_inline_style(as_user):
    alice = as_user("alice")
    alice.goto("/")
    alice.page.evaluate("""() => {
        const s = document.createElement("script"); s.textContent = "window.ran = 1"; document.body.append(s);
        document.body.setAttribute("style", "color: red");
    }""")
    alice.page.wait_for_timeout(300)
    assert alice.page.evaluate("window.ran === undefined")  # the inline script did not run
    directives = {v.get("directive") for v in alice.csp_violations}
    assert {"script-src-elem", "style-src-attr"} <= directives, alice.csp_violations
    alice.csp_violations.clear()  # what the fixture would otherwise fail the test on


def test_every_page_of_a_finished_request_satisfies_the_policy(as_user, personas, catalog, demo_sources, task_queue):
    request = approved_request(personas, start="2022-10-01", end="2022-10-02")
    task_queue.drain()
    running = approved_request(personas, start="2022-10-03", end="2022-10-04")  # left queued: live polling
    run = Run.objects.filter(request=request).first()
    audrey = as_user("audrey")
    for path in ["/", "/requests/", f"/requests/{request.pk}/", f"/requests/{running.pk}/",
                 f"/requests/{request.pk}/reconciliation/", "/approvals/", "/catalog/", "/catalog/jobs/dwd_order_items/",
                 "/lineage/", "/datasets/dwd_order_items/", "/datasets/dwd_order_items/partitions/2022-10-01/",
                 f"/runs/{run.run_id}/", "/outbox/", "/audit/", "/requests/new/", "/no/such/page/"]:
        response = audrey.goto(path)
        assert "default-src 'self'" in response.headers["content-security-policy"], path
        audrey.page.wait_for_load_state("networkidle")
    audrey.page.wait_for_timeout(2500)  # one live poll of the running request's page
    # An application error page's "Go back" (a static script now, not a javascript: URL).
    audrey.goto("/catalog/")
    audrey.goto("/runs/run_0000000000000000/")
    audrey.page.get_by_role("link", name="Go back").click()
    audrey.page.wait_for_url("**/catalog/")
    assert not audrey.csp_violations, audrey.csp_violations


def test_the_admin_the_browsable_api_and_swagger_ui_satisfy_the_policy(as_user):
    admin = as_user("admin")
    for path in ["/admin/", "/admin/auth/user/", "/api/requests/", "/api/docs/"]:
        response = admin.goto(path)
        assert response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        admin.page.wait_for_load_state("networkidle")
    admin.page.get_by_text("Backfill Portal API").first.wait_for()  # Swagger UI rendered, from our static files
    assert not admin.csp_violations, admin.csp_violations
