from django.db import models


class Grain(models.TextChoices):
    HOUR = "hour", "Hourly"
    DAY = "day", "Daily"
    MONTH = "month", "Monthly"


class JobKind(models.TextChoices):
    SQL = "sql", "SQL template"
    PYTHON = "python", "Python callable"
    SIDE_EFFECT = "side_effect", "Side-effect node"


COLUMN_TYPES = ("text", "integer", "numeric", "timestamp", "date", "boolean")
