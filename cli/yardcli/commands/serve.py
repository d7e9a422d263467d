"""yard serve create, status, logs, scale, rollout, delete, token: inference services (docs/services.md) over
/api/v1/services.

A service is named as people name it: NAME is looked up with GET /api/v1/services?name=NAME (and &team=T
with --team); a name two teams use asks for --team; a number is the service's id.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from yardcli import result as r
from yardcli.client import Api, ApiError
from yardcli.commands.common import (
    _api,
    _duration_s,
    _fail,
    _only_team,
    _poll_s,
    _print_json,
    _table,
    _when,
    api_command,
    err,
    json_option,
    out,
)
from yardcli.commands.submit import _env_pairs

BASE = "/api/v1/services"
ROLLOUT_DONE = ("complete", "rolled_back")
# What a spec file (-f) may say: the fields POST /api/v1/services takes. Checked here because the API
# drops a key it does not know without a word, and a misspelt `readines_path` must not pass unnoticed.
SPEC_FIELDS = frozenset(
    {
        "name", "team", "tier", "replicas", "min_replicas", "max_replicas", "target_inflight", "scale_cooldown_s",
        "nodes_per_replica", "gpus_per_node", "gpu_type", "cpus_per_node", "memory_mb_per_node", "port",
        "readiness_path", "liveness_path", "probe_period_s", "probe_timeout_s", "failure_threshold",
        "success_threshold", "initial_delay_s", "progress_deadline_s", "image", "command", "env",
        "container_mounts", "container_workdir",
    }
)  # fmt: skip
SPEC_HEADER = ("apiVersion", "kind")


# --------------------------------------------------------------------------- naming a service


def _not_found(message: str) -> NoReturn:
    raise ApiError(404, {"code": "not_found", "message": message, "fields": {}}, message)


def _find(api: Api, ref: str, team: str | None) -> dict[str, Any]:
    """The service NAME (or id) names, as the list answers it (no replicas or stats)."""
    if ref.isdigit():
        return dict(api.get(f"{BASE}/{int(ref)}"))
    found = api.get(BASE, name=ref, team=team)
    if not found:
        where = f" in team {team}" if team else ""
        _not_found(f"No service called {ref}{where}, or not one you can see")
    if len(found) > 1:
        teams = ", ".join(str(s["team"]["slug"]) for s in found)
        raise click.UsageError(f"{ref} is a service of several teams ({teams}): say which with --team")
    return dict(found[0])


def _service_id(api: Api, ref: str, team: str | None) -> int:
    return int(ref) if ref.isdigit() else int(_find(api, ref, team)["id"])


team_option = click.option("--team", help="The service's team (slug or id), where teams share a service name")


def _endpoint(api: Api, svc: dict[str, Any]) -> str:
    return f"{api.url}{svc['url']}"


def _shape(svc: dict[str, Any]) -> str:
    per = f"{svc['nodes_per_replica']}×{svc['gpus_per_node']}" if svc["nodes_per_replica"] > 1 else str(svc["gpus_per_node"])
    return f"{svc['replicas']} × {per} {svc['gpu_type']}"


def _rollout_words(rollout: dict[str, Any]) -> str:
    state = rollout["state"]
    head = f"revision {rollout['revision']}"
    if state == "progressing":
        head = f"progressing to revision {rollout['revision']}" + (
            f" from {rollout['from_revision']}" if rollout.get("from_revision") else ""
        )
    elif state == "rolled_back":
        head = f"rolled back, serving revision {rollout['revision']}"
    elif state == "complete":
        head = f"complete at revision {rollout['revision']}"
    made = f"{rollout['updated']} replica{'s' if rollout['updated'] != 1 else ''} of it" + (
        f", {rollout['old']} of earlier revisions" if rollout.get("old") else ""
    )
    counts = f"{rollout['updated_ready']}/{rollout['wanted']} ready ({made})"
    return f"{head}: {counts}" + (f" ({rollout['message']})" if rollout.get("message") else "")


# --------------------------------------------------------------------------- the group


@click.group()
def serve() -> None:
    """Inference services: long-lived replicated servers reached through the portal (create, status, logs,
    scale, rollout, delete, token).

    \b
      yard serve create chat --team nlp --gpu-type H100 --replicas 2 --command 'vllm serve m --port $PORT'
      yard serve status chat
      yard serve rollout chat --image registry.example.com/chat:2 --wait
      yard serve token create chat --token-name frontend
    """


# --------------------------------------------------------------------------- create


def _spec_file(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="-f") from None
    if not isinstance(data, dict):
        raise click.BadParameter(f"{path}: a service spec is a mapping of the API's fields (name, team, gpu_type, …)")
    if data.get("kind", "Service") != "Service":
        raise click.BadParameter(f"{path}: kind is {data['kind']!r}; a service spec's kind is Service (jobs: yard submit)")
    unknown = sorted(str(k) for k in data if k not in SPEC_FIELDS and k not in SPEC_HEADER)
    if unknown:
        known = ", ".join(sorted(SPEC_FIELDS))
        raise click.BadParameter(f"{path}: unknown field(s) {', '.join(unknown)}; a spec may give {known}", param_hint="-f")
    return {k: v for k, v in data.items() if k not in SPEC_HEADER}


@serve.command("create")
@click.argument("name", required=False)
@click.option(
    "-f",
    "--file",
    "spec_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A YAML or JSON spec: the API's fields (name, team, gpu_type, replicas, command, env, …)",
)
@click.option("--team", help="Team slug or id (default: your only team)")
@click.option("--gpu-type", help="GPU type of every replica, e.g. H100")
@click.option("--gpus-per-node", type=click.IntRange(1), help="GPUs per node of a replica (default 1)")
@click.option(
    "--nodes-per-replica",
    type=click.IntRange(1),
    help="Nodes per replica: rank 0 serves HTTP, the others are its workers (default 1)",
)
@click.option("--replicas", type=click.IntRange(1), help="Replicas (default 1)")
@click.option("--min", "min_replicas", type=click.IntRange(1), help="Autoscaling: at least this many replicas")
@click.option("--max", "max_replicas", type=click.IntRange(1), help="Autoscaling: at most this many replicas")
@click.option("--target-inflight", type=float, help="Autoscaling: requests in flight per replica to aim for")
@click.option("--tier", type=click.IntRange(1, 3), help="1 production, never preempted (default); 2 or 3 for staging")
@click.option("--image", help="Run every replica in this container image")
@click.option("--command", "command_text", help="The server's command; it listens on $PORT unless --port")
@click.option("-e", "--env", "env", multiple=True, help="NAME=value (repeatable)")
@click.option("--port", type=int, help="A fixed port the server listens on (default: $PORT, a free one the cycle picks)")
@click.option("--readiness-path", help="Readiness probe of rank 0, e.g. /health")
@click.option("--liveness-path", help="Liveness probe of rank 0, e.g. /health (default: none)")
@click.option("--progress-deadline", help="A rollout not ready by then is rolled back: seconds, 10m, 1h")
@json_option
@api_command
def serve_create(
    name: str | None, spec_file: Path | None, team: str | None, gpu_type: str | None, gpus_per_node: int | None,
    nodes_per_replica: int | None, replicas: int | None, min_replicas: int | None, max_replicas: int | None,
    target_inflight: float | None, tier: int | None, image: str | None, command_text: str | None, env: tuple[str, ...],
    port: int | None, readiness_path: str | None, liveness_path: str | None, progress_deadline: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Create service NAME (its endpoint is /services/<team>/NAME/ on the portal); the controller starts its
    replicas, which queue like jobs."""
    api = _api()
    flags: dict[str, Any] = {
        "gpu_type": gpu_type, "gpus_per_node": gpus_per_node, "nodes_per_replica": nodes_per_replica,
        "replicas": replicas, "min_replicas": min_replicas, "max_replicas": max_replicas,
        "target_inflight": target_inflight, "tier": tier, "image": image, "command": command_text,
        "env": _env_pairs(env) or None, "port": port, "readiness_path": readiness_path, "liveness_path": liveness_path,
        "progress_deadline_s": _duration_s(progress_deadline, param="--progress-deadline"),
    }  # fmt: skip
    if spec_file is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in flags.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: with -f, say it in the file (NAME and --team may fill in)")
        payload = _spec_file(spec_file)
        for key, value in (("name", name), ("team", team)):
            if value is not None and payload.get(key) not in (None, value):
                raise click.UsageError(f"the file's {key} is {payload[key]}, the command line's {value}: give one")
            if value is not None:
                payload[key] = value
        if not payload.get("name"):
            raise click.UsageError("Name the service: yard serve create NAME -f FILE, or name: in the file")
        payload.setdefault("team", _only_team(api))
    else:
        if not name:
            raise click.UsageError("Name the service: yard serve create NAME --gpu-type H100 --command '…'")
        if not gpu_type:
            raise click.UsageError("Say which GPUs with --gpu-type, e.g. --gpu-type H100")
        payload = {"name": name, "team": team or _only_team(api)}
        payload.update({k: v for k, v in flags.items() if v is not None})
    svc = api.post(BASE, json=payload)
    if as_json:
        _print_json(svc)
        return
    out.print(
        f"Created service {svc['id']} {svc['name']} (team {svc['team']['slug']}): {_shape(svc)}, tier {svc['tier']}; "
        f"revision {svc['revision']}, its replicas queue like jobs",
        markup=False,
    )
    out.print(f"endpoint: {_endpoint(api, svc)}", markup=False)


