#!/usr/bin/env bash
# `make run`: migrate, seed the demo, then serve the portal with a Celery worker, beat and the
# simulated node agents beside it. SQLite and the filesystem broker unless DATABASE_URL/REDIS_URL
# are set. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBUG="${DEBUG:-1}"
PY=.venv/bin/python
mkdir -p var/broker/out var/broker/processed var/broker/control var/logs

$PY manage.py migrate --noinput -v0
$PY manage.py seed_demo --agent-tokens var/agent-tokens.json

pids=()
cleanup() { trap - INT TERM EXIT; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup INT TERM EXIT

.venv/bin/celery -A portal worker --concurrency 2 --loglevel WARNING >var/logs/worker.log 2>&1 & pids+=($!)
.venv/bin/celery -A portal beat --schedule var/celerybeat-schedule --loglevel WARNING >var/logs/beat.log 2>&1 & pids+=($!)
if $PY -c "import nodeagent.fleet" 2>/dev/null; then
  $PY -m nodeagent.fleet --portal http://127.0.0.1:8000 --tokens-file var/agent-tokens.json \
    --state-dir var/agents >var/logs/agents.log 2>&1 & pids+=($!)
fi

cat <<MSG

  Yardmaster is up:  http://127.0.0.1:8000
  Sign in as admin / yardmaster-demo (cluster admin), rita (org admin), bob (team lead),
  alice or carol (team members); every demo password is yardmaster-demo.
  Logs of the worker, beat and agents: var/logs/

MSG
$PY manage.py runserver 127.0.0.1:8000 --noreload
