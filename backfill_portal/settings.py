"""One settings module. Every deploy-time choice comes from an environment variable
with a working local default; the helpers below fail loudly on bad values."""
from __future__ import annotations

import os
import re
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("BACKFILL_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number")
    if value < minimum:
        raise ImproperlyConfigured(f"{name}={raw!r} must be {'zero or more' if minimum == 0 else f'at least {minimum:g}'}")
    return value


def env_url(name: str, default: str) -> str:
    """A URL setting: unset means the default; set but empty is refused (a library given
    "" would pick its own default, e.g. Celery's amqp://localhost, not ours)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    if not raw.strip():
        raise ImproperlyConfigured(f"{name} is set but empty: unset it for the default ({default.split('://')[0]}://), "
                                   "or give a URL")
    return raw.strip()


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "insecure-local-development-key-" + "x" * 40


def _audit_key(name: str, raw: str) -> tuple[str, str]:
    """One `id:secret` pair: the id is stored with every event it signs, so a rotated
    key still verifies the events it signed (docs/security.md)."""
    key_id, sep, secret = raw.strip().partition(":")
    if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", key_id):
        raise ImproperlyConfigured(f"{name} must be 'id:secret' (id: 1-32 of A-Z a-z 0-9 _ . -), got {key_id[:32]!r}...")
    if len(secret) < 32:
        raise ImproperlyConfigured(f"{name}: the secret of key {key_id!r} must be at least 32 characters")
    return key_id, secret


def _dev_audit_key() -> str:
    """DEBUG only: a key generated once into var/ so `make run` and the tests work with
    no set-up. Never for a deployment: whoever can read var/ can forge the chain."""
    path = VAR_DIR / "audit-dev.key"
    if not path.exists():
        import secrets

        # Written whole, then linked into place: a process starting beside this one
        # reads either no file or the complete key, and only one key ever wins.
        draft = path.with_name(f".audit-dev.key.{os.getpid()}")
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(f"dev-{secrets.token_hex(4)}:{secrets.token_hex(32)}\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return path.read_text().strip()


# The audit log's chain is an HMAC under this key, read from the environment and never
# stored in the database: its owner can rewrite rows but cannot sign them.
# AUDIT_KEY signs new events; AUDIT_OLD_KEYS (comma-separated id:secret) only verify.
_audit_raw = env_str("AUDIT_KEY", "")
if not _audit_raw:
    if not DEBUG:
        raise ImproperlyConfigured("AUDIT_KEY must be set when DEBUG is off (id:secret; see docs/security.md)")
    _audit_raw = _dev_audit_key()
AUDIT_KEY_ID, _audit_secret = _audit_key("AUDIT_KEY", _audit_raw)
AUDIT_KEYS = {AUDIT_KEY_ID: _audit_secret}
for _raw in env_list("AUDIT_OLD_KEYS", []):
    _old_id, _old_secret = _audit_key("AUDIT_OLD_KEYS", _raw)
    if _old_id in AUDIT_KEYS:
        raise ImproperlyConfigured(f"AUDIT_OLD_KEYS: key id {_old_id!r} is given twice")
    AUDIT_KEYS[_old_id] = _old_secret
del _audit_raw, _audit_secret
# `manage.py anchor_audit` (and the scheduler, every AUDIT_ANCHOR_SECONDS) appends the
# chain head here: outside the metadata database, so an emptied or shortened log shows.
AUDIT_ANCHOR_PATH = Path(env_str("AUDIT_ANCHOR_PATH", str(VAR_DIR / "audit-anchors.jsonl")))
# PostgreSQL: a transaction holding one of the portal's shared locks (the audit chain,
# which every audited write waits for, and the dispatch's) that then says nothing for
# this many seconds, its process frozen, is ended by the server, which rolls it back and
# frees the lock (core/locks.py). Only while it holds one: a rollback waiting for readers
# keeps a transaction open for minutes, but no such lock. 0: no bound (a frozen holder
# stops the portal's writes until it is killed or resumes).
SHARED_LOCK_IDLE_SECONDS = env_int("SHARED_LOCK_IDLE_SECONDS", 120, minimum=0)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    # Before core: core's failed-login receiver reads what axes' receiver marked on the request.
    "axes",
    "backfill_portal.core",
    "backfill_portal.catalog",
    "backfill_portal.backfills",
    "backfill_portal.execution",
    "backfill_portal.warehouse",
    "backfill_portal.recovery",
    "backfill_portal.web",
]

MIDDLEWARE = [
    # First: a NUL byte in the path, query or a header is a 400 before any session or
    # token lookup (PostgreSQL cannot hold one in text; the driver would raise).
    "backfill_portal.core.middleware.RejectNulBytesMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from STATIC_ROOT (after `collectstatic`) in any server, DEBUG or not:
    # right after SecurityMiddleware, as its docs ask, so they skip the rest of the stack.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "backfill_portal.core.security.ContentSecurityPolicyMiddleware",
    # Before anything looks up a session, user or token: with a connection pool the
    # request takes its connection here, or is a 503 with Retry-After.
    "backfill_portal.core.middleware.MetadataConnectionMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Inside CommonMiddleware (which still sees the 404 for APPEND_SLASH): a 404 under
    # /api/ is JSON even with DEBUG on, where Django would show its HTML debug page.
    "backfill_portal.core.middleware.ApiNotFoundMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who is asking, for the audit rows of changes that pass no service (a user's roles
    # changed in the admin: core/role_audit.py).
    "backfill_portal.core.middleware.RequestActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # A visit to a page's POST-only action address: a page saying so, not a blank 405.
    "backfill_portal.core.middleware.MethodNotAllowedPageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # Last, as its docs ask: turns a login refused by a lockout into the lockout page.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "backfill_portal.urls"
WSGI_APPLICATION = "backfill_portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "backfill_portal.web.context_processors.navigation",
            ],
        },
    },
]


def process_kind(argv: list[str]) -> str:
    """What this process is, as far as its metadata connections go: `web` (gunicorn,
    `manage.py runserver`: threads serve requests at once), `worker` (`celery ...
    worker`: each process runs a task, plus an attempt's heartbeat thread), or `command`
    (everything else: a management command, the scheduler, a shell, the test run),
    which makes one connection and must fail at once with the server's own words."""
    if not argv:
        return "command"
    program = Path(argv[0])
    name = program.parent.name if program.name == "__main__.py" else program.name  # python -m ...
    if name == "gunicorn" or (name in ("manage.py", "django-admin") and argv[1:2] == ["runserver"]):
        return "web"
    if name == "celery" and "worker" in argv[1:]:
        return "worker"
    return "command"


def pool_settings() -> tuple[int, float]:
    """(DATABASE_POOL_MAX_SIZE, DATABASE_POOL_TIMEOUT), checked."""
    max_size = env_int("DATABASE_POOL_MAX_SIZE", 4)
    timeout = env_float("DATABASE_POOL_TIMEOUT", 10.0)
    if max_size < 0:
        raise ImproperlyConfigured(f"DATABASE_POOL_MAX_SIZE={max_size} must be 0 (no pool) or more")
    if max_size and timeout == 0:
        raise ImproperlyConfigured("DATABASE_POOL_TIMEOUT must be more than 0 seconds")
    return max_size, timeout


PROCESS_KIND = process_kind(sys.argv)
# Web and worker processes take their metadata connections from a pool of at most
# DATABASE_POOL_MAX_SIZE per process (Django's psycopg pool, PostgreSQL only): threads
# beyond it wait up to DATABASE_POOL_TIMEOUT seconds for one, then the request is a 503
# with Retry-After (core/middleware.py). 0: no pool, a connection per thread kept for
# DATABASE_CONN_MAX_AGE, as management commands always have. README: "Connections".
DATABASE_POOL_MAX_SIZE, DATABASE_POOL_TIMEOUT = pool_settings()


def dead_peer_settings() -> dict[str, int]:
    """PostgreSQL's own keepalives for a session, from DATABASE_DEAD_PEER_SECONDS (N,
    default 60): the server ends a session whose peer is gone (a worker host powered
    off or cut off) within about N seconds of its falling silent, probing from N / 2
    seconds of silence, five times N / 10 apart. Probes are answered by the peer's
    operating system, so a peer that is only slow or busy is never cut (`tcp_user_timeout`
    is left alone: it would also cut a reader that stopped reading for N seconds). 0:
    none, the operating system's defaults (two hours and more); also behind PgBouncer,
    which refuses startup options and is itself the server's peer."""
    seconds = env_int("DATABASE_DEAD_PEER_SECONDS", 60, minimum=0)
    if not seconds:
        return {}
    return {"tcp_keepalives_idle": max(1, seconds // 2), "tcp_keepalives_interval": max(1, seconds // 10),
            "tcp_keepalives_count": 5}


def database_config(url: str, process: str = "command") -> dict:
    try:
        # Connections persist between requests and tasks (for tasks see
        # CELERY_DB_REUSE_MAX), checked before reuse so a server restart costs a
        # reconnect, not an error.
        config = dj_database_url.parse(url, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 300, minimum=0),
                                       conn_health_checks=True)
    except Exception as exc:  # dj_database_url raises bare ValueError/KeyError
        raise ImproperlyConfigured(f"cannot parse database URL {url!r}: {exc}") from None
    if config["ENGINE"] not in ("django.db.backends.postgresql", "django.db.backends.sqlite3"):
        # The metadata database is PostgreSQL (or SQLite for trying it out): the migrations,
        # the audit triggers and the roles are written for those two.
        scheme = url.split("://", 1)[0]
        raise ImproperlyConfigured(f"DATABASE_URL: {scheme}:// is not supported; use postgres://... (or sqlite:///... "
                                   "to try it out)")
    if config["ENGINE"] == "django.db.backends.postgresql" and env_bool("DATABASE_PREPARED", True):
        # Server-side parameters, so psycopg prepares a statement after its fifth use
        # on a connection: the worker repeats the same few dozen statements for every
        # interval, and planning them again each time is a large part of their cost. Off
        # (DATABASE_PREPARED=0) behind a pooler in transaction mode, which cannot keep
        # prepared statements.
        config["OPTIONS"] = {**config.get("OPTIONS", {}), "server_side_binding": True, "prepare_threshold": 5}
    dead_peer = dead_peer_settings()
    if config["ENGINE"] == "django.db.backends.postgresql" and dead_peer:
        # A worker host that vanishes inside a transaction (a dispatch, a publication's
        # record) holds the dispatch lock, the audit chain and its rows, and every
        # audited write in the portal waits on it. The server, waiting for the peer's
        # next statement, hears nothing from a peer that is gone; with its own
        # keepalives it ends the session within about DATABASE_DEAD_PEER_SECONDS,
        # rolling it back and letting go of the locks.
        options = config.get("OPTIONS", {})
        given = [options["options"]] if options.get("options") else []
        config["OPTIONS"] = {**options, "options": " ".join(given + [f"-c {k}={v}" for k, v in dead_peer.items()])}
    pool_max_size, pool_timeout = pool_settings()
    if config["ENGINE"] == "django.db.backends.postgresql" and process in ("web", "worker") and pool_max_size:
        # A connection per thread is unbounded under a threaded server (each
        # runserver request is a new thread). With the pool a request's or task's
        # connection goes back to it at the end (Django closes it: CONN_MAX_AGE must
        # be 0) and the next one reuses it, prepared statements included. Per process:
        # a Celery prefork child gets its own, as Celery's Django fixup closes the
        # pool in the parent before forking and again in each child after the fork.
        if process == "worker" and pool_max_size < 2:
            raise ImproperlyConfigured(f"DATABASE_POOL_MAX_SIZE={pool_max_size} is too small for a worker: "
                                       "a task and its attempt's heartbeat need 2")
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {**config.get("OPTIONS", {}), "pool": {
            "min_size": 1, "max_size": pool_max_size, "timeout": pool_timeout,
            "name": f"metadata-{process}"}}
    if config["ENGINE"] == "django.db.backends.sqlite3":
        # Web server and workers share the file: WAL lets readers run beside the
        # writer, IMMEDIATE takes the write lock at BEGIN so two writers queue on
        # the busy timeout instead of failing with "database is locked".
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    return config


DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'portal.sqlite3'}")
DATABASES = {"default": database_config(DATABASE_URL, PROCESS_KIND)}
# The same for the warehouse's PostgreSQL sessions (backends/postgresql.py).
DATABASE_DEAD_PEER_SETTINGS = dead_peer_settings()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The warehouse is a second database reached only through its backend, chosen by the
# URL's scheme (backfill_portal.backends: sqlite, postgresql), never through the ORM.
WAREHOUSE_URL = env_str("WAREHOUSE_URL", f"sqlite:///{VAR_DIR / 'warehouse.sqlite3'}")

