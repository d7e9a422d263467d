#!/usr/bin/env bash
# `make run`: migrate, seed the demo, collect the static files, then hand over to the supervisor
# (portal/devserver.py): gunicorn, a Celery worker, beat and the simulated node agents, each restarted
# if it dies; Ctrl-C or SIGTERM stops all of them, and every workload they started, within 10 s.
# SQLite and the embedded broker unless DATABASE_URL/REDIS_URL are set.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export YARD_VAR_DIR="${YARD_VAR_DIR:-$PWD/var}"

if [[ -z "${DATABASE_URL:-}" && -z "${REDIS_URL:-}" ]]; then
  # The zero-setup demo on this machine only: DEBUG pages help, and nothing else is at stake. It runs
  # with DEBUG=0 too (its secret key is generated under var/). With PostgreSQL or Redis configured
  # this is a real deployment's configuration, and DEBUG stays as the environment says (off).
  export DEBUG="${DEBUG:-1}"
fi
# `make run` serves 127.0.0.1 only; a deployment sets its own host names.
export ALLOWED_HOSTS="${ALLOWED_HOSTS:-127.0.0.1,localhost}"
mkdir -p "$YARD_VAR_DIR"/broker/out "$YARD_VAR_DIR"/broker/processed "$YARD_VAR_DIR"/broker/control "$YARD_VAR_DIR"/logs

$PY manage.py migrate --noinput -v0
$PY manage.py seed_demo --agent-tokens "$YARD_VAR_DIR/agent-tokens.json"
$PY manage.py collectstatic --noinput -v0

# exec: the supervisor gets make's Ctrl-C and SIGTERM itself, with no shell in between.
exec $PY -m portal.devserver "$@"
