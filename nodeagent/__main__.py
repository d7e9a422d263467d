"""`python -m nodeagent --portal URL --token TOKEN …` runs the agent; `python -m nodeagent discover` prints
what it would register (GPUs, topology, one telemetry sample) as JSON and exits."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from nodeagent import __version__
from nodeagent.agent import Agent, AgentFatal
from nodeagent.config import AgentConfig, ConfigError, build_config, load_toml
from nodeagent.simgpu import TopologyError, simulated_gpus
from nodeagent.telemetry import NvmlGpus, NvmlUnavailable
from nodeagent.topology import GpuSource

EXIT_USAGE = 2
NO_GPU_HINT = (
    "On a machine without GPUs, run with --simulate 8xH100 (simulated GPUs) or --topology FILE; "
    "the node then registers as simulated."
)


def make_gpu_source(
    *,
    simulate: str | None,
    topology_file: Path | None,
    node: str,
    sim_mig: str | None = None,
    sim_cpus: int | None = None,
    sim_memory_mb: int | None = None,
) -> GpuSource:
    """Simulated GPUs only when asked for; otherwise NVML, which raises NvmlUnavailable without a GPU."""
    if simulate is not None or topology_file is not None:
        return simulated_gpus(
            node=node, simulate=simulate, topology_file=topology_file, mig=sim_mig, cpus=sim_cpus, memory_mb=sim_memory_mb
        )
    return NvmlGpus()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m nodeagent", description="Yardmaster node agent")
    parser.add_argument("command", nargs="?", choices=("run", "discover"), default="run")
    parser.add_argument("--portal", help="portal base URL, e.g. http://portal:8000")
    parser.add_argument("--token", help="enrolment token (yen_…, registers once) or node token (ynd_…)")
    parser.add_argument("--config", type=Path, help="TOML file with name, address, leaf, spine, state_dir, …")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--simulate", metavar="COUNTxTYPE", help="simulated GPUs, e.g. 8xH100 (no NVML)")
    source.add_argument("--topology", type=Path, dest="topology_file", help="simulated GPUs from a JSON/TOML file")
    parser.add_argument(
        "--sim-cpus", type=int, dest="sim_cpus", help="simulated node: CPU cores to register (default 14 per GPU)"
    )
    parser.add_argument(
        "--sim-memory-mb",
        type=int,
        dest="sim_memory_mb",
        help="simulated node: memory in MiB to register (default 256 GiB per GPU)",
    )
    parser.add_argument("--sim-mig", dest="sim_mig", help='simulated node: MIG layout, e.g. "0:1g.10gb*7,1:3g.40gb*2"')
    parser.add_argument("--state-dir", type=Path, dest="state_dir")
    parser.add_argument("--name", help="node name (default: host name)")
    parser.add_argument("--address", help="address other nodes reach this one on")
    parser.add_argument("--leaf", help="leaf switch name")
    parser.add_argument("--spine", help="spine switch name")
    parser.add_argument(
        "--fabric-domain",
        dest="fabric_domain",
        help="multi-node NVLink domain the node is in, e.g. its NVL72 rack (default: from NVML's GPU fabric info)",
    )
    parser.add_argument("--heartbeat-interval", type=float, dest="heartbeat_interval_s")
    parser.add_argument("--stop-after", type=float, dest="stop_after_s", help="stop workloads after this long without the portal")
    parser.add_argument(
        "--fence-after", type=float, dest="fence_after_s", help="the watchdog stops workloads after this long without the agent"
    )
    parser.add_argument("--http-timeout", type=float, dest="http_timeout_s", help="timeout of one call to the portal")
    parser.add_argument(
        "--run-as-owner",
        action="store_true",
        default=None,
        dest="run_as_owner",
        help="run each task as the local account of its owner's portal username (needs root)",
    )
    parser.add_argument(
        "--container-runtime",
        dest="container_runtime",
        choices=("auto", "runc", "none"),
        help="runs jobs that name an image (default auto: runc when installed and the agent is root)",
    )
    parser.add_argument("--image-cache", type=Path, dest="image_cache", help="image cache folder (default <state-dir>/images)")
    parser.add_argument(
        "--image-cache-gb", type=float, dest="image_cache_gb", help="image cache size; least recently used images go (default 50)"
    )
    parser.add_argument(
        "--registry-allow",
        dest="registry_allow",
        help="registries images may come from, e.g. nvcr.io,127.0.0.1:5000 (default any)",
    )
    parser.add_argument(
        "--registry-insecure",
        dest="registry_insecure",
        help="registries reached over plain HTTP besides loopback (comma-separated)",
    )
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=__version__)
    return parser


def _fail(message: str) -> int:
    print(f"yard-agent: {message}", file=sys.stderr)
    return EXIT_USAGE


def discover(args: argparse.Namespace, file_values: dict[str, Any]) -> int:
    name = args.name or file_values.get("name") or "discover"
    source = make_gpu_source(
        simulate=args.simulate or file_values.get("simulate"),
        topology_file=args.topology_file or file_values.get("topology_file"),
        node=name,
        sim_mig=args.sim_mig or file_values.get("sim_mig"),
        sim_cpus=args.sim_cpus or file_values.get("sim_cpus"),
        sim_memory_mb=args.sim_memory_mb or file_values.get("sim_memory_mb"),
    )
    try:
        report = {
            "simulated": source.simulated,
            "cpus": source.cpus,
            "memory_mb": source.memory_mb,
            "fabric_domain": str(getattr(source, "fabric_domain", "")),
            "gpus": [gpu.to_json() for gpu in source.gpus()],
            "sample": [sample.to_json() for sample in source.sample({})],
            "nvml_errors": getattr(source, "errors", {}),
        }
    finally:
        source.close()
    print(json.dumps(report, indent=2))
    return 0


def run(args: argparse.Namespace, file_values: dict[str, Any]) -> int:
    cli_values = {
        key: getattr(args, key)
        for key in (
            "portal",
            "token",
            "name",
            "address",
            "leaf",
            "spine",
            "fabric_domain",
            "state_dir",
            "heartbeat_interval_s",
            "stop_after_s",
            "fence_after_s",
            "http_timeout_s",
            "simulate",
            "topology_file",
            "sim_cpus",
            "sim_memory_mb",
            "sim_mig",
            "run_as_owner",
            "container_runtime",
            "image_cache",
            "image_cache_gb",
            "registry_allow",
            "registry_insecure",
        )
    }
    config: AgentConfig = build_config(file_values=file_values, cli_values=cli_values)
    source = make_gpu_source(
        simulate=config.simulate,
        topology_file=config.topology_file,
        node=config.name,
        sim_mig=config.sim_mig,
        sim_cpus=config.sim_cpus,
        sim_memory_mb=config.sim_memory_mb,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # The workloads run in their own sessions and keep running; a restarted agent adopts them.
        logging.getLogger("nodeagent").info("signal %d: agent exiting, workloads left running", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        Agent(config, source, stop_event=stop).run()
    finally:
        source.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    try:
        file_values = load_toml(args.config) if args.config else {}
        if args.command == "discover":
            return discover(args, file_values)
        return run(args, file_values)
    except NvmlUnavailable as exc:
        return _fail(f"{exc}\n{NO_GPU_HINT}")
    except (ConfigError, TopologyError, AgentFatal) as exc:
        return _fail(str(exc))


if __name__ == "__main__":
    sys.exit(main())
