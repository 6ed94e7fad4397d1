"""The layers of docs/architecture.md are enforced: `lint-imports` (the repository's own
.importlinter, run by `make test`) fails when a lower layer imports a higher one, when
web and ops import each other, and on an import cycle. Each check runs lint-imports on a
copy of the package with deliberately wrong imports added, so the test fails if a
contract were removed, reordered or weakened."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS_CONTRACT = "Layers: each imports only the layers below it"
ACYCLIC_CONTRACT = "No import cycles between modules"
# Bottom to top, as in docs/architecture.md; `backends` joins once it exists.
ORDER = ["core", "celery", "backends", "catalog", "warehouse", "backfills", "execution", "recovery", "web"]


def package_copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "backfill_portal", tmp_path / "backfill_portal",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def add_import(root: Path, importer: str, imported: str) -> None:
    """`importer` (a layer: package or module under backfill_portal) imports `imported`,
    lazily inside a function: lazy imports count too."""
    package = root / "backfill_portal" / importer
    target = package / "zz_layer_probe.py" if package.is_dir() else package.with_suffix(".py")
    with target.open("a") as f:
        f.write(f"\n\ndef zz_layer_probe_{imported.replace('.', '_')}():\n"
                f"    import backfill_portal.{imported}  # noqa: F401\n")


def lint_imports(root: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "400"}
    done = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    # One line per sentence whatever the console width: rich wraps at spaces.
    return done.returncode, re.sub(r"\s+", " ", done.stdout + done.stderr)


# Strongly connected components of the module import graph (grimp, which import-linter
# uses, sees imports inside functions too). The acyclic_siblings contract does not look
# at a package's __init__ and its own submodules; this does, for every module.
CYCLES_SCRIPT = """
import json, sys
import grimp
sys.setrecursionlimit(100000)
graph = grimp.build_graph("backfill_portal")
index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1; stack.append(v); on.add(v)
    for w in graph.find_modules_directly_imported_by(v):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        component = []
        while True:
            w = stack.pop(); on.discard(w); component.append(w)
            if w == v:
                break
        if len(component) > 1:
            cycles.append(sorted(component))
for module in sorted(graph.modules):
    if module not in index:
        visit(module)
print(json.dumps(cycles))
"""


def import_cycles(root: Path) -> list[list[str]]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-c", CYCLES_SCRIPT], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout)


def existing(root: Path) -> list[str]:
    base = root / "backfill_portal"
    return [name for name in ORDER if (base / name).is_dir() or (base / f"{name}.py").is_file()]


def test_the_unchanged_package_keeps_both_contracts(tmp_path):
    code, out = lint_imports(package_copy(tmp_path))
    assert code == 0, out
    assert f"{LAYERS_CONTRACT} (docs/architecture.md) KEPT" in out, out
    assert f"{ACYCLIC_CONTRACT}" in out and "2 kept, 0 broken" in out, out


def test_a_lower_layer_importing_a_higher_one_breaks_the_layers_contract(tmp_path):
    root = package_copy(tmp_path)
    layers = existing(root)
    # Each layer reaches one step up (so every neighbour's order is pinned), recovery
    # reaches into ops, web and ops into each other (independent siblings), and the
    # HTTP layer into the root urls.
    wrong = [(lower, higher) for lower, higher in zip(layers, layers[1:])]
    wrong += [("recovery", "ops"), ("web", "ops"), ("ops", "web"), ("web", "urls"), ("ops", "api_urls")]
    for importer, imported in wrong:
        add_import(root, importer, imported)

    code, out = lint_imports(root)

    assert code == 1, out
    assert f"{LAYERS_CONTRACT} (docs/architecture.md) BROKEN" in out, out
    for importer, imported in wrong:
        assert (f"backfill_portal.{importer} is not allowed to import backfill_portal.{imported}"
                in out), (importer, imported, out)


def test_an_import_cycle_breaks_the_acyclic_contract(tmp_path):
    root = package_copy(tmp_path)
    probes = root / "backfill_portal" / "catalog"
    (probes / "zz_cycle_a.py").write_text("from backfill_portal.catalog import zz_cycle_b  # noqa: F401\n")
    (probes / "zz_cycle_b.py").write_text("def later():\n    from backfill_portal.catalog import zz_cycle_a  # noqa: F401\n")

    code, out = lint_imports(root)

    assert code == 1, out
    assert f"{LAYERS_CONTRACT} (docs/architecture.md) KEPT" in out and "1 kept, 1 broken" in out, out
    assert "No cycles are allowed in backfill_portal.catalog" in out, out
    assert ".zz_cycle_a -> .zz_cycle_b" in out or ".zz_cycle_b -> .zz_cycle_a" in out, out


def test_no_module_reaches_itself_through_its_imports():
    assert import_cycles(ROOT) == []


def test_a_package_and_its_own_submodule_importing_each_other_is_a_cycle(tmp_path):
    """The shape a registry package takes when its kind modules register themselves
    through the package that imports them."""
    root = package_copy(tmp_path)
    package = root / "backfill_portal" / "catalog" / "zz_registry"
    package.mkdir()
    (package / "__init__.py").write_text("REGISTRY = {}\nfrom backfill_portal.catalog.zz_registry import kind  # noqa\n")
    (package / "kind.py").write_text("from backfill_portal.catalog.zz_registry import REGISTRY  # noqa: F401\n")

    assert import_cycles(root) == [["backfill_portal.catalog.zz_registry", "backfill_portal.catalog.zz_registry.kind"]]
