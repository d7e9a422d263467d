"""pyxis's container options in an sbatch script: ``#SBATCH --container-image`` (with ``--container-mounts`` and
``--container-workdir``) and the same on the script's ``srun`` lines, as NVIDIA's pyxis/enroot read them.

The job's image is the one named: every node runs the whole script in it (under pyxis only the srun steps
run in the container, the batch script on the host; here there is one image per job, so the script's own
lines run in it too, and a warning says so). Two different images (two srun lines, or an srun line and an
#SBATCH line) are refused: a Yardmaster job runs in one image.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from scheduling import images
from scheduling.jobfiles.common import Errors, Translation

# pyxis's options that Yardmaster honours, as job fields.
PYXIS_HONOURED = {"container-image": "image", "container-mounts": "container_mounts", "container-workdir": "container_workdir"}
# pyxis's other options: accepted with a warning, as ignoring them does not change what the job computes.
PYXIS_WARN = {
    "container-name": "each job runs in a container of its own, made from the image",
    "container-save": "a container's changes are not saved: write results to a mounted path or the checkpoint directory",
    "container-writable": "each container writes to an overlay layer of its own, removed with it",
    "container-readonly": "each container writes to an overlay layer of its own, removed with it",
    "container-mount-home": "the home directory is mounted only when --container-mounts names it",
    "no-container-mount-home": "the home directory is mounted only when --container-mounts names it",
    "container-remap-root": "the job runs as its owner's account in the container (or the agent's)",
    "no-container-remap-root": "the job runs as its owner's account in the container (or the agent's)",
    "container-entrypoint": "the job's command runs under /bin/sh in the container, not the image's entrypoint",
    "no-container-entrypoint": "the job's command runs under /bin/sh in the container, not the image's entrypoint",
    "container-env": "the job's variables are set in the container as on the host",
}
PYXIS_FLAGS = {
    "container-writable", "container-readonly", "container-mount-home", "no-container-mount-home",
    "container-remap-root", "no-container-remap-root", "container-entrypoint", "no-container-entrypoint",
}  # fmt: skip
# srun's pyxis options that take a value as the next word (the srun shim skips them with it).
SRUN_VALUE_OPTIONS = ("--container-image", "--container-mounts", "--container-workdir", "--container-name", "--container-env")


@dataclass(frozen=True)
class Given:
    value: str
    place: str


def _srun_options(script: str) -> list[tuple[str, Given]]:
    """pyxis options on the script's srun lines: (option without --, its value and place)."""
    found: list[tuple[str, Given]] = []
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if line.startswith("#") or "srun" not in line or "--container-" not in line:
            continue
        try:
            # Not comments=True: shlex would end "nvcr.io#nvidia/pytorch" at its "#", where the shell starts a
            # comment only at a word's start.
            words = shlex.split(line)
        except ValueError:
            continue
        words = words[: next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
        for start, word in enumerate(words):
            if word.rsplit("/", 1)[-1] != "srun":
                continue
            i = start + 1
            while i < len(words) and words[i].startswith("-"):
                option, eq, value = words[i][2:].partition("=")
                i += 1
                if option in PYXIS_HONOURED:
                    if not eq and i < len(words):
                        value, i = words[i], i + 1
                    found.append((option, Given(value, f"srun --{option}={value} (line {number})")))
                elif not eq and f"--{option}" in SRUN_VALUE_OPTIONS:
                    i += 1
    return found


def _enroot_reference(value: str) -> str:
    """pyxis's image as a registry reference: enroot writes ``nvcr.io#nvidia/pytorch:24.05-py3`` (the registry
    before ``#``) and accepts ``docker://`` before it; a squashfs file stays as it is (refused as no reference)."""
    ref = value.strip().removeprefix("docker://")
    registry, hash_mark, rest = ref.partition("#")
    if hash_mark and "@" in registry:
        registry = registry.rsplit("@", 1)[1]  # enroot's USER@REGISTRY#IMAGE: the credential is the team's, not this
    return f"{registry}/{rest}" if hash_mark else ref


def read_pyxis(sbatch: Mapping[str, Given], script: str, out: Translation, errors: Errors) -> None:
    """The job's image, mounts and working directory from #SBATCH lines (``sbatch``: option -> value) and srun lines."""
    chosen: dict[str, Given] = dict(sbatch)
    from_srun = False
    for option, given in _srun_options(script):
        earlier = chosen.get(option)
        if earlier is not None and earlier.value != given.value:
            what = "runs in one image" if option == "container-image" else f"has one {option.removeprefix('container-')}"
            errors.add(given.place, f"differs from {earlier.place}: a Yardmaster job {what}; give it once")
            continue
        chosen.setdefault(option, given)
        from_srun = True
    if not chosen:
        return
    image = chosen.get("container-image")
    if image is not None and image.value.strip().startswith(("/", "./")):
        errors.add(image.place, "a squashfs file cannot be used here: push the image to a registry and name it")
        return
    if image is None:
        for given in chosen.values():
            errors.add(given.place, "needs --container-image: the mounts and working directory are the image's container's")
        return
    try:
        out.set("image", str(images.parse_image(_enroot_reference(image.value))), image.place)
    except images.ImageError as exc:
        errors.add(image.place, str(exc))
    if (mounts := chosen.get("container-mounts")) is not None:
        try:
            out.set("container_mounts", images.parse_mounts(mounts.value), mounts.place)
        except images.ImageError as exc:
            errors.add(mounts.place, str(exc))
    if (workdir := chosen.get("container-workdir")) is not None:
        try:
            out.set("container_workdir", images.check_workdir(workdir.value), workdir.place)
        except images.ImageError as exc:
            errors.add(workdir.place, str(exc))
    if from_srun:
        out.warnings.append(
            f"{image.place}: the whole script runs in this image on every node, not only its srun steps (pyxis runs "
            "the batch script itself on the host): the script's own commands must be in the image too"
        )
