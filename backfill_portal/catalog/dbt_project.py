"""dbt itself, driven through its programmatic invocation (`dbtRunner`): parse a project,
read a `target/manifest.json`, and compile models and tests with their upstream relations
replaced by placeholders the portal then binds to exactly the versions a run pinned.

dbt never connects to the warehouse here: `compile --no-populate-cache` renders Jinja and
needs no introspection, and dbt never writes a table (the portal stages the compiled
SELECT itself). A profile is generated per process from `WAREHOUSE_URL` (a PostgreSQL
warehouse: its database and schema, so `{{ target }}` means what it does under dbt; any
other: a placeholder PostgreSQL profile, enough to parse and compile). dbt's target,
log and partial-parse files go to a temporary directory, never into the user's project,
and anonymous usage statistics and the version check are off (no network).

    manifest = project_manifest("/srv/shop")                 # dbt parse, cached per process
    sql = compile_model(manifest, "/srv/shop", "model.shop.daily_sales",
                        placeholders={"model.shop.orders": "orders"}, variables={...})
    # 'select ... from "__bf_pin"."__bf_pin"."orders"', bound by `bind_placeholders`
"""
from __future__ import annotations

import copy
import functools
from contextlib import contextmanager
import json
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

PLACEHOLDER_SCHEMA = "__bf_pin"
# A placeholder relation as the postgres adapter renders it: "db"."schema"."identifier"
# (quoted or not, depending on the project's quoting config).
_PLACEHOLDER = re.compile(r'"?__bf_pin"?\s*\.\s*"?__bf_pin"?\s*\.\s*"?([a-z_][a-z0-9_]*)"?')
_lock = threading.RLock()


class DbtError(Exception):
    """dbt refused (a project that does not parse, a model that does not compile); the
    message is dbt's, on one line, prefixed with what was being done."""


def dbt_version() -> str:
    from dbt.version import __version__

    return str(__version__)


def warehouse_has_dbt_adapter(url: str | None = None) -> bool:
    """Whether dbt can run against this warehouse: dbt-postgres is the adapter pinned,
    and no dbt adapter works on the embedded SQLite warehouse."""
    return urlsplit(url or settings.WAREHOUSE_URL).scheme in ("postgres", "postgresql")


NO_ADAPTER = ("dbt models run only on a PostgreSQL warehouse (dbt-postgres): no dbt adapter works on the "
              "embedded SQLite warehouse; set WAREHOUSE_URL=postgresql://...")


# The warehouse password reaches dbt through the environment of this process (dbt's
# env_var in the profile), never in the profiles.yml the work directory holds.
PASSWORD_VARIABLE = "BACKFILL_PORTAL_DBT_PASSWORD"


