"""Many simulated agents in one process, for the demo cluster.

    python -m nodeagent.fleet --portal URL --token yen_… --simulate-nodes 40x8xH100 --state-dir var/fleet

Each node is a full Agent (own state dir, journal, real workload subprocesses) in its own thread:
40 agent processes would not fit on a small demo machine. `--simulate-nodes` is either a spec
`COUNTxGPUS` (nodes named node-000…, grouped `--nodes-per-leaf` to a leaf and `--leaves-per-spine`
to a spine) or a TOML/JSON file:

    [[nodes]]
    name = "node-a01"
    leaf = "leaf-0"
    spine = "spine-0"
    simulate = "8xH100"          # or topology = "path/to/topology.json"
    sim_cpus = 112               # optional: cores and memory (MiB) to register; default 14 cores
    sim_memory_mb = 2097152      # and 256 GiB per GPU (or --sim-cpus/--sim-memory-mb for all)
    sim_mig = "0:1g.10gb*7"      # optional: a MIG layout (nodeagent/simgpu.py)

`--token` is an enrolment token (each node registers once and keeps its node token in its state
dir), or a JSON file mapping node names to node tokens. Or, instead of both, `--tokens-file` names the
file `manage.py seed_demo --agent-tokens` writes, which lists the nodes already in the portal:

    {"nodes": {"node-a01": {"token": "ynd_…", "leaf": "leaf-0", "spine": "spine-0",
                            "gpu_type": "H100", "gpus": 8}, …},
     "enrolment": "yen_…"}
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import re
import signal
import sys
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from nodeagent import cgroups, shutdown
from nodeagent.agent import Agent, AgentFatal
from nodeagent.config import AgentConfig, ConfigError
from nodeagent.simgpu import TopologyError, simulated_gpus
from nodeagent.watchdog import WatchdogHandle

# How old a pass over /proc an agent of the fleet may read its tasks' use from (cgroups.SharedProcPasses).
PROC_PASS_MAX_AGE_S = 1.0
_FLEET_SPEC = re.compile(r"^(\d+)x(\d+x[A-Za-z0-9][A-Za-z0-9_-]*)$")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    leaf: str
    spine: str
    simulate: str | None = None
    topology: Path | None = None
    sim_cpus: int | None = None
    sim_memory_mb: int | None = None
    sim_mig: str | None = None


def _positive_int(value: object, *, what: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        raise ValueError(f"{what} must be a positive integer, not {value!r}")
    return value


def nodes_from_spec(spec: str, *, nodes_per_leaf: int, leaves_per_spine: int, prefix: str) -> list[NodeSpec]:
    match = _FLEET_SPEC.match(spec.strip())
    if not match:
        raise ConfigError(f"bad --simulate-nodes {spec!r}: expected a file or COUNTxGPUS such as 40x8xH100")
    count, gpus = int(match.group(1)), match.group(2)
    width = max(3, len(str(count - 1)))
    return [
        NodeSpec(
            name=f"{prefix}{i:0{width}d}",
            leaf=f"leaf-{i // nodes_per_leaf}",
            spine=f"spine-{i // (nodes_per_leaf * leaves_per_spine)}",
            simulate=gpus,
        )
        for i in range(count)
    ]


def nodes_from_file(path: Path) -> list[NodeSpec]:
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        nodes = [
            NodeSpec(
                name=str(entry["name"]),
                leaf=str(entry.get("leaf", "leaf-0")),
                spine=str(entry.get("spine", "spine-0")),
                simulate=entry.get("simulate") or (None if entry.get("topology") else "8xH100"),
                topology=Path(entry["topology"]) if entry.get("topology") else None,
                sim_cpus=_positive_int(entry.get("sim_cpus"), what="sim_cpus"),
                sim_memory_mb=_positive_int(entry.get("sim_memory_mb"), what="sim_memory_mb"),
                sim_mig=str(entry["sim_mig"]) if entry.get("sim_mig") else None,
            )
            for entry in data["nodes"]
        ]
    except (OSError, ValueError, KeyError, TypeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the node list {path}: {exc!r}") from exc
    if len({n.name for n in nodes}) != len(nodes):
        raise ConfigError(f"{path}: node names must be distinct")
    return nodes


def nodes_from_tokens_file(path: Path) -> tuple[list[NodeSpec], dict[str, str]]:
    """The nodes and node tokens of a `seed_demo --agent-tokens` file."""
    try:
        entries = json.loads(path.read_text())["nodes"]
        nodes = [
            NodeSpec(name=name, leaf=str(e["leaf"]), spine=str(e["spine"]), simulate=f"{int(e['gpus'])}x{e['gpu_type']}")
            for name, e in sorted(entries.items())
        ]
        return nodes, {name: str(e["token"]) for name, e in entries.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"cannot read the tokens file {path}: {exc!r}") from exc


def tokens_for(token: str, nodes: list[NodeSpec]) -> dict[str, str]:
    """One token per node: the enrolment token for all, or each node's own from a JSON file."""
    path = Path(token)
    if not path.is_file():
        return {node.name: token for node in nodes}
    try:
        mapping = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the token file {path}: {exc}") from exc
    if isinstance(mapping.get("nodes"), dict):  # the seed_demo format
        mapping = {name: entry["token"] for name, entry in mapping["nodes"].items()}
    missing = [node.name for node in nodes if node.name not in mapping]
    if missing:
        raise ConfigError(f"{path} has no token for {', '.join(missing[:5])}")
    return {node.name: str(mapping[node.name]) for node in nodes}


