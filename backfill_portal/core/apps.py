from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "backfill_portal.core"
    label = "core"
