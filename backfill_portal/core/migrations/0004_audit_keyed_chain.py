"""The audit chain becomes keyed (each event names the AUDIT_KEY that signed it), and on
PostgreSQL a statement-level trigger refuses TRUNCATE, which the row-level trigger of
0002 never sees.

Events written before this migration keep their plain SHA-256 links and an empty
key_id; they still verify, as the chain's first events only (see docs/security.md)."""
from django.db import migrations, models

CREATE = """
DROP TRIGGER IF EXISTS core_auditevent_no_truncate ON core_auditevent;
CREATE TRIGGER core_auditevent_no_truncate BEFORE TRUNCATE ON core_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION core_auditevent_append_only();
"""
DROP = "DROP TRIGGER IF EXISTS core_auditevent_no_truncate ON core_auditevent;"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("core", "0003_apitoken")]
    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="key_id",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.RunPython(forwards, backwards),
    ]