# Warehouse sessions (PostgreSQL): no statement waits on a lock longer than this; a
# session idle inside a transaction longer than this (its worker frozen or cut off)
# is ended by the server, which rolls it back and releases its locks. A healthy
# staging transaction is never idle that long: it writes at least every few seconds
# while rows come. 0 turns either off.
WAREHOUSE_LOCK_TIMEOUT_SECONDS = env_int("WAREHOUSE_LOCK_TIMEOUT_SECONDS", 60, minimum=0)
WAREHOUSE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = env_int("WAREHOUSE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", 600, minimum=0)
# A publish or rollback on PostgreSQL swaps partitions of the reader table, which waits
# for readers of it. Each try waits at most WAREHOUSE_PUBLISH_LOCK_TIMEOUT_SECONDS (so a
# reader arriving meanwhile, queued behind it, waits no longer), then lets go and tries
# again, for up to WAREHOUSE_PUBLISH_WAIT_SECONDS in all.
WAREHOUSE_PUBLISH_LOCK_TIMEOUT_SECONDS = env_float("WAREHOUSE_PUBLISH_LOCK_TIMEOUT_SECONDS", 1.0)
WAREHOUSE_PUBLISH_WAIT_SECONDS = env_float("WAREHOUSE_PUBLISH_WAIT_SECONDS", 300.0)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# The axes backend refuses a locked-out username before any password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(VAR_DIR / "staticfiles")))
if STATIC_ROOT == VAR_DIR / "staticfiles":
    STATIC_ROOT.mkdir(exist_ok=True)  # WhiteNoise warns about a missing one until collectstatic fills it
