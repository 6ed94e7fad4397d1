from django.apps import AppConfig


class WarehouseConfig(AppConfig):
    name = "backfill_portal.warehouse"
    label = "warehouse"
