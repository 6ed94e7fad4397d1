from django.core.management.base import BaseCommand, CommandError

from backfill_portal.catalog.services.sync import CatalogError, catalog_sync_file


class Command(BaseCommand):
    help = "Sync a YAML catalog file into the database (idempotent); prints what it created, changed, left."

    def add_arguments(self, parser):
        parser.add_argument("path")

    def handle(self, *args, path, **options):
        try:
            report = catalog_sync_file(path=path)
        except CatalogError as exc:
            lines = [exc.message] + [f"  {field}: {msg}" for field, msgs in exc.fields.items() for msg in msgs]
            raise CommandError("\n".join(lines)) from None
        for line in report.lines():
            self.stdout.write(line)
