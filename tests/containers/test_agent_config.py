"""The agent's container settings: flags, their checks, and the runtime it says it found."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.__main__ import _parser
from nodeagent.config import ConfigError, build_config
from nodeagent.containers.runtime import detect
from tests.containers.conftest import needs_containers

BASE = {"portal": "http://portal:8000", "token": "ynd_x"}


def test_the_container_flags_reach_the_config(tmp_path: Path) -> None:
    args = _parser().parse_args(
        [
            "--container-runtime", "none",
            "--image-cache", str(tmp_path / "cache"),
            "--image-cache-gb", "7.5",
            "--registry-allow", "nvcr.io,127.0.0.1:5000",
            "--registry-insecure", "registry.lab:5000",
        ]
    )  # fmt: skip
    keys = ("container_runtime", "image_cache", "image_cache_gb", "registry_allow", "registry_insecure")
    config = build_config(file_values={}, cli_values={**BASE, **{k: getattr(args, k) for k in keys}})
    assert (config.container_runtime, config.image_cache, config.image_cache_gb) == ("none", tmp_path / "cache", 7.5)
    assert (config.registry_allow, config.registry_insecure) == ("nvcr.io,127.0.0.1:5000", "registry.lab:5000")
    defaults = build_config(file_values={}, cli_values=BASE)
    assert (defaults.container_runtime, defaults.image_cache, defaults.image_cache_gb) == ("auto", None, 50.0)


def test_bad_container_settings_say_what_to_change() -> None:
    with pytest.raises(ConfigError, match="--container-runtime must be auto, runc or none, not 'docker'"):
        build_config(file_values={"container_runtime": "docker"}, cli_values=BASE)
    with pytest.raises(ConfigError, match="--image-cache-gb must be a positive number"):
        build_config(file_values={}, cli_values={**BASE, "image_cache_gb": -1.0})


def test_the_runtime_found_is_said_and_none_when_turned_off(tmp_path: Path) -> None:
    assert detect("none", state_dir=tmp_path) == (
        None,
        "containers are off (--container-runtime none): a job naming an image fails",
    )


@needs_containers
def test_runc_is_found_on_a_root_node_with_its_state_under_the_agents(tmp_path: Path) -> None:
    runtime, why = detect("auto", state_dir=tmp_path)
    assert runtime is not None and runtime.name == "runc"
    assert why.startswith("container runtime: runc (") and str(tmp_path / "runc") in why
