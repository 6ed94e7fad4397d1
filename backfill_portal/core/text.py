"""Free text people write (reasons, comments, explanations, labels): what it may hold.

It is read back on pages, in CSV exports, in the audit log and by `manage.py` commands in
a terminal, so it may hold line breaks and tabs but no other control character: an ESC
(U+001B) in a reason would be an escape sequence in an auditor's terminal, and a NUL
cannot be stored by PostgreSQL at all."""
from __future__ import annotations

import re

from django.core.exceptions import ValidationError

CONTROL_CHARACTER = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def control_character_in(value: str) -> str | None:
    """The first control character `value` holds other than a line break or a tab, as
    U+XXXX, or None."""
    found = CONTROL_CHARACTER.search(value or "")
    return f"U+{ord(found.group()):04X}" if found else None


def control_character_message(code: str) -> str:
    return f"the control character {code} is not allowed; text may hold line breaks and tabs"


def no_control_characters(value: str) -> None:
    """A form and serializer field validator (Django's ValidationError, which DRF's
    fields turn into their own)."""
    code = control_character_in(value)
    if code:
        raise ValidationError(control_character_message(code), code="control_character")