@functools.lru_cache(maxsize=1)
def _workdir() -> Path:
    """This process's scratch directory for dbt (profiles, target, logs), removed when
    the process exits (each sync_dbt left one behind, 1 MB of manifest each)."""
    import atexit
    import shutil

    path = Path(tempfile.mkdtemp(prefix="bf-dbt-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _profile(profile_name: str) -> dict:
    url = settings.WAREHOUSE_URL
    if warehouse_has_dbt_adapter(url):
        parts = urlsplit(url)
        os.environ[PASSWORD_VARIABLE] = unquote(parts.password or "")
        output = {"type": "postgres", "host": parts.hostname or "127.0.0.1", "port": parts.port or 5432,
                  "user": unquote(parts.username or "postgres"),
                  "password": "{{ env_var('" + PASSWORD_VARIABLE + "') }}",
                  "dbname": unquote(parts.path.lstrip("/")) or "postgres", "schema": "public", "threads": 1}
    else:
        output = {"type": "postgres", "host": "127.0.0.1", "port": 5432, "user": "portal", "password": "",
                  "dbname": "portal", "schema": "public", "threads": 1}
    return {profile_name: {"target": "portal", "outputs": {"portal": output}}}


def _project_profile_name(project_dir: Path) -> str:
    import yaml

    try:
        doc = yaml.safe_load((project_dir / "dbt_project.yml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise DbtError(f"cannot read {project_dir / 'dbt_project.yml'}: {exc}") from None
    return str(doc.get("profile") or doc.get("name") or "default")


def _common_args(project_dir: Path) -> list[str]:
    work = _workdir() / re.sub(r"[^A-Za-z0-9_.-]", "_", str(project_dir.resolve()))
    work.mkdir(parents=True, exist_ok=True)
    (work / "profiles.yml").write_text(json.dumps(_profile(_project_profile_name(project_dir))), encoding="utf-8")
    return ["--project-dir", str(project_dir), "--profiles-dir", str(work), "--target-path", str(work / "target"),
            "--log-path", str(work / "logs"), "--quiet", "--log-level", "none", "--log-level-file", "none",
            "--no-send-anonymous-usage-stats", "--no-version-check", "--no-use-colors"]


def _one_line(exc: BaseException | str) -> str:
    text = " ".join(str(exc).split())
    return text[:600]


def _invoke(args: list[str], *, manifest=None):
    from dbt.cli.main import dbtRunner

    with _lock:  # dbt keeps process-global state (flags, adapters): one invocation at a time
        return dbtRunner(manifest=manifest).invoke(args)


def parse_project(project_dir: str | Path):
    """Run dbt's parser over the project directory; its Manifest. DbtError if it fails."""
    path = Path(project_dir)
    if not (path / "dbt_project.yml").is_file():
        raise DbtError(f"{path} is not a dbt project (no dbt_project.yml)")
    result = _invoke(["parse", *_common_args(path)])
    if not result.success or result.result is None:
        raise DbtError(f"dbt could not parse the project at {path}: {_one_line(result.exception or 'parse failed')}")
    return result.result


def read_manifest(path: str | Path):
    """A `target/manifest.json` as dbt's Manifest. DbtError if it is not one."""
    from dbt.contracts.graph.manifest import Manifest, WritableManifest

    try:
        json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise DbtError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise DbtError(f"{path} is not JSON: {exc}") from None
    try:
        return Manifest.from_writable_manifest(WritableManifest.read_and_check_versions(str(path)))
    except Exception as exc:  # dbt raises its own and mashumaro's errors for a bad manifest
        raise DbtError(f"{path} is not a dbt manifest this dbt ({dbt_version()}) reads: {_one_line(exc)}") from None


@dataclass(frozen=True)
class _Parsed:
    manifest: object
    key: tuple


_parsed: dict[str, _Parsed] = {}


def project_manifest(project_dir: str | Path, *, fresh: bool = False):
    """The project's parsed Manifest, parsed once per process (again when `fresh`, or when
    a file of the project changed since). Callers copy before they change it."""
    path = Path(project_dir).resolve()
    key = _project_key(path)
    cached = _parsed.get(str(path))
    if cached is None or fresh or cached.key != key:
        cached = _Parsed(parse_project(path), key)
        _parsed[str(path)] = cached
    return cached.manifest


def _project_key(path: Path) -> tuple:
    stats = []
    for file in sorted(path.rglob("*")):
        if file.is_file() and "target" not in file.relative_to(path).parts[:1] and file.suffix in (
                ".sql", ".yml", ".yaml", ".py", ".csv", ".md"):
            stat = file.stat()
            stats.append((str(file), stat.st_mtime_ns, stat.st_size))
    return tuple(stats)


def placeholder(name: str) -> str:
    """How a placeholder relation for dataset `name` renders (postgres quoting)."""
    return f'"{PLACEHOLDER_SCHEMA}"."{PLACEHOLDER_SCHEMA}"."{name}"'


@contextmanager
def patched(manifest, placeholders: dict[str, str], *, frozen: dict | None = None):
    """The manifest, for the block's duration, with its models and sources
    {unique_id: name} rendering as the placeholder relation of `name` wherever `ref()` or
    `source()` names them, and (with `frozen`) the model exactly as a code version froze
    it: its raw SQL, its upstreams, the SQL of the project macros it used.

    Changed in place on copies of the nodes, and put back after (dbt also replaces the
    nodes it compiles): dbt's Manifest does not survive `copy.deepcopy` (its
    `__reduce_ex__` misplaces the lookups in 1.11), and a parse costs seconds."""
    with _lock:
        nodes, sources, macros = dict(manifest.nodes), dict(manifest.sources), dict(manifest.macros)
        try:
            for unique_id, name in placeholders.items():
                if unique_id in manifest.nodes:
                    node = manifest.nodes[unique_id] = copy.deepcopy(manifest.nodes[unique_id])
                    node.database, node.schema, node.alias = PLACEHOLDER_SCHEMA, PLACEHOLDER_SCHEMA, name
                    node.relation_name = placeholder(name)
                elif unique_id in manifest.sources:
                    source = manifest.sources[unique_id] = copy.deepcopy(manifest.sources[unique_id])
                    source.database, source.schema, source.identifier = PLACEHOLDER_SCHEMA, PLACEHOLDER_SCHEMA, name
                    source.relation_name = placeholder(name)
            if frozen is not None:
                node = manifest.nodes[frozen["model"]] = copy.deepcopy(manifest.nodes[frozen["model"]])
                node.raw_code = frozen["raw_code"]
                node.depends_on.nodes = list(frozen.get("upstreams") or {})
                for macro_id, sql in (frozen.get("macros") or {}).items():
                    macro = manifest.macros[macro_id] = copy.deepcopy(manifest.macros[macro_id])
                    macro.macro_sql = sql
            yield manifest
        finally:
            for current, saved in ((manifest.nodes, nodes), (manifest.sources, sources), (manifest.macros, macros)):
                current.clear()
                current.update(saved)


def placeholders_in(sql: str) -> list[str]:
    """The dataset names whose placeholder relations `sql` reads, in order of appearance."""
    return list(dict.fromkeys(m.group(1) for m in _PLACEHOLDER.finditer(sql)))


def replace_placeholders(sql: str, replace) -> str:
    """`sql` with each placeholder relation replaced by `replace(name)`."""
    return _PLACEHOLDER.sub(lambda m: replace(m.group(1)), sql)


def compile_nodes(manifest, project_dir: str | Path, unique_ids: list[str], *,
                  variables: dict | None = None) -> dict[str, str]:
    """Compile exactly `unique_ids` (models, tests) with dbt; {unique_id: compiled SQL}.
    DbtError naming the node if one does not compile."""
    if not unique_ids:
        return {}
    path = Path(project_dir)
    names = [_selector(manifest, uid) for uid in unique_ids]
    args = ["compile", *_common_args(path), "--no-populate-cache", "--no-write-json", "--no-partial-parse",
            "--indirect-selection", "empty", "--select", *names]
    if variables:
        args += ["--vars", json.dumps(variables, sort_keys=True)]
    result = _invoke(args, manifest=manifest)
    compiled: dict[str, str] = {}
    for item in getattr(result.result, "results", None) or []:
        node = item.node
        if str(getattr(item, "status", "")).lower() in ("error", "runtimestatus.error"):
            raise DbtError(f"{node_label(node.unique_id)}: dbt could not compile it: {_one_line(item.message)}")
        compiled[node.unique_id] = node.compiled_code or ""
    if not result.success:
        raise DbtError(f"dbt could not compile {', '.join(node_label(u) for u in unique_ids if u not in compiled) or 'the selection'}"
                       f": {_one_line(result.exception or 'compile failed')}")
    missing = [u for u in unique_ids if u not in compiled]
    if missing:
        raise DbtError(f"dbt did not compile {', '.join(node_label(u) for u in missing)}")
    return compiled


def _selector(manifest, unique_id: str) -> str:
    # The fully qualified name selects exactly this node (a bare name could match a
    # model and a test of the same name in different packages).
    return "fqn:" + ".".join(manifest.nodes[unique_id].fqn)


def node_label(unique_id: str) -> str:
    kind, _, rest = unique_id.partition(".")
    return f"{kind} {rest.split('.', 1)[-1]}"


def _cte_name(name: str) -> str:
    return f"__bf_in_{name}"


def bind(compiled_sql: str, relations: dict[str, str], *, jinja: bool = False) -> str:
    """`compiled_sql` (dbt's, reading placeholder relations) as one SELECT in which each
    placeholder reads `relations[name]` (an SQL relation: the pinned versions, a source's
    interval) through a CTE defined around it, so that a bare name reads like the table
    dbt rendered, aliased or not. `jinja`: the result is a portal template (the relations
    are `{{ ref(..) }}` / `{{ this }}`, dbt's SQL kept verbatim in a raw block)."""
    used = placeholders_in(compiled_sql)
    unknown = [name for name in used if name not in relations]
    if unknown:
        raise DbtError(f"reads {', '.join(unknown)}, which is not one of its declared inputs")
    body = replace_placeholders(compiled_sql, _cte_name).strip().rstrip(";").rstrip()
    if jinja:
        body = "{% raw %}" + body + "{% endraw %}"
    ctes = ", ".join(f'{_cte_name(name)} AS (SELECT * FROM {relations[name]} AS "__bf_r")' for name in used)
    head = f"WITH {ctes}\n" if ctes else ""
    # The newline before the closing parenthesis ends a trailing `-- comment` of dbt's SQL.
    return f'{head}SELECT * FROM (\n{body}\n) AS "__bf_q"'


def missing_for(manifest, frozen: dict) -> list[str]:
    """What the frozen code version uses that the project no longer has."""
    upstreams = frozen.get("upstreams") or {}
    missing = [uid for uid in [frozen["model"], *upstreams] if uid not in manifest.nodes and uid not in manifest.sources]
    return missing + [uid for uid in frozen.get("macros") or {} if uid not in manifest.macros]
