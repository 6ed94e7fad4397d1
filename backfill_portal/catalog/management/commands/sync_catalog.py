from django.core.management.base import CommandError

from backfill_portal.catalog.services.sync import CatalogError, catalog_sync_file
from backfill_portal.core.management.base import PortalCommand, describe_failure


class Command(PortalCommand):
    help = "Sync a YAML catalog file into the database (idempotent); prints what it created, changed, left."

    def add_arguments(self, parser):
        parser.add_argument("path")

    def handle(self, *args, path, **options):
        try:
            report = catalog_sync_file(path=path)
        except CatalogError as exc:
            line = describe_failure(exc)
            raise CommandError(line if str(path) in line else f"{path}: {line}") from None
        for line in report.lines():
            self.stdout.write(line)