# `collectstatic` writes each file and its gzip beside it; WhiteNoise serves them with
# the right type and encoding. No manifest (hashed names): pages and tests render
# without a collectstatic first, and the portal's few files change with each release.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_MAX_AGE = env_int("STATIC_MAX_AGE", 3600, minimum=0)

# --- Production hardening: all on when DEBUG is off, so `check --deploy` is clean.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
if not DEBUG:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Probes and scrapers speak plain HTTP to the process itself: no redirect to https.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]

# --- Observability (backfill_portal/ops): /metrics is computed from the metadata
# database at scrape time, so any web process on any host answers the same. With
# METRICS_TOKEN set it needs `Authorization: Bearer <token>`; without, it answers only
# direct loopback callers (no X-Forwarded-For: nothing relayed by a proxy).
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# Seconds each readiness check (database, warehouse, broker) may take before it counts as down.
HEALTH_CHECK_TIMEOUT = env_int("HEALTH_CHECK_TIMEOUT", 3)
if HEALTH_CHECK_TIMEOUT < 1:
    raise ImproperlyConfigured(f"HEALTH_CHECK_TIMEOUT={HEALTH_CHECK_TIMEOUT} must be at least 1")

# --- Sign-in lockout (django-axes): this many failed sign-ins for one username lock it
# for LOGIN_LOCKOUT_MINUTES, the right password included. Counted per username, not per
# address, so guessing from many addresses is stopped too; the lock is a fixed window
# from the failure that set it (refused attempts during it do not extend it). Every
# failure is audited (core/services/auth.py). An admin unlocks sooner with
# `manage.py axes_reset_username USER`.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 5)
LOGIN_LOCKOUT_MINUTES = env_int("LOGIN_LOCKOUT_MINUTES", 15)
if LOGIN_FAILURE_LIMIT < 1 or LOGIN_LOCKOUT_MINUTES < 1:
    raise ImproperlyConfigured("LOGIN_FAILURE_LIMIT and LOGIN_LOCKOUT_MINUTES must be at least 1")
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username"]
# axes warns when the address is not a lockout parameter because rotating user agents or
# cookies would then escape a lock; a username lock has neither in it. Locking by address
# would lock out everyone behind one proxy (REMOTE_ADDR) after a few typos.
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False  # no start-up banner in every command's output; the audit log names each failure
AXES_LOCKOUT_CALLABLE = "backfill_portal.core.authentication.lockout_response"

