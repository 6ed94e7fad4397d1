"""Settings checks of the warehouse: WAREHOUSE_URL names a registered backend."""
from __future__ import annotations

from django.conf import settings
from django.core import checks

from backfill_portal.backends import check_warehouse_url


@checks.register(checks.Tags.compatibility)
def warehouse_url_has_a_backend(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    reason = check_warehouse_url(settings.WAREHOUSE_URL)
    if reason is None:
        return []
    return [checks.Error(reason, hint="set WAREHOUSE_URL to a URL of a registered backend",
                         id="backends.E001")]
