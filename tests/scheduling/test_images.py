"""Image references, mounts and working directories as users write them (scheduling/images.py, pure)."""

import pytest

from scheduling.images import ImageError, check_image, check_workdir, mounts_text, parse_image, parse_mounts

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("python", "docker.io/library/python:latest"),
        ("python:3.12", "docker.io/library/python:3.12"),
        ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", "docker.io/pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"),
        ("index.docker.io/library/ubuntu:22.04", "docker.io/library/ubuntu:22.04"),
        ("nvcr.io/nvidia/pytorch:24.05-py3", "nvcr.io/nvidia/pytorch:24.05-py3"),
        ("registry.corp:5000/ml/train", "registry.corp:5000/ml/train:latest"),
        ("localhost/x:1", "localhost/x:1"),
        ("127.0.0.1:5000/busybox:1", "127.0.0.1:5000/busybox:1"),
        (f"nvcr.io/nvidia/pytorch@{DIGEST}", f"nvcr.io/nvidia/pytorch@{DIGEST}"),
        (f"nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}", f"nvcr.io/nvidia/pytorch:24.05-py3@{DIGEST}"),
        ("  Registry.Corp:5000/a/b/c:v1  ", "registry.corp:5000/a/b/c:v1"),
    ],
)
def test_a_good_reference_normalises_as_dockers(text: str, normal: str) -> None:
    assert str(parse_image(text)) == normal


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "Name an image"),
        ("docker://nvcr.io/x", "without a scheme"),
        ("nvcr.io/x y", "no spaces"),
        ("nvcr.io/x@sha256:abc", "64 lower-case hex"),
        ("nvcr.io/Nvidia/pytorch", "'Nvidia' is not a repository name part"),
        ("nvcr.io/x:-bad", "the tag '-bad'"),
        ("nvcr.io:99999/x", "port must be a number"),
        ("nvcr.io/", "name the repository"),
        ("a" * 600, "at most 512"),
        ("bad_host.io/x", "is not a registry host name"),
    ],
)
def test_a_bad_reference_is_refused_with_one_clear_message(text: str, says: str) -> None:
    with pytest.raises(ImageError, match=None) as caught:
        parse_image(text)
    assert says in str(caught.value)


def test_the_allow_list_refuses_another_registry_naming_those_allowed() -> None:
    with pytest.raises(ImageError) as caught:
        check_image("ghcr.io/x/y:1", allow=["nvcr.io", "registry.corp:5000"])
    assert str(caught.value) == (
        "Images may not come from ghcr.io on this cluster: the registries allowed are nvcr.io, registry.corp:5000"
    )


def test_a_bare_host_on_the_allow_list_allows_its_every_port_and_a_port_only_itself() -> None:
    assert check_image("registry.corp:5000/a", allow=["registry.corp"]) == "registry.corp:5000/a:latest"
    assert check_image("registry.corp:5000/a", allow=["registry.corp:5000"])
    with pytest.raises(ImageError):
        check_image("registry.corp:6000/a", allow=["registry.corp:5000"])
    with pytest.raises(ImageError):
        check_image("python", allow=["nvcr.io"])  # docker.io, by default
    assert check_image("python", allow=["docker.io"]) == "docker.io/library/python:latest"


def test_an_empty_allow_list_allows_any_registry() -> None:
    assert check_image("ghcr.io/x/y:1", allow=[]) == "ghcr.io/x/y:1"


def test_pyxis_mounts_parse_to_the_agents_form() -> None:
    assert parse_mounts("/data:/data:ro,/scratch/me:/scratch,/models") == [
        {"source": "/data", "target": "/data", "readonly": True},
        {"source": "/scratch/me", "target": "/scratch", "readonly": False},
        {"source": "/models", "target": "/models", "readonly": False},
    ]
    assert mounts_text(parse_mounts("/data:/data:ro,/a:/b")) == "/data:/data:ro,/a:/b"


def test_mounts_as_a_list_of_mappings_or_strings() -> None:
    assert parse_mounts([{"source": "/a", "target": "/b", "readonly": True}, "/c:/d"]) == [
        {"source": "/a", "target": "/b", "readonly": True},
        {"source": "/c", "target": "/d", "readonly": False},
    ]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("data:/data", "must be an absolute path"),
        ("/data/../etc:/x", "must not contain '..'"),
        ("/a:/b:rx", "the flag is ro or rw"),
        ("/a:/b:ro:x", "is not SRC[:DST[:ro|rw]]"),
        ("/a:/", "cannot replace the container's root"),
        ("/a:/x,/b:/x", "/x is named twice"),
        ([{"source": "/a", "target": "/b", "mode": "ro"}], "unknown keys mode"),
        ([{"source": "/a", "target": "/b", "readonly": "yes"}], "readonly is true or false"),
        ([3], "must be SRC:DST"),
        ({"a": 1}, "SRC:DST[:ro|rw],..."),
    ],
)
def test_a_bad_mount_is_refused_saying_what_to_change(value: object, says: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_mounts(value)
    assert says in str(caught.value)


def test_the_working_directory_is_absolute_without_dotdot() -> None:
    assert check_workdir("/workspace/") == "/workspace"
    assert check_workdir("") == ""
    for bad in ("workspace", "/a/../b"):
        with pytest.raises(ImageError):
            check_workdir(bad)
