from django.apps import AppConfig


class BackfillsConfig(AppConfig):
    name = "backfill_portal.backfills"
    label = "backfills"
