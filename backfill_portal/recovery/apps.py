from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    """No models: reconciliation, rollback and retention over the other apps' state.
    Installed so that Celery's autodiscovery registers recovery/tasks.py."""

    name = "backfill_portal.recovery"
    label = "recovery"