class Fleet:
    """Runs one Agent per node in threads, all stopped by one event."""

    def __init__(self, configs: list[AgentConfig], nodes: list[NodeSpec], *, stagger_s: float) -> None:
        self.stop_event = threading.Event()
        self.agents: list[Agent] = []
        # One watchdog for the whole fleet (not one process per simulated node): it guards every agent
        # dir under the fleet's state root and stops their workloads should this process die.
        roots = {config.state_dir.parent for config in configs}
        root = roots.pop() if len(roots) == 1 else None
        guard = WatchdogHandle(root=root, log_dir=root) if root is not None else None
        self.stagger_s = stagger_s
        for config, node in zip(configs, nodes, strict=True):
            gpus = simulated_gpus(
                node=node.name,
                simulate=None if node.topology is not None else node.simulate or "8xH100",
                topology_file=node.topology,
                mig=config.sim_mig,
                cpus=config.sim_cpus,
                memory_mb=config.sim_memory_mb,
            )
            self.agents.append(Agent(config, gpus, stop_event=self.stop_event, guard=guard))
        self.threads: list[threading.Thread] = []

    def _run_one(self, agent: Agent, delay: float) -> None:
        # Spread the first heartbeats so 40 agents do not hit the portal in the same instant.
        if self.stop_event.wait(delay):
            return
        try:
            agent.run()
        except AgentFatal as exc:
            logging.getLogger("nodeagent.fleet").error("[%s] %s", agent.config.name, exc)
        except Exception:
            logging.getLogger("nodeagent.fleet").exception("[%s] agent crashed", agent.config.name)

    def start(self) -> None:
        rng = random.Random()
        for agent in self.agents:
            thread = threading.Thread(
                target=self._run_one, args=(agent, rng.uniform(0, self.stagger_s)), name=agent.config.name, daemon=True
            )
            thread.start()
            self.threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=timeout_s)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nodeagent.fleet", description="many simulated node agents")
    parser.add_argument("--portal", required=True)
    parser.add_argument("--token", help="enrolment token, or a JSON file {node name: node token}")
    parser.add_argument("--simulate-nodes", help="COUNTxGPUS (e.g. 40x8xH100) or a TOML/JSON file")
    parser.add_argument("--tokens-file", type=Path, help="nodes and their tokens, as seed_demo --agent-tokens writes")
    parser.add_argument("--state-dir", type=Path, default=Path("var/fleet"))
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--nodes-per-leaf", type=int, default=5)
    parser.add_argument("--leaves-per-spine", type=int, default=4)
    parser.add_argument("--prefix", default="node-")
    parser.add_argument("--heartbeat-interval", type=float, default=None)
    parser.add_argument("--tick", type=float, default=1.0, help="supervision tick per agent (s)")
    parser.add_argument("--sim-cpus", type=int, help="CPU cores each node registers (default 14 per GPU)")
    parser.add_argument("--sim-memory-mb", type=int, help="memory (MiB) each node registers (default 256 GiB per GPU)")
    parser.add_argument(
        "--stop-workloads-on-exit",
        action="store_true",
        help="on SIGTERM/SIGINT stop every workload the agents run (SIGTERM, grace, SIGKILL) before exiting; "
        "for demo and test hosts (on a real node workloads outlive their agent, which adopts them on restart)",
    )
    parser.add_argument("--workload-grace", type=float, default=3.0, help="with --stop-workloads-on-exit: SIGTERM to SIGKILL (s)")
    parser.add_argument(
        "--stats-file", type=Path, help="write the agents' call counts and latencies here (JSON, every 5 s): for benchmarks"
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def write_stats(fleet: Fleet, path: Path) -> None:
    """Every agent's calls pooled by kind: counts and latencies (the bench reads percentiles from them)."""
    pooled: dict[str, dict[str, object]] = {}
    for agent in fleet.agents:
        for kind, stats in agent.link.stats.items():
            entry = pooled.setdefault(kind, {"ok": 0, "blind": 0, "unreachable": 0, "refused": 0, "latencies_s": []})
            for key in ("ok", "blind", "unreachable", "refused"):
                entry[key] = int(entry[key]) + getattr(stats, key)  # type: ignore[call-overload]
            entry["latencies_s"] += stats.latencies_s[-2000:]  # type: ignore[operator]
    lost = sum(1 for agent in fleet.agents if agent.link.lost)
    stopped = sum(1 for agent in fleet.agents for r in agent.records.values() if r.stop_cause == "portal_unreachable")
    # An agent still silent now counts with its silence so far.
    silence = max((max(agent.link.longest_silence_s, agent.link.silence()) for agent in fleet.agents), default=0.0)
    gap = max(
        (max(agent.link.longest_gap_s, agent.link.clock() - agent.link.last_contact) for agent in fleet.agents), default=0.0
    )
    body = {"agents": len(fleet.agents), "calls": pooled, "agents_lost_portal": lost, "tasks_stopped_for_portal_loss": stopped,
            "longest_silence_s": silence, "longest_gap_s": gap}  # fmt: skip
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body))
    tmp.replace(path)


