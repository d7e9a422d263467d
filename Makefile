# Yardmaster: the two front-door commands are `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test fuzz lint bench eval eval-all eval-full venv clean

venv: $(STAMP)
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]" -e cli/
	@rm -f $(VENV)/.installed-* && touch $@

## Serve the portal at http://127.0.0.1:8000 (gunicorn) with a Celery worker, beat and simulated node agents,
## supervised: a process that dies is restarted; Ctrl-C stops everything, workloads included, within 10 s.
run: venv
	@bash scripts/run-demo.sh $(RUN_ARGS)

## The whole test suite against real PostgreSQL and Redis (started here if installed but stopped), on
## TEST_WORKERS pytest-xdist workers: each has its own test database (test_<name>_gw1), Redis database
## (REDIS_URL's + its index), var folder and rendezvous ports (tests/envdefaults.py). TEST_WORKERS=0 runs
## it in one process. Six on two cores: most of the suite's live tests wait on processes and timers (four
## workers left the cores half idle, 10 min 12 s; six took 7 min 35 s, at most 41 PostgreSQL connections).
TEST_WORKERS ?= 6
test: venv
	@bash scripts/services.sh
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/yardmaster} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/0} \
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

## The property tests on fresh random examples (make test draws the same ones every run); ROUNDS=5 runs 5.
fuzz: venv
	@for i in $$(seq $${ROUNDS:-1}); do HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest -q -p no:randomly tests/property || exit 1; done

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	SECRET_KEY=lint $(PY) -m mypy portal tenants scheduling nodeagent sso notifications cli/yardcli
	$(VENV)/bin/lint-imports --no-cache
	SECRET_KEY=lint $(PY) manage.py makemigrations --check --dry-run

## Benchmarks: they print their figures; nothing here asserts a time. Each runs over BENCH_BASE's code and
## this checkout's in one sitting and the ratios are printed (bench/compare.py); BENCH_BASE= runs this one only,
## BENCH_ARGS="--quick heartbeat" a smaller, chosen set.
BENCH_BASE ?= b9ece15
bench: venv
	@bash scripts/services.sh
	$(PY) bench/compare.py --base "$(BENCH_BASE)" $(BENCH_ARGS)

## Trace replay: issue 30's question (Yardmaster against every baseline, estimated limits) on the deployment's 5 s cycle,
## EVAL_JOBS replays at a time, in about 5 minutes on two idle cores: both gang-heavy workloads at 100 nodes at spanning
## slowdowns 0, 10 and 25 %, and the Philly month at 192 and 160 nodes at 0 and 25 % (its 10 % rows are in eval-all);
## tables and plots under docs/eval/. eval-all: Philly at 10 % too (docs/eval/all-slowdowns/); eval-full adds 256
## nodes and exact limits (docs/eval/full/). Timings and what each table measures: docs/evaluation.md.
EVAL_JOBS ?= 2
eval: venv
	$(PY) -m scheduling.sim --nodes 192 160 --trace-slowdowns 0,0.25 --time-limits estimate --jobs $(EVAL_JOBS) --out docs/eval

eval-all: venv
	$(PY) -m scheduling.sim --nodes 192 160 --time-limits estimate --jobs $(EVAL_JOBS) --out docs/eval/all-slowdowns

eval-full: venv
	$(PY) -m scheduling.sim --nodes 256 192 160 --time-limits both --jobs $(EVAL_JOBS) --out docs/eval/full

clean:
	rm -rf var/ .pytest_cache .mypy_cache .ruff_cache