# --------------------------------------------------------------------------- status


def _replica_note(rep: dict[str, Any]) -> str:
    notes = []
    if rep["draining"]:
        notes.append("draining")
    if rep["state"] == "PENDING" and rep.get("pending_reason"):
        notes.append(rep["pending_reason"])
        if rep.get("estimated_start"):
            notes.append(f"ETA {_when(rep['estimated_start'])}")
    if rep.get("message"):
        notes.append(rep["message"])
    return "; ".join(notes)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _status_one(api: Api, svc: dict[str, Any]) -> None:
    autoscale = (
        f", autoscaled {svc['min_replicas']}-{svc['max_replicas']} at {svc['target_inflight']:g} in flight each"
        if svc.get("autoscaled")
        else ""
    )
    release = svc.get("image") or svc.get("command") or ""
    stats = svc.get("stats") or {}
    traffic = (
        f"{stats.get('requests_per_s', 0):g} req/s, p50 {_ms(stats.get('p50_ms'))}, p99 {_ms(stats.get('p99_ms'))}, "
        f"{stats.get('errors', 0)} errors, {stats.get('inflight', 0):g} in flight (last {stats.get('seconds', 60):g} s)"
        if stats
        else ""
    )
    fields = [
        ("service", f"{svc['id']} {svc['name']}"),
        ("team / owner", f"{svc['team']['slug']} / {svc['user']}"),
        ("state", svc["state"]),
        ("shape", f"{_shape(svc)}, tier {svc['tier']}{autoscale}"),
        ("ready", f"{svc['ready_replicas']}/{svc['replicas']} replicas"),
        ("revision", f"{svc['revision']}: {release}" if release else svc["revision"]),
        ("rollout", _rollout_words(svc["rollout"])),
        ("traffic", traffic),
        ("probes", f"readiness {svc['readiness_path']}" + (f", liveness {svc['liveness_path']}" if svc["liveness_path"] else "")),
        ("endpoint", _endpoint(api, svc)),
    ]
    for label, value in fields:
        if value not in (None, ""):
            out.print(f"[bold]{label:>12}[/]  ", end="", markup=True)
            out.print(str(value), markup=False)
    replicas = svc.get("replica_list") or []
    out.print()
    if not replicas:
        out.print("no replicas yet (the controller starts them within seconds)", markup=False)
        return
    rows = [
        [rep["job"], rep["revision"], rep["state"], "yes" if rep["ready"] else "no", rep["restarts"],
         "yes" if rep["crash_looping"] else "", rep.get("node") or "", f"{rep['requests_per_s']:g}", _replica_note(rep)]
        for rep in replicas
    ]  # fmt: skip
    _table(["JOB", "REVISION", "STATE", "READY", "RESTARTS", "CRASH-LOOPING", "NODE", "REQ/S", "PENDING REASON / MESSAGE"], rows)


