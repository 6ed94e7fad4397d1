# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test fuzz install migrate demo static bench clean

$(STAMP): pyproject.toml
	@echo "==> installing the Python dependencies into $(VENV) (pip; about 40 s on a fresh machine) ..."
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)
	@echo "==> dependencies installed"

install: $(STAMP)

migrate: install
	@echo "==> migrating the metadata database ..."
	$(PY) manage.py migrate --noinput

demo: migrate
	@echo "==> loading the demo: users, catalog, source data (about a minute the first time; a line per month) ..."
	$(PY) manage.py load_demo

# The production build step: static files into STATIC_ROOT (default var/staticfiles),
# served by the web processes themselves with DEBUG=0 (docs/deploy.md).
static: install
	$(PY) manage.py collectstatic --noinput

# Web server, one Celery worker and the periodic scheduler; Ctrl-C stops all three.
run: demo
	$(PY) manage.py run_portal

# The layers contracts (.importlinter, docs/architecture.md) first: a wrong import fails
# the build before any test runs. --durations: the 25 slowest tests close the log, so a
# CI run shows where its time goes.
test: install
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest --durations=25 $(PYTEST_ARGS)

# Schemathesis against a live server, as CI runs it (DATABASE_URL etc. pick the backend;
# on PostgreSQL the named databases are dropped and created anew).
fuzz: install
	$(PY) tests/fuzz/run_fuzz.py

bench: install
	$(PY) benchmarks/plan_intervals.py

clean:
	rm -rf var .pytest_cache