def build_fleet(args: argparse.Namespace) -> Fleet:
    if args.tokens_file is not None:
        nodes, tokens = nodes_from_tokens_file(args.tokens_file)
    elif args.token and args.simulate_nodes:
        source = Path(args.simulate_nodes)
        nodes = (
            nodes_from_file(source)
            if source.is_file()
            else nodes_from_spec(
                args.simulate_nodes,
                nodes_per_leaf=args.nodes_per_leaf,
                leaves_per_spine=args.leaves_per_spine,
                prefix=args.prefix,
            )
        )
        tokens = tokens_for(args.token, nodes)
    else:
        raise ConfigError("give --tokens-file, or --token and --simulate-nodes")
    extra = {"heartbeat_interval_s": args.heartbeat_interval} if args.heartbeat_interval else {}
    configs = [
        AgentConfig(
            portal=args.portal,
            token=tokens[node.name],
            name=node.name,
            address=args.address,
            leaf=node.leaf,
            spine=node.spine,
            state_dir=args.state_dir / node.name,
            simulate=node.simulate,
            topology_file=node.topology,
            sim_cpus=node.sim_cpus or args.sim_cpus,
            sim_memory_mb=node.sim_memory_mb or args.sim_memory_mb,
            sim_mig=node.sim_mig,
            tick_s=args.tick,
            **extra,
        )
        for node in nodes
    ]
    stagger = configs[0].heartbeat_interval_s if configs else 0.0
    return Fleet(configs, nodes, stagger_s=stagger)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # The agents share one /proc: one pass a second serves all of their use readings.
    cgroups.share_proc_passes(PROC_PASS_MAX_AGE_S)
    try:
        fleet = build_fleet(args)
    except (ConfigError, TopologyError) as exc:
        print(f"yard-fleet: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    fleet.start()
    logging.getLogger("nodeagent.fleet").info("%d simulated node agents started", len(fleet.agents))
    next_stats = 0.0
    while not done.wait(1.0):
        if args.stats_file is not None and time.monotonic() >= next_stats:
            next_stats = time.monotonic() + 5.0
            write_stats(fleet, args.stats_file)
        if not any(thread.is_alive() for thread in fleet.threads):
            break
    if args.stats_file is not None:
        write_stats(fleet, args.stats_file)
    if not args.stop_workloads_on_exit:
        fleet.stop()
        return 0
    # The agents first (a short join: a loop turn is quick while the portal answers), so that none
    # starts a workload after the sweep; then every workload of every agent under one grace.
    fleet.stop(timeout_s=5.0)
    stopped = shutdown.stop_workloads(fleet.agents, grace_s=args.workload_grace)
    logging.getLogger("nodeagent.fleet").info("stopped %d workload process(es)", stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
