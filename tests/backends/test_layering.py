"""Callers reach the warehouse through the interface: no module outside the backends
package imports an implementation module (`backends.sqlite`, `backends.postgresql`)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMPLEMENTATIONS = ("backfill_portal.backends.sqlite", "backfill_portal.backends.postgresql")
# Backend modules themselves, not callers: the docs' example subclasses the SQLite backend.
BACKEND_MODULES = {"tests/extending/sqlite_logged.py"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_no_caller_imports_a_backend_implementation():
    backends = ROOT / "backfill_portal" / "backends"
    offenders = []
    for folder in ("backfill_portal", "tests", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if backends in path.parents or str(path.relative_to(ROOT)) in BACKEND_MODULES:
                continue
            reached = {name for name in _imports(path) if name.startswith(IMPLEMENTATIONS)}
            if reached:
                offenders.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(reached))}")
    assert offenders == []
