"""Run.failing: failed or verification-failed, and no later run of the same job and
partition published since (execution.transitions keeps it from here on). The fill is
one UPDATE whose probe is a range seek on run_partition_status_id (0006) per failed
run, so it is fast at a million runs on both backends; the partial indexes of the failing
runs are built after it. A later publication counts whether that run is still published, superseded
since or rolled back: the failure was repaired (as run_transition keeps it)."""

from django.conf import settings
from django.db import migrations, models

FAILED = ("failed", "verification_failed")
WAS_PUBLISHED = ("published", "superseded", "rolled_back")


def run_failing_fill(connection) -> int:
    """Set failing on every run whose failure still stands (and only those); returns
    how many. Idempotent: benchmarks/pages.py calls it after loading runs by SQL."""
    run = connection.ops.quote_name("execution_run")
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {run} SET failing = (status IN (%s, %s) AND NOT EXISTS ("
            f"SELECT 1 FROM {run} later WHERE later.job_id = {run}.job_id "
            f"AND later.partition_key = {run}.partition_key AND later.status IN (%s, %s, %s) "
            f"AND later.id > {run}.id)) "
            f"WHERE failing OR status IN (%s, %s)",
            [*FAILED, *WAS_PUBLISHED, *FAILED],
        )
        cursor.execute(f"SELECT COUNT(*) FROM {run} WHERE failing")
        return cursor.fetchone()[0]


def forwards(apps, schema_editor):
    run_failing_fill(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('backfills', '0005_reconciliationrow_verdict_skipped'),
        ('catalog', '0003_dataset_partition_column_indexes'),
        ('execution', '0006_run_partition_status_index'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='failing',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop, elidable=False),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('failing', True)), fields=['id'], name='run_failing_id'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('failing', True)), fields=['job', 'id'], name='run_failing_job_id'),
        ),
    ]
