"""The one CSV writer: a cell a spreadsheet would evaluate is written as text."""
from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest

from backfill_portal.core.csv_export import csv_writer, safe_cell


@pytest.mark.parametrize("text", [
    "=HYPERLINK(\"http://evil\",\"x\")", "+1+cmd|' /C calc'!A0", "-2+3", "-", "@SUM(A1:A9)",
    "\t=1+1", "\r=1+1", "-1_0",
])
def test_a_cell_a_spreadsheet_would_evaluate_is_written_as_text(text):
    assert safe_cell(text) == "'" + text


@pytest.mark.parametrize(("value", "shown"), [
    (None, ""), (0, "0"), (-3, "-3"), (-12.5, "-12.5"), (Decimal("-0.10"), "-0.10"), ("-12.5", "-12.5"),
    ("plain text", "plain text"), ("a=b", "a=b"), (True, "True"), ("2022-10-01", "2022-10-01"),
])
def test_numbers_and_plain_text_are_kept_as_they_are(value, shown):
    assert safe_cell(value) == shown


def test_the_writer_neutralises_every_cell_and_quotes_as_csv_does():
    out = io.StringIO()
    writer = csv_writer(out)
    writer.writerow(["=1+1", -4, 'say "hi", then\nleave', None])
    assert list(csv.reader(io.StringIO(out.getvalue()))) == [["'=1+1", "-4", 'say "hi", then\nleave', ""]]
