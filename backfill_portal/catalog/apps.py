from django.apps import AppConfig


class CatalogConfig(AppConfig):
    name = "backfill_portal.catalog"
    label = "catalog"