# `load_demo` gives its users their well-known passwords only with DEBUG on, or with this.
DEMO_PASSWORDS = env_bool("DEMO_PASSWORDS", False)

# --- API tokens (POST /api/auth/token/, `manage.py issue_token`): every token expires.
API_TOKEN_DAYS = env_int("API_TOKEN_DAYS", 30)
API_TOKEN_MAX_DAYS = env_int("API_TOKEN_MAX_DAYS", 365)
if not 1 <= API_TOKEN_DAYS <= API_TOKEN_MAX_DAYS:
    raise ImproperlyConfigured(f"API_TOKEN_DAYS={API_TOKEN_DAYS} must be between 1 and API_TOKEN_MAX_DAYS={API_TOKEN_MAX_DAYS}")

EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "backfill-portal@localhost")

# --- Content-Security-Policy (django-csp; core/security.py). Every page of ours runs
# only our own static scripts and styles: no inline <script>, <style>, style="" or on*=
# (tests/web/test_csp.py, and the browser tests report any violation). The admin, the
# browsable API and Swagger UI carry inline style attributes of their own: under /admin/
# and /api/ only, style-src also allows 'unsafe-inline' (never script-src).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
CSP_INLINE_STYLE_PREFIXES = ("/admin/", "/api/")

# --- REST API
# A body over this many bytes is refused: 413 from the API (core/api.py), 400 from a page.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("DATA_UPLOAD_MAX_MEMORY_SIZE", 2_621_440, minimum=1024)
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # The token scheme first: its challenge makes a call without credentials a 401
        # with WWW-Authenticate (session auth has no challenge: first, it makes that a 403).
        "backfill_portal.core.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "backfill_portal.core.schema.PortalAutoSchema",
    # DRF's JSON parser, refusing a NUL character in any string or key (core/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "backfill_portal.core.parsers.StrictJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_FILTER_BACKENDS": ["backfill_portal.core.filters.PortalFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "backfill_portal.core.pagination.IdCursorPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "backfill_portal.core.api.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Backfill Portal API",
    "DESCRIPTION": "Governed, provable data backfills: request, approve, run in isolation, "
    "verify, publish atomically, reconcile, roll back.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # No deep links: Swagger UI renders an operation's path as a link inside the button
    # that opens it (axe: nested-interactive); templates/drf_spectacular/swagger_ui.html
    # sets the page's language and darkens the badges to a readable contrast.
    "SWAGGER_UI_SETTINGS": {"deepLinking": False},
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "RequestStatusEnum": "backfill_portal.backfills.choices.RequestStatus",
        "IntervalStatusEnum": "backfill_portal.backfills.choices.IntervalStatus",
        "StepStatusEnum": "backfill_portal.backfills.choices.StepStatus",
        "StepKindEnum": "backfill_portal.backfills.choices.StepKind",
        "HandoffStatusEnum": "backfill_portal.backfills.models.HandoffItem.Status",
        "JobKindEnum": "backfill_portal.catalog.choices.JobKind",
        "RunStatusEnum": "backfill_portal.execution.choices.RunStatus",
        "AttemptStatusEnum": "backfill_portal.execution.choices.AttemptStatus",
        "PublicationActionEnum": "backfill_portal.warehouse.models.Publication.Action",
    },
}