@serve.command("status")
@click.argument("name", required=False)
@team_option
@json_option
@api_command
def serve_status(name: str | None, team: str | None, as_json: bool) -> None:
    """One service's replicas, rollout, traffic and endpoint; without NAME, the services you can see (--team:
    one team's)."""
    api = _api()
    if name is None:
        services = api.get(BASE, team=team)
        if as_json:
            _print_json(services)
            return
        rows = [
            [s["id"], s["name"], s["team"]["slug"], s["state"], f"{s['ready_replicas']}/{s['replicas']}", s["revision"],
             s["rollout"]["state"], s["tier"], _shape(s), _endpoint(api, s)]
            for s in services
        ]  # fmt: skip
        _table(["ID", "NAME", "TEAM", "STATE", "READY", "REVISION", "ROLLOUT", "TIER", "GPUS", "ENDPOINT"], rows)
        if not services:
            out.print("no services" + (f" in team {team}" if team else ""), markup=False)
        return
    svc = api.get(f"{BASE}/{_service_id(api, name, team)}")
    if as_json:
        _print_json(svc)
        return
    _status_one(api, svc)


# --------------------------------------------------------------------------- logs


@serve.command("logs")
@click.argument("name")
@team_option
@click.option("--replica", type=click.IntRange(1), help="The replica's job id (default: the first live one)")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True)
@click.option("--tail", type=click.IntRange(0, 10_000), help="Only the last N lines first")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the replica writes, until it ends (or Ctrl-C)")
@json_option
@api_command
def serve_logs(
    name: str, team: str | None, replica: int | None, rank: int, tail: int | None, follow: bool, as_json: bool
) -> None:
    """A replica's output (rank 0 unless --rank), as its agent shipped it."""
    api = _api()
    service_id = _service_id(api, name, team)
    params: dict[str, Any] = {"rank": rank, "replica": replica}
    if tail is not None:
        params["tail"] = tail
    else:
        params["offset"] = 0
    attempt = None
    try:
        while True:
            page = api.get(f"{BASE}/{service_id}/logs", **params)
            if as_json:
                _print_json(page)
            elif page["text"]:
                sys.stdout.write(page["text"])
                sys.stdout.flush()
            if not follow and not page["text"] and not as_json:
                # Said on stderr, so that an empty answer is not mistaken for a server that printed nothing.
                what = f"replica {page['replica']} has written nothing yet" if page["replica"] else "no replica yet"
                err.print(f"service {name}: {what} (rank {rank})", markup=False)
            if page["replica"] is None and not follow:
                return
            if page["replica"] is not None:
                if attempt is not None and page.get("attempt") != attempt and not as_json:
                    err.print(f"-- replica {page['replica']}, attempt {page.get('attempt')} --", markup=False)
                attempt = page.get("attempt")
                # Follow this replica from here on, not whichever is first live at the next read.
                params = {"rank": rank, "replica": page["replica"], "offset": page["next_offset"]}
            if not follow:
                return
            if page["text"]:
                continue  # more may be there already
            if page["replica"] is not None:
                svc = api.get(f"{BASE}/{service_id}")
                if page["replica"] not in {rep["job"] for rep in svc.get("replica_list") or []}:
                    last = api.get(f"{BASE}/{service_id}/logs", **params)  # what came between the two reads
                    if last["text"] and not as_json:
                        sys.stdout.write(last["text"])
                    if not as_json:
                        err.print(f"-- replica {page['replica']} has ended --", markup=False)
                    return
            time.sleep(_poll_s())
    except KeyboardInterrupt:
        return


