"""Kubeflow PyTorchJob manifests: the Master and Worker replica specs, one gang of torchrun ranks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduling.jobfiles.common import Errors, Translation
from scheduling.jobfiles.kubeflow import (
    GPU_RESOURCE,
    Rank,
    container_command,
    read_rank,
    record_image,
    restart_limit,
    set_gpus,
    translate_manifest,
)


def translate_pytorchjob(data: Mapping[str, Any]) -> Translation:
    return translate_manifest(data, kind="PyTorchJob", read_spec=_pytorchjob)


def _same(ranks: Sequence[Rank], attribute: str, what: str, errors: Errors) -> None:
    first = ranks[0]
    for other in ranks[1:]:
        if getattr(other, attribute) != getattr(first, attribute):
            errors.add(
                f"{other.place}.{what}",
                f"differs from {first.role}'s: every rank of a Yardmaster job runs the same {what} "
                f"({first.role}: {getattr(first, attribute)!r}, {other.role}: {getattr(other, attribute)!r})",
            )


def _pytorchjob(spec: Mapping[str, Any], out: Translation, errors: Errors, *, restarts: int | None) -> None:
    for key in spec:
        place = f"spec.{key}"
        if key == "elasticPolicy":
            errors.add(place, "cannot be honoured: a Yardmaster gang has a fixed size; give fixed replicas, remove elasticPolicy")
        elif key not in ("pytorchReplicaSpecs", "runPolicy", "nprocPerNode"):
            errors.add(place, "is not a field Yardmaster knows here: remove it")
    replica_specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(replica_specs, Mapping) or not replica_specs:
        errors.add("spec.pytorchReplicaSpecs", "give Master and/or Worker replica specs")
        return
    ranks: list[Rank] = []
    for role, replica in replica_specs.items():
        place = f"spec.pytorchReplicaSpecs.{role}"
        if role not in ("Master", "Worker"):
            errors.add(place, "is not a PyTorchJob replica type: Master and Worker")
            continue
        rank = read_rank(role, place, replica, out, errors)
        if rank is not None:
            ranks.append(rank)
    if not ranks:
        return
    ranks.sort(key=lambda r: r.role != "Master")  # the Master is rank 0, as the operator makes it
    master = next((r for r in ranks if r.role == "Master"), None)
    if master is not None and master.replicas != 1:
        errors.add(f"{master.place.split('.template')[0]}.replicas", "a PyTorchJob has exactly one Master")
    live = [r for r in ranks if r.replicas > 0]
    if not live:
        errors.add("spec.pytorchReplicaSpecs", "at least one replica")
        return
    for attribute, what in (("gpus", f"resources.limits.{GPU_RESOURCE}"), ("image", "image"), ("command", "command"),
                            ("args", "args"), ("env", "env"), ("working_dir", "workingDir"),
                            ("restart", "restartPolicy")):  # fmt: skip
        _same(live, attribute, what, errors)
    first = live[0]
    total = sum(r.replicas for r in live)
    out.set("replicas", total, "spec.pytorchReplicaSpecs (Master + Worker replicas)")
    set_gpus(first, out, errors)
    env = dict(first.env)
    exports = {"PET_NNODES": str(total)}
    nproc = spec.get("nprocPerNode")
    if nproc is not None:
        if str(nproc) == "auto" or str(nproc) == "gpu":
            exports["PET_NPROC_PER_NODE"] = str(first.gpus)
        elif str(nproc).isdigit():
            exports["PET_NPROC_PER_NODE"] = str(nproc)
        else:
            errors.add("spec.nprocPerNode", "a whole number, auto or gpu")
    record_image(first.image, out, first.place, errors, working_dir=first.working_dir)
    out.set("env", env, f"{first.place}.env")
    tries = restart_limit(first, restarts, out)
    out.set("command", container_command(first, env, exports, errors, restarts=tries), f"{first.place}.command")
