"""The node's image cache: a reference resolved to its digest, pulled and unpacked once per digest.

    <cache>/images/<hex>/rootfs, image.json   one unpacked image, shared read-only by its tasks
    <cache>/locks/<hex>.lock                   held while it is pulled, unpacked or evicted

``skopeo inspect`` resolves a tag to a digest; ``skopeo copy`` pulls that digest into an OCI layout
that ``umoci unpack`` unpacks, and the layout is then removed (the unpacked tree is what tasks use).
A lock file per digest (flock: it holds between threads and between two agents of one host alike)
makes concurrent pulls of one image one pull. Past the cache's size, the least recently used images
that no live task uses are removed.

Credentials go to skopeo in a 0600 auth file in a private temporary folder, removed after the call:
never on a command line, never in a log or an error. TLS is verified except for loopback registries
and those the operator names as plain-HTTP. A failure is a PullError with one line for the user.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent.containers.base import ImageConfig

PULL_TIMEOUT_S = 3600.0
INSPECT_TIMEOUT_S = 120.0
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
DOCKER_HUB = "docker.io"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# skopeo's error text -> what the user is told (the first that matches).
_REASONS = (
    (("manifest unknown", "name unknown", "not found", "does not exist"), "no such image"),
    (("unauthorized", "authentication required", "denied", "401", "403"), "the registry refused the credentials"),
    (
        ("connection refused", "no such host", "i/o timeout", "dial tcp", "network is unreachable", "tls:", "x509"),
        "registry unreachable",
    ),
)


class PullError(Exception):
    """The image cannot be had; the message is one line, without credentials, for the job's events."""


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port]
    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> Reference:
        ref = text.strip()
        if not ref or "://" in ref or any(c.isspace() for c in ref):
            raise PullError(f"{text!r} is not an image reference (host[:port]/path[:tag] or …@sha256:…)")
        name, _, digest = ref.partition("@")
        if digest and not _DIGEST.match(digest):
            raise PullError(f"{text!r}: the digest must be sha256: and 64 hex digits")
        first, slash, rest = name.partition("/")
        if slash and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name if slash else f"library/{name}"
        tag = None
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        if not path or not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+|__)*", path):
            raise PullError(f"{text!r}: {path!r} is not a repository name (lower case, digits, . _ - /)")
        return cls(registry=registry, repository=path, tag=tag or (None if digest else "latest"), digest=digest or None)

    def __str__(self) -> str:
        return (
            f"{self.registry}/{self.repository}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )

    def by_digest(self, digest: str) -> str:
        return f"docker://{self.registry}/{self.repository}@{digest}"


@dataclass(frozen=True)
class Image:
    digest: str
    rootfs: Path
    config: ImageConfig
    pulled_s: float  # 0 when the cache had it


def allowed(registry: str, allow: Iterable[str]) -> bool:
    """Is `registry` (host[:port]) on the allow-list (empty: every registry)? A bare host allows its every port."""
    hosts = [a.strip().lower() for a in allow if a.strip()]
    host = registry.lower()
    return not hosts or host in hosts or host.rsplit(":", 1)[0] in hosts


def _reason(stderr: str, secrets: Iterable[str]) -> str:
    """What went wrong, in a few words and skopeo's own last words ("no such image (manifest unknown)")."""
    text = " ".join(stderr.split())
    for secret in secrets:
        if len(secret) >= 3:
            text = text.replace(secret, "***")
    detail = text.rsplit("msg=", 1)[-1].strip('"\\ ')
    tail = detail.rsplit(": ", 1)[-1][-200:] or "skopeo failed"
    lower = text.lower()
    for needles, reason in _REASONS:
        if any(n in lower for n in needles):
            return f"{reason} ({tail})"
    return detail[-300:] or "skopeo failed"


def overlaid(images: Path) -> set[str]:
    """The digests of cached images that a mounted overlay on this host has as its lower layer."""
    found = set()
    prefix = f"lowerdir={images}/"
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            for option in line.rsplit(" - ", 1)[-1].split(" ")[-1].split(","):
                if option.startswith(prefix):
                    found.add("sha256:" + option.removeprefix(prefix).split("/", 1)[0])
    return found


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
    return total


@dataclass
class ImageCache:
    root: Path
    max_bytes: int
    allow: list[str] = field(default_factory=list)
    # Registries reached over plain HTTP besides loopback (--registry-insecure).
    insecure: list[str] = field(default_factory=list)
    skopeo: str = "skopeo"
    umoci: str = "umoci"
    # Digests actually copied from a registry by this cache (tests count them).
    pulled: list[str] = field(default_factory=list)

    def _dir(self, digest: str) -> Path:
        return self.root / "images" / digest.removeprefix("sha256:")

    @contextlib.contextmanager
    def _lock(self, digest: str, *, wait: bool = True) -> Iterator[bool]:
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with open(locks / f"{digest.removeprefix('sha256:')}.lock", "w") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _tls(self, registry: str) -> bool:
        host = registry.rsplit(":", 1)[0] if not registry.startswith("[") else registry.split("]")[0] + "]"
        return not (host in LOOPBACK or registry in self.insecure or host in self.insecure)

    def _skopeo(self, args: list[str], *, auth: dict[str, Any] | None, registry: str, timeout: float) -> bytes:
        """Run skopeo with the credentials in a private auth file; its stdout, or PullError."""
        secrets = [str(auth.get("password") or "")] if auth else []
        private = tempfile.mkdtemp(prefix="yard-auth-")  # 0700
        try:
            extra: list[str] = []
            if auth:
                token = base64.b64encode(f"{auth.get('username') or ''}:{auth.get('password') or ''}".encode()).decode()
                authfile = Path(private) / "auth.json"
                fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as handle:
                    json.dump({"auths": {registry: {"auth": token}}}, handle)
                extra = ["--authfile", str(authfile)]
            else:
                # No credential given: none of root's own (~/.docker, containers/auth.json) either.
                empty = Path(private) / "auth.json"
                empty.write_text('{"auths": {}}')
                extra = ["--authfile", str(empty)]
            done = subprocess.run(
                [self.skopeo, *args[:1], *extra, *args[1:]],
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "REGISTRY_AUTH_FILE": extra[1]},
            )
        except subprocess.TimeoutExpired as exc:
            raise PullError(f"registry unreachable: skopeo {args[0]} timed out after {timeout:.0f} s") from exc
        except OSError as exc:
            raise PullError(f"cannot run skopeo: {exc}") from exc
        finally:
            shutil.rmtree(private, ignore_errors=True)
        if done.returncode != 0:
            raise PullError(_reason(done.stderr.decode(errors="replace"), secrets))
        return done.stdout

    def resolve(self, ref: Reference, auth: dict[str, Any] | None) -> str:
        """The digest of the manifest `ref` names: the sha256 of its raw bytes, as the registry serves
        them. Asked at every launch, digest or not, with the task's credential: a cached image is
        used only by a task that may still pull it (as Kubernetes' AlwaysPullImages)."""
        tls = [] if self._tls(ref.registry) else ["--tls-verify=false"]
        raw = self._skopeo(
            ["inspect", *tls, "--raw", ref.by_digest(ref.digest) if ref.digest else f"docker://{ref}"],
            auth=auth,
            registry=ref.registry,
            timeout=INSPECT_TIMEOUT_S,
        )
        digest = ref.digest or f"sha256:{hashlib.sha256(raw).hexdigest()}"
        if not raw.strip():
            raise PullError(f"the registry gave no manifest for {ref}")
        return digest

    def get(self, reference: str, *, auth: dict[str, Any] | None, in_use: Callable[[], set[str]] = set) -> Image:
        """The unpacked image `reference` names, pulled now unless the cache has it; PullError else."""
        try:
            ref = Reference.parse(reference)
            if not allowed(ref.registry, self.allow):
                raise PullError(f"registry {ref.registry} is not allowed on this node (allowed: {', '.join(self.allow)})")
            digest = self.resolve(ref, auth)
        except PullError as exc:
            raise PullError(f"image pull failed: {reference}: {exc}") from None
        started = time.monotonic()
        with self._lock(digest):
            image = self._cached(digest)
            if image is None:
                try:
                    self._pull(ref, digest, auth)
                except PullError as exc:
                    raise PullError(f"image pull failed: {reference}: {exc}") from None
                image = self._cached(digest)
                if image is None:
                    raise PullError(f"image pull failed: {reference}: unpacked, but not readable in {self._dir(digest)}")
                image = Image(image.digest, image.rootfs, image.config, pulled_s=time.monotonic() - started)
        self.evict(keep={digest} | in_use())
        return image

    def cached(self, digest: str) -> Image | None:
        """The image of ``digest`` if this cache holds it (a service restarted in place after an agent restart)."""
        return self._cached(digest)

    def _cached(self, digest: str) -> Image | None:
        folder = self._dir(digest)
        try:
            meta = json.loads((folder / "image.json").read_text())
        except (OSError, ValueError):
            return None
        with contextlib.suppress(OSError):
            os.utime(folder / "image.json")  # the LRU clock
        config = ImageConfig(
            env=list(meta.get("env") or []), args=list(meta.get("args") or []), workdir=str(meta.get("cwd") or "/")
        )
        return Image(digest=digest, rootfs=folder / "rootfs", config=config, pulled_s=0.0)

    def _pull(self, ref: Reference, digest: str, auth: dict[str, Any] | None) -> None:
        folder = self._dir(digest)
        shutil.rmtree(folder, ignore_errors=True)  # a pull an earlier agent left half done
        folder.mkdir(parents=True, mode=0o755)
        layout = folder / "oci"
        tls = [] if self._tls(ref.registry) else ["--src-tls-verify=false"]
        try:
            self._skopeo(
                ["copy", *tls, "--quiet", ref.by_digest(digest), f"oci:{layout}:image"],
                auth=auth,
                registry=ref.registry,
                timeout=PULL_TIMEOUT_S,
            )
            self.pulled.append(digest)
            bundle = folder / "bundle"
            done = subprocess.run(
                [self.umoci, "unpack", "--image", f"{layout}:image", str(bundle)],
                capture_output=True,
                text=True,
                timeout=PULL_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
            )
            if done.returncode != 0:
                raise PullError(f"cannot unpack: {' '.join(done.stderr.split())[-300:]}")
            process = json.loads((bundle / "config.json").read_text()).get("process") or {}
            (bundle / "rootfs").rename(folder / "rootfs")
            meta = {"digest": digest, "reference": str(ref), "env": process.get("env") or [], "args": process.get("args") or []}
            meta.update(cwd=process.get("cwd") or "/", bytes=_size(folder / "rootfs"))
            shutil.rmtree(layout, ignore_errors=True)
            shutil.rmtree(bundle, ignore_errors=True)
            (folder / "image.json").write_text(json.dumps(meta))  # last: what makes it cached
        except (PullError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise exc if isinstance(exc, PullError) else PullError(f"cannot unpack: {exc}") from exc

    def entries(self) -> list[tuple[float, str, int]]:
        """(last used, digest, bytes) of each cached image, least recently used first (a pull under way
        has no image.json yet and is not listed)."""
        found = []
        with contextlib.suppress(OSError):
            for folder in (self.root / "images").iterdir():
                with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                    meta = folder / "image.json"
                    found.append((meta.stat().st_mtime, f"sha256:{folder.name}", int(json.loads(meta.read_text())["bytes"])))
        return sorted(found)

    def evict(self, *, keep: set[str]) -> list[str]:
        """Remove least recently used images, none in `keep` (this agent's live tasks), being pulled, or
        under any container's overlay on this host (another agent's task sharing the cache folder),
        until the cache fits."""
        keep = keep | overlaid(self.root / "images")
        entries = self.entries()
        total = sum(size for _, _, size in entries)
        removed = []
        for _, digest, size in entries:
            if total <= self.max_bytes:
                break
            if digest in keep:
                continue
            with self._lock(digest, wait=False) as held:
                if held:
                    shutil.rmtree(self._dir(digest), ignore_errors=True)
                    removed.append(digest)
                    total -= size
        return removed