# --- Celery
CELERY_BROKER_URL = env_url("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for sub in ("queue", "processed", "control"):
        (_broker_dir / sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # kombu's default is a relative "control" folder: a stray control/ in the checkout.
        "control_folder": str(_broker_dir / "control"),
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        # Kombu keeps its exchange table in ./control (the current directory) otherwise.
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
# Celery's Django fixup closes every database connection before and after each task
# unless told to reuse them, whatever CONN_MAX_AGE says: a new PostgreSQL backend per
# task (two per backfill interval), with cold catalog caches and no statement run often
# enough on one connection to be prepared. It now closes them every this many tasks;
# around each task backfill_portal.celery applies Django's own policy instead
# (CONN_MAX_AGE, health checks), as Django does around each request.
CELERY_DB_REUSE_MAX = env_int("CELERY_DB_REUSE_MAX", 1000, minimum=1)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TASK_DEFAULT_QUEUE = "backfill"
# Both queues are declared, so a worker started the plain way (`celery -A
# backfill_portal worker`, no -Q) consumes both: the sweeper is routed to
# `production`, and a worker that never took it left killed attempts unreaped and
# their requests running for ever. A production-only worker is `-Q production`.
CELERY_TASK_QUEUES = tuple(Queue(name, Exchange(name), routing_key=name) for name in ("production", "backfill"))
CELERY_TASK_ROUTES = {
    "execution.sweep": {"queue": "production"},
    "execution.schedule_production": {"queue": "production"},
    "core.anchor_audit": {"queue": "production"},
    "execution.probe_warehouse": {"queue": "production"},
}
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "execution.sweep", "schedule": env_int("SWEEP_SECONDS", 15, minimum=1)},
    "schedule-production": {"task": "execution.schedule_production", "schedule": 60.0},
    "expire-handoffs": {"task": "backfills.expire_handoffs", "schedule": 300.0},
    "purge-versions": {"task": "execution.purge_versions", "schedule": env_int("RETENTION_SWEEP_SECONDS", 3600, minimum=1)},
    "anchor-audit": {"task": "core.anchor_audit", "schedule": env_int("AUDIT_ANCHOR_SECONDS", 300, minimum=1)},
    "probe-warehouse": {"task": "execution.probe_warehouse", "schedule": env_float("WAREHOUSE_PROBE_SECONDS", 5.0, minimum=0.1)},
}

