"""The transport events are sent through, made from settings (docs/openlineage.md).

`OPENLINEAGE_URL`: openlineage-python's HTTP transport, POSTing to the URL plus
`OPENLINEAGE_ENDPOINT`, with `OPENLINEAGE_API_KEY` as a bearer token; a non-2xx answer
raises, and the event waits for its next try. The client's own retries are off: the
outbox retries, with a backoff, across processes and restarts. `OPENLINEAGE_FILE`: its
file transport, appending one JSON object a line. Neither: `None`, and no event is
written at all.
"""
from __future__ import annotations

from django.conf import settings


def lineage_enabled() -> bool:
    return bool(settings.OPENLINEAGE_URL or settings.OPENLINEAGE_FILE)


def lineage_transport():
    """A fresh transport for the current settings, or None when lineage is off."""
    if settings.OPENLINEAGE_URL:
        from openlineage.client.transport.http import ApiKeyTokenProvider, HttpConfig, HttpTransport, TokenProvider

        auth = (ApiKeyTokenProvider({"apiKey": settings.OPENLINEAGE_API_KEY}) if settings.OPENLINEAGE_API_KEY
                else TokenProvider({}))
        return HttpTransport(HttpConfig(
            url=settings.OPENLINEAGE_URL, endpoint=settings.OPENLINEAGE_ENDPOINT,
            timeout=settings.OPENLINEAGE_TIMEOUT_SECONDS, auth=auth,
            retry={"total": 0, "connect": 0, "read": 0, "status": 0, "backoff_factor": 0,
                   "status_forcelist": [], "allowed_methods": ["POST"]}))
    if settings.OPENLINEAGE_FILE:
        from openlineage.client.transport.file import FileConfig, FileTransport

        return FileTransport(FileConfig(log_file_path=settings.OPENLINEAGE_FILE, append=True))
    return None