# --------------------------------------------------------------------------- scale, delete


@serve.command("scale")
@click.argument("name")
@click.argument("replicas", type=click.IntRange(1))
@team_option
@json_option
@api_command
def serve_scale(name: str, replicas: int, team: str | None, as_json: bool) -> None:
    """Set how many replicas NAME runs (an autoscaled service takes it within its --min and --max)."""
    api = _api()
    svc = api.post(f"{BASE}/{_service_id(api, name, team)}/scale", json={"replicas": replicas})
    if as_json:
        _print_json(svc)
        return
    out.print(
        f"service {svc['name']} (team {svc['team']['slug']}): {svc['replicas']} replicas wanted, "
        f"{svc['ready_replicas']} ready now",
        markup=False,
    )


@serve.command("delete")
@click.argument("name")
@team_option
@json_option
@api_command
def serve_delete(name: str, team: str | None, as_json: bool) -> None:
    """Delete NAME: its replicas are drained and stopped, its tokens revoked; the name is free once none is left."""
    api = _api()
    service_id = _service_id(api, name, team)
    svc = api.request("DELETE", f"{BASE}/{service_id}").json()
    if as_json:
        _print_json(svc)
        return
    out.print(
        f"service {svc['name']} (team {svc['team']['slug']}): {svc['state']} (its replicas are drained and stopped, "
        "its tokens revoked)",
        markup=False,
    )


