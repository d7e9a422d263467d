#!/usr/bin/env bash
# Make sure the services the test suite talks to are up: PostgreSQL and Redis on 127.0.0.1,
# and Debian's Chromium for the browser tests. Starts what is installed but stopped; says
# plainly what is missing and how to get it.
set -u
missing=0

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; }

if ! pg_up; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "services: starting PostgreSQL"
    for v in $(ls /etc/postgresql); do pg_ctlcluster --skip-systemctl-redirect "$v" main start 2>/dev/null || true; done
    for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  fi
  pg_up || { echo "services: PostgreSQL is not running on 127.0.0.1:5432 and could not be started." \
                  "Install it (apt-get install postgresql) or set DATABASE_URL to a server you have."; missing=1; }
fi

if ! redis_up; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "services: starting Redis"
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log >/dev/null 2>&1 || \
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null 2>&1 || true
    for _ in $(seq 1 20); do redis_up && break; sleep 0.5; done
  fi
  redis_up || { echo "services: Redis is not running on 127.0.0.1:6379 and could not be started." \
                     "Install it (apt-get install redis-server) or set REDIS_URL."; missing=1; }
fi

if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing Debian's chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
      || echo "services: could not install chromium; browser tests will be skipped with that reason"
  else
    echo "services: chromium is not installed (apt-get install chromium); browser tests will be skipped"
  fi
fi

# libfaketime: the clock-skew fault test runs an agent whose clock is minutes off.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 ] && ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing Debian's faketime for the clock-skew test"
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null 2>&1 \
      || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null)) \
      || echo "services: could not install faketime; the clock-skew test will be skipped with that reason"
  else
    echo "services: faketime is not installed (apt-get install faketime); the clock-skew test will be skipped"
  fi
fi

# Dev sessions: the agent runs Debian's OpenSSH server per session, and the tests log in with its client.
if [ ! -x /usr/sbin/sshd ] || ! command -v ssh >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing Debian's openssh-server for the dev-session tests"
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null 2>&1 \
      || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            openssh-server openssh-client >/dev/null)) \
      || echo "services: could not install openssh-server; the dev-session tests will be skipped with that reason"
  else
    echo "services: openssh-server is not installed (apt-get install openssh-server); the dev-session tests will be skipped"
  fi
fi

# Containers (issue 26): runc runs a task's image, skopeo pulls it, umoci unpacks it; the tests push a
# busybox-static image to Debian's docker-registry, and htpasswd (apache2-utils) makes its bcrypt logins.
ct_missing=""
for tool in runc:runc skopeo:skopeo umoci:umoci docker-registry:docker-registry busybox:busybox-static htpasswd:apache2-utils; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || ct_missing="$ct_missing ${tool#*:}"
done
if [ -n "$ct_missing" ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "services: installing Debian's$ct_missing for the container tests"
    # shellcheck disable=SC2086  # one package per word
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $ct_missing >/dev/null 2>&1 \
      || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $ct_missing >/dev/null)) \
      || echo "services: could not install$ct_missing; the container tests will be skipped with that reason"
  else
    echo "services: not installed:$ct_missing (apt-get install$ct_missing); the container tests will be skipped"
  fi
fi

if [ "$missing" = 1 ]; then exit 1; fi
# The test database's owner must exist; `trust` auth on this machine lets postgres create it.
psql -h 127.0.0.1 -U postgres -d postgres -tAc "select 1" >/dev/null 2>&1 || {
  echo "services: cannot connect to PostgreSQL as user postgres; set DATABASE_URL"; exit 1; }
exit 0
