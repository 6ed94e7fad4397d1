"""The 503 after the pool's wait asks whether the metadata database is down with a
connection of its own; under saturation every refused request did, adding connections to
a busy server. Now one probe per process every DOWN_PROBE_SECONDS."""
from __future__ import annotations

from backfill_portal.core import middleware


def test_refused_requests_reuse_the_last_probe_of_the_database_for_a_few_seconds(monkeypatch):
    probes = []

    def probe(*, timeout):
        probes.append(timeout)
        if server["down"]:
            raise OSError("connection refused")

    server = {"down": True}
    monkeypatch.setattr(middleware, "probe_database", probe)
    monkeypatch.setattr(middleware, "DOWN_PROBE_SECONDS", 0.0)  # every call probes
    assert middleware.database_down_reason() == "connection refused"
    assert len(probes) == 1
    monkeypatch.setattr(middleware, "DOWN_PROBE_SECONDS", 60.0)
    server["down"] = False
    for _ in range(50):  # fifty refused requests meanwhile: the one answer, no new connection
        assert middleware.database_down_reason() == "connection refused"
    assert len(probes) == 1
    monkeypatch.setattr(middleware, "DOWN_PROBE_SECONDS", 0.0)  # the window passed: asked again
    assert middleware.database_down_reason() is None
    assert len(probes) == 2
