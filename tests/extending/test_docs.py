"""docs/extending.md shows each worked example whole: the page and the tested files agree."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {"A warehouse backend": "sqlite_logged.py", "A job kind": "seed_kind.py",
            "A verification check": "row_ceiling_check.py", "An approval rule": "finance_rule.py"}


def section(title: str) -> str:
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"docs/extending.md has no section '## {title}'"
    return match.group(1)


@pytest.mark.parametrize("title", EXAMPLES)
def test_the_page_shows_the_tested_example_whole(title):
    blocks = re.findall(r"```python\n(.*?)```", section(title), re.S)
    assert blocks == [(Path(__file__).parent / EXAMPLES[title]).read_text(encoding="utf-8")]
