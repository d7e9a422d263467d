"""Real OCI parts for the container tests and the container bench: Debian's docker-registry on a
loopback port, and a tiny busybox-static image built with umoci and pushed there with skopeo.
Everything here needs root and those tools (`missing` says which are absent; scripts/services.sh
installs them).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
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
    work: Path,
    reference: str,
    *,
    env: dict[str, str],
    cmd: list[str],
    creds: str | None = None,
    pad_mb: int = 0,
    fill: Callable[[Path], None] | None = None,
    path: str = "/bin",
) -> None:
    """A busybox-static image (its applets as symlinks), built with umoci and pushed with skopeo; ``fill``
    adds more to its rootfs, ``path`` is its PATH."""
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
    if fill is not None:
        fill(rootfs)
    run("umoci", "repack", "--image", f"{layout}:img", str(bundle))
    config = ["umoci", "config", "--image", f"{layout}:img", "--config.env", f"PATH={path}"]
    for key, value in env.items():
        config += ["--config.env", f"{key}={value}"]
    for part in cmd:
        config += ["--config.cmd", part]
    run(*config)
    push = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if creds:
        push += ["--dest-creds", creds]  # the test's own throwaway credential, not the agent's path
    run(*push, f"oci:{layout}:img", f"docker://{reference}")


# -- a Python image with Jupyter, for notebooks in an image ------------------------------------------------
# What the notebook image needs: Jupyter Server (the `jupyter` command) and a kernel (ipykernel).
JUPYTER_DISTS = ("jupyter_server", "ipykernel")
# Left out, to keep the build short: the debugger (ipykernel runs without it) and jedi with parso (IPython
# completes without them), a third of the packages' size; the standard library's tests, GUI and
# packaging tools, and its optimised bytecode (-O, -OO: the kernel runs without them).
SKIP_DISTS = frozenset({"debugpy", "jedi"})
SKIP_STDLIB = frozenset(
    {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "__phello__", "distutils", "pydoc_data"}
)
JUPYTER_SCRIPT = "#!{python}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n"


def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dist_closure(roots: tuple[str, ...]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``roots`` need (their requirements without extras, markers evaluated)."""
    from packaging.requirements import Requirement

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = _dist_key(name)
        if key in found or key in SKIP_DISTS:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[key] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


def _copy_file(source: Path, rootfs: Path, target: str | None = None) -> None:
    dest = rootfs / (target or str(source)).lstrip("/")
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():
        shutil.copy2(source, dest, follow_symlinks=True)


def _shared_libraries(binaries: list[Path]) -> set[Path]:
    """The shared libraries (and the loader) the binaries load, as ldd finds them on this host."""
    found: set[Path] = set()
    for chunk in range(0, len(binaries), 200):
        done = subprocess.run(["ldd", *map(str, binaries[chunk : chunk + 200])], capture_output=True, text=True, timeout=120)
        for line in done.stdout.splitlines():
            match = re.search(r"(/\S+) \(0x", line)
            if match:
                found.add(Path(match.group(1)))
    return found


