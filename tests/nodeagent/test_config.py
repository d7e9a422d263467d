"""Configuration files, the timeout relation with the portal, and the HTTP backoff."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from nodeagent.client import Backoff
from nodeagent.config import ConfigError, build_config, load_toml, with_portal_limits


def test_toml_config_gives_name_switches_interval_and_state_dir(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'name = "node-a01"\naddress = "10.1.4.17"\nleaf = "leaf-3"\nspine = "spine-1"\n'
        'heartbeat_interval_s = 5\nstop_after_s = 90\nstate_dir = "/srv/yard"\n'
    )
    config = build_config(file_values=load_toml(path), cli_values={"portal": "http://p", "token": "ynd_x", "leaf": None})
    assert (config.name, config.address, config.leaf, config.spine) == ("node-a01", "10.1.4.17", "leaf-3", "spine-1")
    assert (config.heartbeat_interval_s, config.stop_after_s, config.state_dir) == (5.0, 90.0, Path("/srv/yard"))


def test_command_line_wins_over_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('leaf = "leaf-3"\n')
    config = build_config(file_values=load_toml(path), cli_values={"portal": "http://p", "token": "t", "leaf": "leaf-9"})
    assert config.leaf == "leaf-9"


def test_unknown_config_key_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("heartbeat_secs = 5\n")
    with pytest.raises(ConfigError, match="heartbeat_secs"):
        load_toml(path)


def test_stop_after_that_would_outlive_the_portals_down_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="DOWN timeout"):
        build_config(file_values={}, cli_values={"portal": "http://p", "token": "t", "stop_after_s": 250.0})


def test_the_portals_stop_after_is_adopted_only_when_stricter() -> None:
    config = build_config(file_values={}, cli_values={"portal": "http://p", "token": "t"})
    assert with_portal_limits(config, heartbeat_interval_s=5, stop_after_s=60).stop_after_s == 60
    assert with_portal_limits(config, heartbeat_interval_s=5, stop_after_s=200).stop_after_s == config.stop_after_s


def test_backoff_grows_exponentially_with_jitter_up_to_its_cap() -> None:
    backoff = Backoff(initial_s=1.0, max_s=8.0, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(10)]
    assert all(0.5 <= d <= 8.0 for d in delays)
    assert max(delays[:2]) <= 2.0 and max(delays[4:]) > 2.0
    assert len(set(delays)) == len(delays)
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_a_relative_state_dir_is_made_absolute(tmp_path, monkeypatch):
    # Workloads run in their own directories; a relative state dir would send their exit status astray.
    from nodeagent.config import AgentConfig

    monkeypatch.chdir(tmp_path)
    config = AgentConfig(portal="http://127.0.0.1:1", token="ynd_x", state_dir=Path("var/agents/n1"))
    assert config.state_dir == tmp_path / "var" / "agents" / "n1"
