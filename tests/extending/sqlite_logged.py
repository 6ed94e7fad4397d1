import logging

from backfill_portal.backends import register_backend
from backfill_portal.backends.sqlite import SQLiteWarehouse

publications = logging.getLogger("backfill_portal.publications")


@register_backend("sqlite-logged")
class LoggedSQLiteWarehouse(SQLiteWarehouse):
    """SQLite, and one log line per pointer move (publish or rollback)."""

    @classmethod
    def target_of(cls, url):
        return super().target_of(url.replace("sqlite-logged:", "sqlite:", 1))

    def publish(self, **kwargs):
        record = super().publish(**kwargs)
        publications.info("%s %s/%s: %s -> %s by %s", record.action, record.dataset, record.partition,
                          record.previous_run_id, record.run_id, record.actor)
        return record