# A request waiting on a hand-off that never came (the process that committed its
# approval, its cancel or its last interval died before handing the work on) is moved
# on by the sweeper once it has waited this long: about a heartbeat timeout (60 s by
# default), so that a hand-off merely slow is not done twice.
SWEEP_GRACE_SECONDS = env_int("SWEEP_GRACE_SECONDS", 60)
if SWEEP_GRACE_SECONDS < 0:
    raise ImproperlyConfigured(f"SWEEP_GRACE_SECONDS={SWEEP_GRACE_SECONDS} must not be negative")

# --- Retries and outages
# An attempt that fails waits RETRY_BACKOFF_SECONDS * 2^(n-1) (n: the failed attempt's
# number), capped at RETRY_BACKOFF_MAX_SECONDS, and then a random half to all of that
# (jitter, so runs that failed together do not retry together) before the next one.
RETRY_BACKOFF_SECONDS = env_float("RETRY_BACKOFF_SECONDS", 5.0)
RETRY_BACKOFF_MAX_SECONDS = env_float("RETRY_BACKOFF_MAX_SECONDS", 300.0)

# --- Bundles of cheap intervals
# A dispatch that queues several backfill runs of one job whose recent runs each took
# at most EXECUTION_BUNDLE_MAX_SECONDS sends them as bundles of up to
# EXECUTION_BUNDLE_SIZE runs: one task runs a bundle, each run keeping its own attempt,
# version, checks, publication and audit rows, with one transaction per step for the
# whole bundle instead of one per run (docs/performance.md). A bundle holds at most
# what the job's gates let run at once divided by EXECUTION_BUNDLE_LANES, the worker
# processes that serve the backfill queue (2, as `make run` starts), so bundles never
# leave a worker idle that runs alone would have kept busy. 1 turns bundles off. The
# gates usually decide the size (8 at once on 2 lanes: bundles of 4); 16 lets a request
# whose gates were raised for a cheap job share each bundle's fixed cost further (32 at
# once: bundles of 16, ~1.5x the throughput of bundles of 4, docs/performance.md), and a
# bundle is still one statement at a time on the warehouse.
EXECUTION_BUNDLE_SIZE = env_int("EXECUTION_BUNDLE_SIZE", 16)
EXECUTION_BUNDLE_MAX_SECONDS = env_float("EXECUTION_BUNDLE_MAX_SECONDS", 2.0)
EXECUTION_BUNDLE_LANES = env_int("EXECUTION_BUNDLE_LANES", 2)
if EXECUTION_BUNDLE_SIZE < 1 or EXECUTION_BUNDLE_LANES < 1:
    raise ImproperlyConfigured(f"EXECUTION_BUNDLE_SIZE={EXECUTION_BUNDLE_SIZE} and EXECUTION_BUNDLE_LANES="
                               f"{EXECUTION_BUNDLE_LANES} must be at least 1")
