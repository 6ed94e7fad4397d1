"""Static checks of SQL templates with a real parser (sqlglot).

A template may read only the data interval and the datasets it declares upstream.
We render it with placeholder tables, parse it, and refuse wall-clock and random
functions and any table that is not a declared upstream.
"""
from __future__ import annotations

import functools

import jinja2
import sqlglot
from sqlglot import exp

FORBIDDEN_FUNCTIONS = {
    "now", "current_date", "current_timestamp", "current_time", "localtime", "localtimestamp",
    "random", "rand", "uuid", "gen_random_uuid", "sysdate", "getdate", "clock_timestamp",
    "statement_timestamp", "transaction_timestamp", "timeofday",
    "randomblob", "uuid_generate_v1", "uuid_generate_v4",
}
# Strings the database turns into the wall clock: PostgreSQL's 'now'::timestamp and
# DATE 'today', SQLite's date('now'). Refused when a cast or function consumes them.
WALL_CLOCK_LITERALS = {"now", "today", "yesterday", "tomorrow"}
# SQLite's date functions read the clock when given no time value (date(), unixepoch()).
CLOCK_WHEN_ARGLESS = {"date", "time", "datetime", "julianday", "unixepoch"}
FORBIDDEN_EXPRESSIONS = (exp.CurrentDate, exp.CurrentTimestamp, exp.CurrentTime, exp.Rand)
PLACEHOLDER_PREFIX = "__ref__"
PREVIOUS_PLACEHOLDER = "__ref_previous__"


class TemplateError(Exception):
    pass


_env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)


def render_for_check(template: str) -> str:
    """Render with placeholder tables so the parser sees plain table names."""
    try:
        return _env.from_string(template).render(
            data_interval_start="TIMESTAMP '2000-01-01 00:00:00'",
            data_interval_end="TIMESTAMP '2000-01-02 00:00:00'",
            partition_key="'2000-01-01'",
            ref=lambda name: f"{PLACEHOLDER_PREFIX}{name}",
            ref_previous=lambda: PREVIOUS_PLACEHOLDER,
            this="__this__",
        )
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template does not render: {exc}") from None


def referenced_tables(template: str) -> tuple[set[str], set[str]]:
    """Return (datasets read through ref(), other tables read directly)."""
    sql = render_for_check(template)
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except sqlglot.errors.ParseError as exc:
        raise TemplateError(f"SQL does not parse: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise TemplateError("a job template must be exactly one SELECT statement")
    tree = statements[0]
    if not isinstance(tree, (exp.Select, exp.SetOperation)):
        raise TemplateError("a job template must be a SELECT (no INSERT, UPDATE, DELETE or DDL)")
    for node in tree.walk():
        if isinstance(node, FORBIDDEN_EXPRESSIONS):
            raise TemplateError(f"{node.sql()} is not allowed: a job may read only its data interval")
        if isinstance(node, (exp.Anonymous, exp.Func)):
            name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
            if name in FORBIDDEN_FUNCTIONS:
                raise TemplateError(f"{name}() is not allowed: a job may read only its data interval")
            args = node.expressions if isinstance(node, exp.Anonymous) else [v for v in node.args.values() if v]
            if (name in CLOCK_WHEN_ARGLESS and not args) or (name == "strftime" and len(args) < 2):
                raise TemplateError(f"{name}() without a time value reads the clock: "
                                    "a job may read only its data interval")
        if (isinstance(node, exp.Literal) and node.is_string and isinstance(node.parent, exp.Func)
                and node.name.strip().lower() in WALL_CLOCK_LITERALS):
            raise TemplateError(f"'{node.name}' reads the clock: a job may read only its data interval")
    ctes = {cte.alias_or_name for cte in tree.find_all(exp.CTE)}
    refs, others = set(), set()
    for table in tree.find_all(exp.Table):
        name = table.name
        if name.startswith(PLACEHOLDER_PREFIX):
            refs.add(name[len(PLACEHOLDER_PREFIX):])
        elif name in (PREVIOUS_PLACEHOLDER, "__this__") or name in ctes:
            continue
        else:
            others.add(name)
    return refs, others


def check_template(template: str, *, upstreams: set[str]) -> set[str]:
    """Raise TemplateError unless the template reads only declared upstreams via ref()."""
    return set(_check_template(template, frozenset(upstreams)))


@functools.lru_cache(maxsize=512)
def _check_template(template: str, upstreams: frozenset[str]) -> frozenset[str]:
    # Parsing costs milliseconds and every run of a job checks the same frozen
    # template again: remember the verdicts (a refusal is re-raised each time).
    refs, others = referenced_tables(template)
    if others:
        raise TemplateError(
            f"reads {', '.join(sorted(others))} directly; read datasets through ref('name') so the run pins their versions"
        )
    undeclared = refs - upstreams
    if undeclared:
        raise TemplateError(f"reads {', '.join(sorted(undeclared))}, which the job does not declare in `reads`")
    return frozenset(refs)
