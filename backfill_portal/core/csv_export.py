"""The one CSV writer every export uses (the audit log, reconciliation).

A spreadsheet runs a cell that starts with `=`, `+`, `-` or `@` as a formula, and a
leading tab or carriage return can hide one (CSV injection, OWASP). Free text in an
export comes from users (reasons, explanations), so every cell goes through
`safe_cell`: such a cell is written as text, prefixed with `'`. Numbers stay numbers,
negative ones included.
"""
from __future__ import annotations

import csv
from decimal import Decimal

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value) -> str:
    """The text a spreadsheet shows as it is: '' for None, a number as itself, and
    text a spreadsheet would evaluate prefixed with `'`."""
    if value is None:
        return ""
    if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
        return str(value)
    text = str(value)
    if text.startswith(FORMULA_STARTS) and not (text[0] == "-" and _is_plain_number(text)):
        return "'" + text
    return text


def _is_plain_number(text: str) -> bool:
    """'-12.5' is a number; '-2+3' or '-1_0' are not (float() would accept the last)."""
    if "_" in text:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


class SafeCSVWriter:
    """csv.writer whose every cell goes through `safe_cell`. `writerow` returns what
    the target's `write` returned, so a streaming response can yield it."""

    def __init__(self, target):
        self._writer = csv.writer(target)

    def writerow(self, cells):
        return self._writer.writerow([safe_cell(c) for c in cells])


def csv_writer(target) -> SafeCSVWriter:
    return SafeCSVWriter(target)
