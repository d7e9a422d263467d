"""Container image references, mounts and working directories as a user writes them: parsed, checked, normalised.

Pure Python (no Django): the job-file translators use it as the API and the portal's form do, so a
reference is refused with the same words wherever it was written. The deployment's registry allow-list
(``YARD_REGISTRY_ALLOW``) is passed in by the caller.

A reference normalises as Docker's does: ``python:3.12`` is ``docker.io/library/python:3.12``, a tag
left out is ``latest`` unless a digest is given, and the first path component is a registry only if it
has a dot or a port or is ``localhost`` (``nvcr.io/nvidia/pytorch:24.05-py3``, ``registry:5000/x``).
The node agent parses the normalised form the same way (nodeagent/containers/images.py).
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DOCKER_HUB = "docker.io"
_HUB_ALIASES = ("index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")
MAX_REF = 512
MAX_MOUNTS = 64
MAX_PATH = 1024
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:.]+\]"
)
SHAPE = "registry[:port]/path[:tag][@sha256:<64 hex digits>], e.g. nvcr.io/nvidia/pytorch:24.05-py3"


class ImageError(ValueError):
    """A reference, mount or working directory that cannot be used: one message saying what to change."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port], lower case
    repository: str  # library/python, nvidia/pytorch
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        return (
            f"{self.registry}/{self.repository}"
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def _registry(text: str, ref: str) -> str:
    host, colon, port = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not colon:
        host, port = text, ""
    where = f"{ref!r}: " if ref != text else ""
    if not _HOST.fullmatch(host):
        raise ImageError(f"{where}{text!r} is not a registry host name")
    if colon and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ImageError(f"{where}the registry's port must be a number from 1 to 65535")
    registry = text.lower()
    return DOCKER_HUB if registry in _HUB_ALIASES else registry


def parse_image(text: str) -> ImageRef:
    """The reference ``text`` normalised; raises ImageError saying what is wrong with it."""
    ref = text.strip() if isinstance(text, str) else ""
    if not ref:
        raise ImageError(f"Name an image: {SHAPE}")
    if len(ref) > MAX_REF:
        raise ImageError(f"An image reference is at most {MAX_REF} characters")
    if "://" in ref:
        raise ImageError(f"{ref!r}: write the reference without a scheme ({SHAPE})")
    if any(c.isspace() or c == "\x00" for c in ref):
        raise ImageError(f"{ref!r}: an image reference has no spaces ({SHAPE})")
    name, at, digest = ref.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ImageError(f"{ref!r}: a digest is sha256: and 64 lower-case hex digits")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry, path = _registry(first, ref), rest
    else:
        registry, path = DOCKER_HUB, name
    tag: str | None = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise ImageError(f"{ref!r}: the tag {tag!r} may hold letters, digits, _ . - (at most 128, not starting with . or -)")
    if not path:
        raise ImageError(f"{ref!r}: name the repository after the registry ({SHAPE})")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise ImageError(
                f"{ref!r}: {component!r} is not a repository name part (lower-case letters, digits, and . _ - between them)"
            )
    return ImageRef(registry=registry, repository=path, tag=tag or (None if at else "latest"), digest=digest or None)


def parse_registry(text: str) -> str:
    """A registry as a credential or an allow-list names it (host[:port]), normalised; raises ImageError."""
    value = text.strip() if isinstance(text, str) else ""
    if not value or len(value) > 255 or "/" in value or any(c.isspace() for c in value):
        raise ImageError(f"Name a registry as host[:port], e.g. nvcr.io or registry.corp:5000, not {value[:80]!r}")
    return _registry(value, value)


def registry_allowed(registry: str, allow: Iterable[str]) -> bool:
    """Is ``registry`` (host[:port]) on the allow-list (empty: every registry)? A bare host allows its every port."""
    hosts = [_normal_host(a) for a in allow if a.strip()]
    host = registry.lower()
    return not hosts or host in hosts or host.rsplit(":", 1)[0] in hosts


def _normal_host(entry: str) -> str:
    host = entry.strip().lower()
    return DOCKER_HUB if host in _HUB_ALIASES else host


def check_image(text: str, *, allow: Iterable[str] = ()) -> str:
    """The normalised reference, if it is well formed and its registry is allowed; raises ImageError."""
    ref = parse_image(text)
    allowed = [a.strip() for a in allow if a.strip()]
    if not registry_allowed(ref.registry, allowed):
        raise ImageError(
            f"Images may not come from {ref.registry} on this cluster: the registries allowed are {', '.join(allowed)}"
        )
    return str(ref)


# --------------------------------------------------------------------------- mounts and the working directory


def _path(place: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ImageError(f"{place} must be an absolute path")
    if len(value) > MAX_PATH or "\x00" in value:
        raise ImageError(f"{place} must be a path of at most {MAX_PATH} characters")
    if not value.startswith("/"):
        raise ImageError(f"{place} {value!r} must be an absolute path (starting with /)")
    if ".." in value.split("/"):
        raise ImageError(f"{place} {value!r} must not contain '..'")
    if "," in value or ":" in value:
        raise ImageError(f"{place} {value!r} must not contain ',' or ':' (they separate mounts and their parts)")
    return posixpath.normpath(value)


def _mount(place: str, source: Any, target: Any, readonly: Any) -> dict[str, Any]:
    src = _path(f"{place}: the source", source)
    dst = _path(f"{place}: the target", target)
    if dst == "/":
        raise ImageError(f"{place}: a mount cannot replace the container's root (/)")
    if not isinstance(readonly, bool):
        raise ImageError(f"{place}: readonly is true or false")
    return {"source": src, "target": dst, "readonly": readonly}


def _pyxis_item(place: str, item: str) -> dict[str, Any]:
    parts = item.strip().split(":")
    if len(parts) > 3 or not parts[0]:
        raise ImageError(f"{place} {item!r} is not SRC[:DST[:ro|rw]]")
    flags = parts[2] if len(parts) == 3 else "rw"
    if flags not in ("ro", "rw"):
        raise ImageError(f"{place} {item!r}: the flag is ro or rw, not {flags!r}")
    return _mount(place, parts[0], parts[1] if len(parts) > 1 and parts[1] else parts[0], flags == "ro")


def parse_mounts(value: Any) -> list[dict[str, Any]]:
    """Mounts as the agent takes them (``[{"source", "target", "readonly"}]``) from pyxis's
    ``SRC:DST[:ro|rw],...`` (DST left out: the same path), a list of such strings, or a list of mappings.
    Sources and targets are absolute, without ``..``; a target is mounted once. Raises ImageError."""
    if value is None or value == "":
        return []
    items: list[Any] = [i for i in value.split(",") if i.strip()] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise ImageError("Container mounts are SRC:DST[:ro|rw],... or a list of {source, target, readonly}")
    if len(items) > MAX_MOUNTS:
        raise ImageError(f"At most {MAX_MOUNTS} container mounts")
    mounts: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        place = f"Mount {i + 1}"
        if isinstance(item, str):
            mounts.append(_pyxis_item(place, item))
        elif isinstance(item, Mapping):
            extra = set(item) - {"source", "target", "readonly"}
            if extra:
                raise ImageError(f"{place}: unknown keys {', '.join(sorted(map(str, extra)))} (source, target, readonly)")
            source = item.get("source")
            mounts.append(_mount(place, source, item.get("target") or source, item.get("readonly", False)))
        else:
            raise ImageError(f"{place} must be SRC:DST[:ro|rw] or {{source, target, readonly}}")
    targets = [m["target"] for m in mounts]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise ImageError(f"Each target is mounted once: {', '.join(twice)} is named twice")
    return mounts


def mounts_text(mounts: Iterable[Mapping[str, Any]]) -> str:
    """Mounts as pyxis writes them (what the portal's form shows)."""
    return ",".join(f"{m['source']}:{m['target']}" + (":ro" if m.get("readonly") else "") for m in mounts)


def check_workdir(value: Any) -> str:
    """The working directory inside the container ("" : the task's run directory); raises ImageError."""
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not value.startswith("/") or len(value) > MAX_PATH or "\x00" in value:
        raise ImageError(f"The working directory in the container is an absolute path of at most {MAX_PATH} characters")
    if ".." in value.split("/"):
        raise ImageError(f"The working directory {value!r} must not contain '..'")
    return posixpath.normpath(value)
