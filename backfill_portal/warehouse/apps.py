from django.apps import AppConfig


class WarehouseConfig(AppConfig):
    name = "backfill_portal.warehouse"
    label = "warehouse"

    def ready(self) -> None:
        from backfill_portal.warehouse import checks  # noqa: F401 - registers the settings check