def fill_python(rootfs: Path) -> None:
    """This interpreter's own Python (copied, never bind-mounted) at its host prefix, the standard library
    less its tests and GUI, Jupyter Server and ipykernel with what they need from this environment's
    site-packages, the shared libraries all of it loads, and `python3`, `jupyter` and `jupyter-server` in
    /usr/local/bin. The interpreter's runpath names its prefix, so the prefix stays the host's."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = (prefix / "bin" / version).resolve()
    stdlib = prefix / "lib" / version
    site = rootfs / str(stdlib).lstrip("/") / "site-packages"
    binaries = [python]
    _copy_file(python, rootfs, str(prefix / "bin" / version))
    for item in stdlib.iterdir():
        if item.name in SKIP_STDLIB or item.name.startswith("config-"):
            continue
        target = rootfs / str(item).lstrip("/")
        if item.is_dir():
            ignore = shutil.ignore_patterns("_test*", "*_tkinter*", "xxlimited*", "test", "tests", "*.opt-1.pyc", "*.opt-2.pyc")
            shutil.copytree(item, target, ignore=ignore, symlinks=True, dirs_exist_ok=True)
        else:
            _copy_file(item, rootfs)
    binaries += sorted((rootfs / str(stdlib).lstrip("/") / "lib-dynload").glob("*.so"))
    for dist in dist_closure(JUPYTER_DISTS).values():
        base = Path(str(dist.locate_file("")))
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file))).resolve()
            if not source.is_file() or not source.is_relative_to(base.resolve()):
                continue  # scripts in bin/ (their shebang names this venv): written below
            target = site / source.relative_to(base.resolve())
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
            if target.suffix == ".so" or ".so." in target.name:
                binaries.append(target)
    for library in _shared_libraries(binaries):
        if not str(library).startswith(str(rootfs)):
            _copy_file(library, rootfs)
    bin_dir = rootfs / "usr" / "local" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    in_image = str(prefix / "bin" / version)
    (bin_dir / "python3").symlink_to(in_image)
    for name, module, func in (
        ("jupyter", "jupyter_core.command", "main"),
        ("jupyter-server", "jupyter_server.serverapp", "main"),
    ):
        (bin_dir / name).write_text(JUPYTER_SCRIPT.format(python=in_image, module=module, func=func))
        (bin_dir / name).chmod(0o755)


IMAGE_MARK = "/etc/yard-python-image"  # in the image only: a kernel that reads it runs in the container


def python_image_key() -> str:
    """What the Python image is made of: this interpreter, its Jupyter packages' versions and this builder."""
    versions = sorted(f"{k}=={d.version}" for k, d in dist_closure(JUPYTER_DISTS).items())
    text = "\n".join([sys.version, sys.base_prefix, *versions, Path(__file__).read_text()])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_python_image(work: Path, reference: str, *, cache: Path | None = None) -> None:
    """An image with Python, Jupyter Server and ipykernel (fill_python) beside busybox's shell, built with
    umoci and pushed with skopeo: what a notebook in an image needs (docs/containers.md). With ``cache``,
    its OCI layout is kept there under python_image_key() and only pushed when it is there already (the
    build takes ~20 s on two cores, a push of the cached layout ~3 s)."""
    cached = cache / python_image_key() if cache is not None else None
    if cached is not None and (cached / "index.json").is_file():
        push = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{cached}:img", f"docker://{reference}"]
        subprocess.run(push, check=True, capture_output=True, timeout=120)
        return

    def fill(rootfs: Path) -> None:
        fill_python(rootfs)
        (rootfs / IMAGE_MARK.lstrip("/")).write_text("the yard test's Python image\n")

    # PYTHONPATH, not the interpreter's own site rules: Debian's python3 looks in dist-packages, not site-packages.
    site = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    env = {"PYTHONPATH": str(site)}
    build_image(work, reference, env=env, cmd=["/usr/local/bin/jupyter", "server"], fill=fill, path="/usr/local/bin:/bin")
    if cached is not None:
        for stale in cached.parent.glob("*") if cached.parent.is_dir() else ():
            if len(stale.name) == len(cached.name):  # another interpreter's or builder's image: no longer asked for
                shutil.rmtree(stale, ignore_errors=True)
        partial = cached.with_name(cached.name + f".{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(work / "layout", partial)
        try:
            partial.rename(cached)
        except OSError:  # another run cached it meanwhile
            shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(work / "bundle", ignore_errors=True)  # ~200 MB unpacked


# -- an image with OpenSSH's sshd, for dev sessions in an image ------------------------------------------
SSHD_IMAGE_MARK = "/etc/yard-sshd-image"  # in the image only: a login that reads it runs in the container


def fill_sshd(rootfs: Path, accounts: tuple[str, ...] = ()) -> None:
    """The host's OpenSSH server (/usr/sbin/sshd, copied) and the shared libraries it loads, /etc/passwd and
    /etc/group with root and sshd's privilege separation account ``sshd``, and busybox's grep and sed (the
    agent's command for a session in an image looks the login account up and reads ``sshd -t``), and
    ``accounts`` (this host's, by name: uid, gid and home as here, /bin/sh their shell). No /run/sshd: the
    agent's command makes the folder sshd asks for, as on a node whose unit never ran."""
    sshd = Path("/usr/sbin/sshd")
    _copy_file(sshd, rootfs)
    for library in _shared_libraries([sshd]):
        _copy_file(library, rootfs)
    for applet in ("grep", "sed"):
        link = rootfs / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    lines = ["root:x:0:0:root:/root:/bin/sh", "sshd:x:100:65534::/run/sshd:/bin/false"]
    for name in accounts:
        account = pwd.getpwnam(name)
        lines.append(f"{name}:x:{account.pw_uid}:{account.pw_gid}::{account.pw_dir}:/bin/sh")
    (etc / "passwd").write_text("\n".join(lines) + "\n")
    (etc / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (rootfs / "root").mkdir(mode=0o700, exist_ok=True)
    (rootfs / "var" / "empty").mkdir(parents=True, exist_ok=True)
    (rootfs / SSHD_IMAGE_MARK.lstrip("/")).write_text("the yard test's sshd image\n")


def build_sshd_image(work: Path, reference: str, *, accounts: tuple[str, ...] = ()) -> None:
    """A busybox image with the host's sshd (fill_sshd), built with umoci and pushed with skopeo: what a dev
    session in an image needs (docs/dev-sessions.md)."""
    build_image(work, reference, env={}, cmd=["/bin/sh"], fill=lambda rootfs: fill_sshd(rootfs, accounts), path="/usr/sbin:/bin")
    shutil.rmtree(work / "bundle", ignore_errors=True)
