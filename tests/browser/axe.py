"""axe-core in the journeys: the serious and critical findings on the page as it is now.

axe-playwright-python ships axe-core's axe.min.js; Playwright evaluates it through the
DevTools protocol, which the pages' Content-Security-Policy does not govern (no inline
script is added to the page itself)."""
from __future__ import annotations

from axe_playwright_python.sync_playwright import Axe

_axe = Axe()
BLOCKING = ("serious", "critical")


def serious_findings(page) -> list[str]:
    """One line per serious or critical violation: rule, impact, the first nodes."""
    results = _axe.run(page)
    found = []
    for violation in results.response["violations"]:
        if violation.get("impact") in BLOCKING:
            targets = [" ".join(map(str, node.get("target", []))) for node in violation.get("nodes", [])[:3]]
            found.append(f"{page.url}: {violation['id']} ({violation['impact']}): {violation['help']} at {targets}")
    return found
