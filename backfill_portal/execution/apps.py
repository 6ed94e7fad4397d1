from django.apps import AppConfig


class ExecutionConfig(AppConfig):
    name = "backfill_portal.execution"
    label = "execution"