# While the warehouse refuses connections no attempt starts and no run is dispatched;
# the probe-warehouse task above tries a fresh connection every WAREHOUSE_PROBE_SECONDS
# and resumes the work once one succeeds. A connection attempt gives up after this long.
WAREHOUSE_CONNECT_TIMEOUT = env_int("WAREHOUSE_CONNECT_TIMEOUT", 10, minimum=1)

# --- OpenLineage out (execution/lineage_out/, docs/openlineage.md)
# Off by default. OPENLINEAGE_URL sends each run's events over HTTP (POST to
# OPENLINEAGE_URL + OPENLINEAGE_ENDPOINT, Marquez's and the spec's api/v1/lineage);
# OPENLINEAGE_FILE appends them, one JSON object a line, to a file. One of the two.
OPENLINEAGE_URL = env_str("OPENLINEAGE_URL", "").strip()
OPENLINEAGE_FILE = env_str("OPENLINEAGE_FILE", "").strip()
OPENLINEAGE_ENDPOINT = env_str("OPENLINEAGE_ENDPOINT", "api/v1/lineage").strip().lstrip("/")
OPENLINEAGE_API_KEY = env_str("OPENLINEAGE_API_KEY", "")
OPENLINEAGE_TIMEOUT_SECONDS = env_float("OPENLINEAGE_TIMEOUT_SECONDS", 5.0, minimum=0.001)
# The jobs' namespace; datasets are named after the warehouse (postgres://host:port and
# database.schema.table, as OpenLineage's naming spec says) unless told otherwise.
OPENLINEAGE_NAMESPACE = env_str("OPENLINEAGE_NAMESPACE", "backfill-portal").strip()
OPENLINEAGE_DATASET_NAMESPACE = env_str("OPENLINEAGE_DATASET_NAMESPACE", "").strip()
if OPENLINEAGE_URL and OPENLINEAGE_FILE:
    raise ImproperlyConfigured("set OPENLINEAGE_URL or OPENLINEAGE_FILE, not both")
