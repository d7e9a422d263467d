"""Real OCI parts for the container tests and the container bench: Debian's docker-registry on a
loopback port, and a tiny busybox-static image built with umoci and pushed there with skopeo.
Everything here needs root and those tools (`missing` says which are absent; scripts/services.sh
installs them).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOLS = ("runc", "skopeo", "umoci", "docker-registry", "busybox")
APPLETS = (
    "sh",
    "cat",
    "echo",
    "env",
    "sleep",
    "nc",
    "ls",
    "id",
    "touch",
    "mkdir",
    "test",
    "kill",
    "ps",
    "true",
    "false",
    "head",
    "wc",
    "sort",
    "pwd",
)
USER, PASSWORD = "ci-bot", "s3cret-registry-pass"


def missing() -> str | None:
    if os.geteuid() != 0:
        return "container tests need root (runc)"
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (scripts/services.sh installs them)"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(check: Callable[[], Any], *, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    process: subprocess.Popen[bytes]
    auth: bool

    def ref(self, name: str, tag: str = "1") -> str:
        return f"{self.host}/yard-test/{name}:{tag}"


def start_registry(folder: Path, *, htpasswd: Path | None = None) -> Registry:
    port = _free_port()
    folder.mkdir(parents=True, exist_ok=True)
    auth = f"auth:\n  htpasswd:\n    realm: yard\n    path: {htpasswd}\n" if htpasswd else ""
    config = folder / "config.yml"
    config.write_text(
        f"version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {folder / 'data'}\n"
        f"{auth}http:\n  addr: 127.0.0.1:{port}\n"
    )
    with open(folder / "registry.log", "ab") as log:
        process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=subprocess.STDOUT)

    def answers() -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
        except urllib.error.HTTPError:
            return True  # 401 with auth on: it is up
        except OSError:
            return False
        return True

    wait_until(answers, what=f"docker-registry on port {port}")
    return Registry(host=f"127.0.0.1:{port}", process=process, auth=htpasswd is not None)


def build_image(
    work: Path, reference: str, *, env: dict[str, str], cmd: list[str], creds: str | None = None, pad_mb: int = 0
) -> None:
    """A busybox-static image (its applets as symlinks), built with umoci and pushed with skopeo."""
    layout, bundle = work / "layout", work / "bundle"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    def run(*args: str) -> None:
        subprocess.run(list(args), check=True, capture_output=True, timeout=120)

    run("umoci", "init", "--layout", str(layout))
    run("umoci", "new", "--image", f"{layout}:img")
    run("umoci", "unpack", "--image", f"{layout}:img", str(bundle))
    rootfs = bundle / "rootfs"
    for folder in ("bin", "tmp", "etc", "workspace"):
        (rootfs / folder).mkdir(exist_ok=True)
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", rootfs / "bin" / "busybox")
    for applet in APPLETS:
        (rootfs / "bin" / applet).symlink_to("busybox")
    if pad_mb:
        (rootfs / "pad").write_bytes(os.urandom(pad_mb * 1024 * 1024))
    run("umoci", "repack", "--image", f"{layout}:img", str(bundle))
    config = ["umoci", "config", "--image", f"{layout}:img", "--config.env", "PATH=/bin"]
    for key, value in env.items():
        config += ["--config.env", f"{key}={value}"]
    for part in cmd:
        config += ["--config.cmd", part]
    run(*config)
    push = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if creds:
        push += ["--dest-creds", creds]  # the test's own throwaway credential, not the agent's path
    run(*push, f"oci:{layout}:img", f"docker://{reference}")
