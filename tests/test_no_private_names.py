"""No test or benchmark reaches into a private (`_name`) part of backfill_portal: each
file under tests/ and benchmarks/ is parsed (not run) and every way in is refused:

- importing a private name or module (`from backfill_portal.x import _y`,
  `import backfill_portal._x`);
- an attribute of something imported from backfill_portal (`queue._publish`,
  `rollback._move_pointers`), read, called or assigned;
- a patch target naming one, as a dotted string (`"backfill_portal.x._y"`) or as an
  object and a name (`monkeypatch.setattr(queue, "_publish", ...)`, `patch.object`);
- a private function, method or module-level name that backfill_portal defines, reached
  through any other object (`warehouse._numbers(...)` on an adapter a fixture made).

What tests and benchmarks need has a public seam instead (the broker's:
`execution.queue.use_publisher`). Django's own underscore API on models (`_meta`,
`_state`, the default managers) is Django's, not the project's, and is allowed.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "backfill_portal"
DJANGO_API = {"_meta", "_state", "_default_manager", "_base_manager"}
DOTTED = re.compile(rf"^{PACKAGE}(\.\w+)+$")

# Reaches other engineers of issue #14 are replacing in their own parts; the lead
# removes each entry when that part lands. Entries: (file, private name).
ALLOWED: set[tuple[str, str]] = set()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and name not in DJANGO_API


def checked_files() -> list[Path]:
    return sorted(p for folder in ("tests", "benchmarks") for p in (ROOT / folder).rglob("*.py"))


def defined_private_names() -> set[str]:
    """Private functions, classes, methods and module- or class-level names that
    backfill_portal defines (not a function's locals, not `self._x` attributes)."""
    names: set[str] = set()

    def scope(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(node.name)
                scope(node.body)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names.add(name.id)
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                scope(node.body)
                scope(getattr(node, "orelse", []))

    for path in (ROOT / PACKAGE).rglob("*.py"):
        scope(ast.parse(path.read_text(), filename=str(path)).body)
    return {name for name in names if private(name)}


def chain(node: ast.AST) -> tuple[str, list[str]] | None:
    """`a.b.c` -> ("a", ["b", "c"]); None when the chain does not start at a name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, attrs[::-1]) if isinstance(node, ast.Name) else None


def reaches(source: str, *, filename: str = "<test>", project_private: set[str] = frozenset()) -> list[str]:
    """Every reach into a private part of backfill_portal in `source`, as "line: what"."""
    tree = ast.parse(source, filename=filename)
    bound: dict[str, str] = {}  # local name -> what it is in backfill_portal (dotted)
    own: set[str] = set()  # private names the file defines itself
    found: list[tuple[int, str]] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != PACKAGE:
                    continue
                if any(private(part) for part in alias.name.split(".")):
                    found.append((node.lineno, f"imports {alias.name}"))
                bound[alias.asname or PACKAGE] = alias.name if alias.asname else PACKAGE
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != PACKAGE:
                continue
            if any(private(part) for part in node.module.split(".")):
                found.append((node.lineno, f"imports from {node.module}"))
            for alias in node.names:
                if private(alias.name):
                    found.append((node.lineno, f"imports {alias.name} from {node.module}"))
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)  # self._x = ...: the file's own attribute

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            start = chain(node)
            if start and start[0] in bound:
                found.append((node.lineno, f"{bound[start[0]]}.{'.'.join(start[1])}"))
            elif (node.attr in project_private and node.attr not in own
                  and not (start and start[0] in ("self", "cls"))):
                found.append((node.lineno, f"{ast.unparse(node)} (a private name backfill_portal defines)"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value):
            if any(private(part) for part in node.value.split(".")):
                found.append((node.lineno, f"names {node.value!r}"))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            target, name = node.args[0], node.args[1]
            start = chain(target)
            if (start and start[0] in bound and isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and private(name.value)):
                found.append((node.lineno, f"patches or reads {ast.unparse(target)}.{name.value}"))
    return [f"{line}: {what}" for line, what in sorted(set(found))]


def test_no_test_or_benchmark_reaches_into_a_private_name_of_backfill_portal():
    project_private = defined_private_names()
    problems = []
    for path in checked_files():
        relative = path.relative_to(ROOT).as_posix()
        for problem in reaches(path.read_text(), filename=relative, project_private=project_private):
            name = re.findall(r"\b_\w+", problem.split(": ", 1)[1])
            if not any((relative, n) in ALLOWED for n in name):
                problems.append(f"{relative}:{problem}")
    assert not problems, "use or add a public seam instead:\n" + "\n".join(problems)


@pytest.mark.parametrize("source", [
    "from backfill_portal.settings import _database",
    "import backfill_portal.core._internal",
    "from backfill_portal.execution import queue\nqueue._publish = print",
    "from backfill_portal.execution import queue\nqueue._publish('t', [], {}, 'q')",
    "from backfill_portal.execution import queue as outbox\nsaved = outbox._publish",
    "import backfill_portal.execution.queue\nbackfill_portal.execution.queue._publish('t', [], {}, 'q')",
    "def t(monkeypatch):\n    monkeypatch.setattr('backfill_portal.execution.queue._publish', print)",
    "from unittest import mock\nwith mock.patch('backfill_portal.core.services.audit._insert'): pass",
    "def t(monkeypatch):\n    from backfill_portal.core.services import audit\n    monkeypatch.setattr(audit, '_insert', print)",
    "from unittest import mock\nfrom backfill_portal.warehouse.services import rollback\n"
    "mock.patch.object(rollback, '_mirror')",
    "def t(wh):\n    return wh._numbers('orders', 'run_1')",
])
def test_the_guard_finds_each_way_in(source):
    assert reaches(source, project_private={"_numbers"})


@pytest.mark.parametrize("source", [
    "from backfill_portal.execution import queue\nwith queue.use_publisher(print): pass",
    "from backfill_portal.backfills.models import Interval\ntable = Interval._meta.db_table",
    "from backfill_portal.core.models import AuditEvent\ndef t(e: AuditEvent):\n    return e._state.adding",
    "class Proxy:\n    def __init__(self):\n        self._numbers = 1\n    def n(self):\n        return self._numbers",
    "import backfill_portal\nprint(backfill_portal.__file__)",
    "from urllib.parse import urlparse\nurlparse('x')._replace(path='/')",
])
def test_the_guard_lets_public_ways_through(source):
    assert reaches(source, project_private={"_numbers"}) == []