# --------------------------------------------------------------------------- rollout


def _wait_rollout(api: Api, service_id: int, *, revision: int, timeout_s: int | None, as_json: bool) -> NoReturn:
    """Follow the rollout to the end: exit 0 when complete, 1 when rolled back, 125 when --wait-timeout passes."""
    started = time.monotonic()
    last = ""
    while True:
        svc = api.get(f"{BASE}/{service_id}")
        rollout = svc["rollout"]
        line = f"service {svc['name']}: rollout {_rollout_words(rollout)}"
        if not as_json and line != last:
            err.print(line, markup=False, highlight=False)  # one line per change, for CI logs
        last = line
        if rollout["state"] in ROLLOUT_DONE:
            break
        if timeout_s is not None and time.monotonic() - started >= timeout_s:
            if as_json:
                _print_json(svc)
            else:
                err.print(f"stopped waiting: the rollout to revision {revision} is still progressing (exit 125)", markup=False)
            sys.exit(r.EXIT_WAIT_TIMEOUT)
        time.sleep(_poll_s())
    # Rolled back, or another rollout took over (the service is at a later revision): not this one's success.
    failed = rollout["state"] == "rolled_back" or svc["revision"] != revision
    if as_json:
        _print_json(svc)
        sys.exit(r.EXIT_ERROR if failed else r.EXIT_OK)
    if failed:
        why = rollout.get("message") or f"the service is at revision {svc['revision']}"
        _fail(f"the rollout to revision {revision} was rolled back: {why}")
    err.print(f"rollout complete: revision {revision}, {rollout['updated_ready']}/{rollout['wanted']} ready", markup=False)
    sys.exit(r.EXIT_OK)


