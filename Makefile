# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: run test install migrate demo static bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

demo: migrate
	$(PY) manage.py load_demo

# The production build step: static files into STATIC_ROOT (default var/staticfiles),
# served by the web processes themselves with DEBUG=0 (docs/deploy.md).
static: install
	$(PY) manage.py collectstatic --noinput

# Web server, one Celery worker and the periodic scheduler; Ctrl-C stops all three.
run: demo
	$(PY) manage.py run_portal

test: install
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: install
	$(PY) benchmarks/plan_intervals.py

clean:
	rm -rf var .pytest_cache
