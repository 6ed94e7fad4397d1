"""The audit log's "action starts with" filter on PostgreSQL: LIKE 'x%' cannot use the
plain (action, id) index under the database's collation, so a rare action scanned the
whole table (0.1-0.8 s at 0.6-2M events). A varchar_pattern_ops index serves the prefix.
SQLite's LIKE is case-insensitive and uses no index either way: the index is created on
PostgreSQL only (in the model's state everywhere)."""

from django.db import migrations, models

INDEX = models.Index(fields=["action"], name="audit_action_prefix", opclasses=["varchar_pattern_ops"])


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.add_index(apps.get_model("core", "AuditEvent"), INDEX)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(apps.get_model("core", "AuditEvent"), INDEX)


class Migration(migrations.Migration):

    dependencies = [
        ("core", "0005_audit_object_id_255"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="auditevent", index=INDEX)],
            database_operations=[migrations.RunPython(create, drop)],
        ),
    ]