@serve.command("rollout")
@click.argument("name")
@team_option
@click.option("--image", help="A new container image")
@click.option("--command", "command_text", help="A new command")
@click.option("-e", "--env", "env", multiple=True, help="NAME=value: set on top of the current environment (repeatable)")
@click.option("--unset-env", multiple=True, help="NAME: drop from the current environment (repeatable)")
@click.option("--readiness-path", help="A new readiness probe path")
@click.option("--liveness-path", help="A new liveness probe path ('' for none)")
@click.option("--to-revision", type=click.IntRange(1), help="Roll out this earlier revision's release again (a roll back)")
@click.option("--wait", is_flag=True, help="Follow it: exit 0 when complete, 1 when rolled back")
@click.option("--wait-timeout", help="With --wait: stop waiting after this long (exit 125)")
@json_option
@api_command
def serve_rollout(
    name: str, team: str | None, image: str | None, command_text: str | None, env: tuple[str, ...],
    unset_env: tuple[str, ...], readiness_path: str | None, liveness_path: str | None, to_revision: int | None,
    wait: bool, wait_timeout: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Roll out a new revision of NAME replica by replica (one extra at a time; rolled back if not ready within
    its progress deadline), or --to-revision N to roll back."""
    api = _api()
    service_id = _service_id(api, name, team)
    timeout_s = _duration_s(wait_timeout, param="--wait-timeout")
    body: dict[str, Any] = {
        k: v
        for k, v in {
            "image": image, "command": command_text, "readiness_path": readiness_path, "liveness_path": liveness_path,
        }.items()
        if v is not None
    }  # fmt: skip
    if env or unset_env:
        # The API takes the whole environment; a rollout that names one variable keeps the others.
        current = dict(api.get(f"{BASE}/{service_id}")["env"])
        current.update(_env_pairs(env))
        for key in unset_env:
            current.pop(key, None)
        body["env"] = current
    if to_revision is not None:
        body["to_revision"] = to_revision
    svc = api.post(f"{BASE}/{service_id}/rollout", json=body)
    if not as_json:
        out.print(f"service {svc['name']} (team {svc['team']['slug']}): {_rollout_words(svc['rollout'])}", markup=False)
    if wait:
        _wait_rollout(api, service_id, revision=svc["revision"], timeout_s=timeout_s, as_json=as_json)
    if as_json:
        _print_json(svc)


# --------------------------------------------------------------------------- tokens


@serve.group("token")
def token() -> None:
    """Tokens for the service's endpoint (Authorization: Bearer …): create (shown once), list, revoke."""


@token.command("create")
@click.argument("name")
@click.option("--token-name", required=True, help="Who uses it, e.g. checkout-frontend")
@team_option
@json_option
@api_command
def token_create(name: str, token_name: str, team: str | None, as_json: bool) -> None:
    """A new token for NAME's endpoint. It is printed this once (alone on stdout, for $(…)); only its hash is kept."""
    api = _api()
    made = api.post(f"{BASE}/{_service_id(api, name, team)}/tokens", json={"name": token_name})
    if as_json:
        _print_json(made)
        return
    err.print(
        f"token {made['id']} ({made['name']}) for service {name}: shown this once, only its hash is kept. "
        "Send it as Authorization: Bearer <token>.",
        markup=False,
    )
    click.echo(made["token"])


@token.command("list")
@click.argument("name")
@team_option
@json_option
@api_command
def token_list(name: str, team: str | None, as_json: bool) -> None:
    """NAME's tokens: name, prefix, when made, last used and revoked (never the token)."""
    api = _api()
    tokens = api.get(f"{BASE}/{_service_id(api, name, team)}/tokens")
    if as_json:
        _print_json(tokens)
        return
    rows = [
        [t["id"], t["name"], f"{t['prefix']}…", _when(t["created_at"]), _when(t.get("last_used_at")), _when(t.get("revoked_at"))]
        for t in tokens
    ]
    _table(["ID", "NAME", "PREFIX", "CREATED", "LAST USED", "REVOKED"], rows)
    if not tokens:
        out.print(f"no tokens: create one with yard serve token create {name} --token-name NAME", markup=False)


@token.command("revoke")
@click.argument("name")
@click.argument("token_id", type=click.IntRange(1))
@team_option
@json_option
@api_command
def token_revoke(name: str, token_id: int, team: str | None, as_json: bool) -> None:
    """Revoke one of NAME's tokens (by its ID from `yard serve token list`): the endpoint refuses it from now on."""
    api = _api()
    revoked = api.request("DELETE", f"{BASE}/{_service_id(api, name, team)}/tokens/{token_id}").json()
    if as_json:
        _print_json(revoked)
        return
    out.print(f"revoked token {revoked['id']} ({revoked['name']}, {revoked['prefix']}…) of service {name}", markup=False)
