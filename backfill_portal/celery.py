"""The Celery app: `celery -A backfill_portal worker`."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backfill_portal.settings")

app = Celery("backfill_portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
