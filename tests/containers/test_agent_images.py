"""The image cache against a real registry: one pull for concurrent ones, eviction by size (least
recently used, never an image in use), credentials that never show, and references."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.containers.base import ContainerPlan
from nodeagent.containers.images import ImageCache, PullError, Reference, allowed
from nodeagent.containers.runc import Runc
from tests.containers.conftest import PASSWORD, USER, Registry, build_image, container_spec, needs_containers, wait_until
from tests.containers.test_agent_run import exited, log_of
from tests.nodeagent.conftest import RunningAgent
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]
MB = 1024 * 1024


@needs_containers
def test_two_agents_pulling_one_image_at_once_pull_it_once(image: str, tmp_path: Path) -> None:
    caches = [ImageCache(root=tmp_path / "cache", max_bytes=1024 * MB) for _ in range(2)]  # two agents, one host
    start = threading.Barrier(4)
    got: list[Path] = []

    def pull(cache: ImageCache) -> None:
        start.wait()
        got.append(cache.get(image, auth=None).rootfs)

    threads = [threading.Thread(target=pull, args=(c,)) for c in caches * 2]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(got) == 4 and len(set(got)) == 1
    assert sum(len(c.pulled) for c in caches) == 1
    assert (got[0] / "bin" / "busybox").is_file()


@needs_containers
def test_two_tasks_of_one_image_share_one_pull_and_one_unpack(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    running = start_ct_agent()
    portal.set_desired("node-t1", [container_spec(20, "echo first", image), container_spec(21, "echo second", image, gpus=[1])])
    assert exited(portal, 20)["exit_code"] == 0 and exited(portal, 21)["exit_code"] == 0
    cache = running.agent.workloads.containers.cache
    assert len(cache.pulled) == 1 and len(cache.entries()) == 1


@needs_containers
def test_the_cache_evicts_the_least_recently_used_images_past_its_size_but_none_in_use(
    registry: Registry, tmp_path: Path
) -> None:
    refs = {name: registry.ref(f"padded-{name}") for name in "abc"}
    for name, ref in refs.items():
        build_image(tmp_path / f"build-{name}", ref, env={}, cmd=["/bin/true"], pad_mb=3)
    cache = ImageCache(root=tmp_path / "cache", max_bytes=1024 * MB)
    a = cache.get(refs["a"], auth=None)
    cache.max_bytes = int(cache.entries()[0][2] * 2.5)  # two of them fit, not three
    b = cache.get(refs["b"], auth=None)
    assert {d for _, d, _ in cache.entries()} == {a.digest, b.digest}
    cache.get(refs["a"], auth=None)  # a is used again: b is now the least recently used
    c = cache.get(refs["c"], auth=None)
    assert {d for _, d, _ in cache.entries()} == {a.digest, c.digest}
    assert not b.rootfs.exists()
    # Every image in use by a live task: none goes, even past the size.
    b = cache.get(refs["b"], auth=None, in_use=lambda: {a.digest, c.digest})
    assert {d for _, d, _ in cache.entries()} == {a.digest, b.digest, c.digest}
    assert len(cache.pulled) == 4  # a, b, c, and b again; the second a came from the cache
    # An image under a container's overlay (another agent's task, sharing the folder) stays too.
    runtime = Runc(binary="runc", root=tmp_path / "runc")
    plan = ContainerPlan("yard-evict-test", tmp_path / "bundle", a.rootfs, a.config, ["/bin/true"], {}, "/")
    assert runtime.prepare(plan).startswith("writable overlay")
    cache.max_bytes = 0
    try:
        assert set(cache.evict(keep=set())) == {b.digest, c.digest}
    finally:
        runtime.delete(plan.container_id, plan.bundle)
    assert cache.evict(keep=set()) == [a.digest]


@needs_containers
def test_credentials_pull_from_a_registry_that_wants_them_and_never_show(
    auth_registry: Registry,
    portal: FakePortal,
    start_ct_agent: StartAgent,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ref = auth_registry.ref("private")
    build_image(tmp_path / "build", ref, env={}, cmd=["/bin/true"], creds=f"{USER}:{PASSWORD}")
    # This process's temporary files in a folder of the test's own: other workers' agents pull with
    # credentials too, and their auth files in /tmp come and go while this test looks.
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    cache = ImageCache(root=tmp_path / "cache", max_bytes=1024 * MB)
    with pytest.raises(PullError, match="the registry refused the credentials") as no_auth:
        cache.get(ref, auth=None)
    with pytest.raises(PullError, match="the registry refused the credentials") as wrong:
        cache.get(ref, auth={"username": USER, "password": "not-" + PASSWORD})
    assert PASSWORD not in str(no_auth.value) + str(wrong.value)
    pulled = cache.get(ref, auth={"username": USER, "password": PASSWORD})
    assert pulled.rootfs.is_dir()
    # Cached now, but a task without the credential does not get it, not even by its digest.
    by_digest = f"{auth_registry.host}/yard-test/private@{pulled.digest}"
    with pytest.raises(PullError, match="the registry refused the credentials"):
        cache.get(by_digest, auth=None)
    assert cache.get(by_digest, auth={"username": USER, "password": PASSWORD}).pulled_s == 0  # from the cache
    # Through an agent: the spec's team credential.
    running = start_ct_agent()
    portal.set_desired(
        "node-t1",
        [container_spec(22, "echo pulled-with-a-credential", ref, container={"auth": {"username": USER, "password": PASSWORD}})],
    )
    assert exited(portal, 22)["exit_code"] == 0
    assert "pulled-with-a-credential" in log_of(portal, 22)
    journal = (running.agent.state_dir / "journal.json").read_text()
    assert PASSWORD not in journal and PASSWORD not in caplog.text
    assert not list(private_tmp.glob("yard-auth-*"))  # the auth files went with their calls


def test_references_name_their_registry_repository_tag_or_digest() -> None:
    digest = "sha256:" + "ab" * 32
    assert Reference.parse("127.0.0.1:5000/team-a/train:1.0") == Reference("127.0.0.1:5000", "team-a/train", "1.0", None)
    assert Reference.parse("nvcr.io/nvidia/pytorch@" + digest) == Reference("nvcr.io", "nvidia/pytorch", None, digest)
    assert Reference.parse("ubuntu") == Reference("docker.io", "library/ubuntu", "latest", None)
    assert Reference.parse("localhost/x") == Reference("localhost", "x", "latest", None)
    for bad in ("", "http://nvcr.io/x", "nvcr.io/Upper/Case", "x@sha256:12", "a b"):
        with pytest.raises(PullError):
            Reference.parse(bad)


def test_the_allow_list_names_hosts_with_or_without_their_port() -> None:
    assert allowed("nvcr.io", [])
    assert allowed("127.0.0.1:5000", ["nvcr.io", "127.0.0.1:5000"])
    assert allowed("127.0.0.1:5000", ["127.0.0.1"])
    assert not allowed("127.0.0.1:5001", ["127.0.0.1:5000"])
    assert not allowed("docker.io", ["nvcr.io"])


@needs_containers
def test_a_task_whose_pull_an_agent_restart_cut_short_ends_as_a_node_fault(
    portal: FakePortal, start_ct_agent: StartAgent
) -> None:
    """A registry that takes the connection and never answers: the pull hangs until the agent goes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        ref = f"127.0.0.1:{silent.getsockname()[1]}/yard-test/hangs:1"
        first = start_ct_agent()
        portal.set_desired("node-t1", [container_spec(23, "echo never", ref)])
        wait_until(lambda: (r := first.record(23)) is not None and r.state == "launching", what="task 23 pulling")
        first.stop()
        second = start_ct_agent()
        wait_until(lambda: (r := second.record(23)) is not None and r.state == "exited", what="task 23 ended")
        record = second.record(23)
        assert (record.stop_cause, record.message) == ("node_fault", "the agent restarted while the task's image was pulled")
        assert exited(portal, 23)["stop_cause"] == "node_fault"  # requeued by the portal, not failed