if OPENLINEAGE_URL and urlsplit(OPENLINEAGE_URL).scheme not in ("http", "https"):
    raise ImproperlyConfigured(f"OPENLINEAGE_URL={OPENLINEAGE_URL!r} must be an http:// or https:// URL")
if OPENLINEAGE_URL and not urlsplit(OPENLINEAGE_URL).hostname:
    raise ImproperlyConfigured(f"OPENLINEAGE_URL={OPENLINEAGE_URL!r} names no host")
if not OPENLINEAGE_NAMESPACE:
    raise ImproperlyConfigured("OPENLINEAGE_NAMESPACE must not be empty")

# --- Product limits
# Versions older than this are purged (never the current or previous verified one of a
# partition, nor anything a rollback or a running job still needs).
VERSION_RETENTION_DAYS = env_int("VERSION_RETENTION_DAYS", 30)
if VERSION_RETENTION_DAYS < 1:
    raise ImproperlyConfigured(f"VERSION_RETENTION_DAYS={VERSION_RETENTION_DAYS} must be at least 1")
# OpenLineage events delivered longer ago than this are deleted (never an undelivered one).
LINEAGE_EVENT_RETENTION_DAYS = env_int("LINEAGE_EVENT_RETENTION_DAYS", 30)
if LINEAGE_EVENT_RETENTION_DAYS < 1:
    raise ImproperlyConfigured(f"LINEAGE_EVENT_RETENTION_DAYS={LINEAGE_EVENT_RETENTION_DAYS} must be at least 1")
BACKFILL_MAX_INTERVALS = env_int("BACKFILL_MAX_INTERVALS", 30000, minimum=1)
# Requests with more intervals than this also need an admin's approval.
BACKFILL_ADMIN_APPROVAL_OVER = env_int("BACKFILL_ADMIN_APPROVAL_OVER", 400, minimum=0)
# An active run with no sign of life (sent, started, a heartbeat) for this long is listed
# as stuck on the runs list and the on-call home; the sweeper repairs a lost message or a
# dead attempt well within it, so what is still silent after it needs a person.
RUN_STUCK_AFTER_SECONDS = env_int("RUN_STUCK_AFTER_SECONDS", 900)
if RUN_STUCK_AFTER_SECONDS < 1:
    raise ImproperlyConfigured(f"RUN_STUCK_AFTER_SECONDS={RUN_STUCK_AFTER_SECONDS} must be at least 1")
# How long downstream owners have to answer a hand-off.
HANDOFF_WINDOW_HOURS = env_int("HANDOFF_WINDOW_HOURS", 72, minimum=1)
# Task outbox rows once sent are history (lost work is re-sent from run state): the
# retention task deletes those sent more than this many days ago.
TASK_OUTBOX_RETENTION_DAYS = env_int("TASK_OUTBOX_RETENTION_DAYS", 7)
if TASK_OUTBOX_RETENTION_DAYS < 1:
    raise ImproperlyConfigured(f"TASK_OUTBOX_RETENTION_DAYS={TASK_OUTBOX_RETENTION_DAYS} must be at least 1")

# Each run's own log lines, one file per run_id, read by its run page (core/logging.py
# RunLogHandler). Empty: not kept. Workers on several machines need it on a shared disk.
RUN_LOG_DIR = env_str("RUN_LOG_DIR", str(VAR_DIR / "log" / "runs"))
# The level of every process's log, the worker's and the scheduler's too (a `--loglevel`
# given to celery takes its place there).
LOG_LEVEL = env_str("LOG_LEVEL", "INFO").strip().upper()
if LOG_LEVEL not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
    raise ImproperlyConfigured(f"LOG_LEVEL={os.environ.get('LOG_LEVEL')!r} must be one of DEBUG, INFO, WARNING, "
                               "ERROR, CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "structured": {"()": "backfill_portal.core.logging.StructuredFormatter"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "structured"},
        "runs": {"()": "backfill_portal.core.logging.RunLogHandler"},
    },
    "root": {"handlers": ["console", "runs"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
