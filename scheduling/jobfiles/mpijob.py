"""Kubeflow MPIJob manifests: the Launcher's mpirun (or program) started on every Worker, no launcher pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduling.jobfiles.common import Errors, Translation, int_value
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


def translate_mpijob(data: Mapping[str, Any]) -> Translation:
    return translate_manifest(data, kind="MPIJob", read_spec=_mpijob)


# mpirun / mpiexec (Open MPI, MPICH/Hydra, Intel MPI) and horovodrun options: how many words each takes.
_MPI_LAUNCHERS = ("mpirun", "mpiexec", "horovodrun", "mpiexec.hydra", "orterun")
_MPI_OPTION_WORDS = {
    **dict.fromkeys(
        ["-np", "--np", "-n", "-c", "-N", "-npernode", "--npernode", "-ppn", "-x", "-H", "--host", "-host", "--hosts",
         "-hostfile", "--hostfile", "-machinefile", "--machinefile", "-f", "-bind-to", "--bind-to", "-map-by", "--map-by",
         "-rank-by", "--rank-by", "-wdir", "--wdir", "-wd", "-output-filename", "--output-filename", "-prefix", "--prefix",
         "-p", "--ssh-port", "--start-timeout", "--network-interface", "-launcher", "-bootstrap"],
        1,
    ),
    **dict.fromkeys(["-mca", "--mca", "-gmca", "--gmca", "-genv", "-env"], 2),
    **dict.fromkeys(
        ["--allow-run-as-root", "-allow-run-as-root", "--oversubscribe", "-oversubscribe", "-tag-output", "--tag-output",
         "-timestamp-output", "--timestamp-output", "-report-bindings", "--report-bindings", "-display-map",
         "--display-map", "-v", "--verbose", "-q", "-quiet", "--quiet", "-noprefix", "--noprefix",
         "--merge-stderr-to-stdout", "-l", "-print-rank-map", "--gloo", "--mpi", "--nccl"],
        0,
    ),
}  # fmt: skip


def _mpijob(spec: Mapping[str, Any], out: Translation, errors: Errors, *, restarts: int | None) -> None:
    allowed = {"mpiReplicaSpecs", "runPolicy", "slotsPerWorker", "mainContainer", "cleanPodPolicy", "sshAuthMountPath",
               "mpiImplementation", "runLauncherAsWorker", "launcherCreationPolicy"}  # fmt: skip
    for key in spec:
        if key not in allowed:
            errors.add(f"spec.{key}", "is not a field Yardmaster knows here: remove it")
    for key, why in (("sshAuthMountPath", "Yardmaster starts every worker itself, not over ssh"),
                     ("mpiImplementation", "mpirun is not run (see the launcher's command)"),
                     ("launcherCreationPolicy", "there is no separate launcher")):  # fmt: skip
        if key in spec:
            out.warnings.append(f"spec.{key} is ignored: {why}")
    if spec.get("runLauncherAsWorker") not in (None, False):
        errors.add("spec.runLauncherAsWorker", "cannot be honoured: the launcher's command runs on every worker; remove it")
    slots = int_value("spec.slotsPerWorker", spec.get("slotsPerWorker", 1), errors, minimum=1)
    if slots is not None and slots != 1:
        errors.add(
            "spec.slotsPerWorker",
            f"{slots} cannot be honoured: Yardmaster starts one process per worker; use slotsPerWorker: 1 and start "
            "the per-GPU processes inside it (torchrun --nproc-per-node, or horovodrun -np N -H localhost:N)",
        )
    replica_specs = spec.get("mpiReplicaSpecs")
    if not isinstance(replica_specs, Mapping):
        errors.add("spec.mpiReplicaSpecs", "give Launcher and Worker replica specs")
        return
    ranks: dict[str, Rank] = {}
    for role, replica in replica_specs.items():
        place = f"spec.mpiReplicaSpecs.{role}"
        if role not in ("Launcher", "Worker"):
            errors.add(place, "is not an MPIJob replica type: Launcher and Worker")
            continue
        rank = read_rank(role, place, replica, out, errors)
        if rank is not None:
            ranks[role] = rank
    launcher, worker = ranks.get("Launcher"), ranks.get("Worker")
    if launcher is None or worker is None:
        if not errors.by_place:
            errors.add("spec.mpiReplicaSpecs", "an MPIJob needs a Launcher and Workers")
        return
    if launcher.replicas != 1:
        errors.add("spec.mpiReplicaSpecs.Launcher.replicas", "an MPIJob has exactly one Launcher")
    if launcher.gpus:
        errors.add(
            f"{launcher.place}.resources.limits.{GPU_RESOURCE}",
            "cannot be honoured: there is no separate launcher to give GPUs; give them to the Workers",
        )
    if worker.replicas < 1:
        errors.add("spec.mpiReplicaSpecs.Worker.replicas", "at least one worker")
        return
    if launcher.image and worker.image and launcher.image != worker.image:
        errors.add(f"{worker.place}.image", f"differs from the Launcher's ({launcher.image!r}): a Yardmaster job runs one image")
    if worker.command:
        if worker.command[0].endswith("sshd"):
            out.warnings.append(f"{worker.place}.command (sshd) is not run: Yardmaster starts the workers itself")
        else:
            errors.add(f"{worker.place}.command", "cannot be honoured: every worker runs the Launcher's program; remove it")
    env = dict(launcher.env)
    for key, value in worker.env.items():
        if key in env and env[key] != value:
            errors.add(f"{worker.place}.env", f"{key} is {value!r} here but {env[key]!r} in the Launcher: give it once")
        env[key] = value
    out.set("replicas", worker.replicas, "spec.mpiReplicaSpecs.Worker.replicas")
    set_gpus(worker, out, errors)
    if not launcher.command:
        errors.add(f"{launcher.place}.command", "give the launcher's command (mpirun ... PROGRAM)")
        return
    program, working_dir = _strip_mpirun([*launcher.command, *launcher.args], launcher, worker.replicas, env, out, errors)
    if not program:
        return
    record_image(
        worker.image or launcher.image,
        out,
        worker.place if worker.image else launcher.place,
        errors,
        working_dir=launcher.working_dir,
    )
    out.set("env", env, f"{launcher.place}.env")
    program_rank = Rank("Launcher", 1, 0, None, program, [], env, working_dir or launcher.working_dir, launcher.place)
    program_rank.restart = launcher.restart
    tries = restart_limit(program_rank, restarts, out)
    out.set(
        "command",
        container_command(program_rank, env, {"PET_NNODES": str(worker.replicas)}, errors, restarts=tries),
        f"{launcher.place}.command",
    )


def _strip_mpirun(
    words: list[str], launcher: Rank, workers: int, env: dict[str, str], out: Translation, errors: Errors
) -> tuple[list[str], str | None]:
    """The program the launcher's mpirun would start on every worker, with the options that still mean something applied."""
    place = f"{launcher.place}.command"
    if not words or words[0].rsplit("/", 1)[-1] not in _MPI_LAUNCHERS:
        # No mpirun: the launcher's command is the program itself (a Horovod/Gloo or torch.distributed program).
        return words, None
    i, np_value, working_dir, not_applied = 1, None, None, []
    while i < len(words) and words[i].startswith("-"):
        option, _, inline = words[i].partition("=")
        if option == "--":
            i += 1
            break
        count = _MPI_OPTION_WORDS.get(option)
        if count is None:
            errors.add(place, f"mpirun option {option} is not known to Yardmaster's translation: remove it")
            return [], None
        values = [inline] if inline and count == 1 else words[i + 1 : i + 1 + count]
        if len(values) < count:
            errors.add(place, f"mpirun option {option} needs {count} value(s)")
            return [], None
        i += 1 + (0 if inline and count == 1 else count)
        if option in ("-np", "--np", "-n", "-c"):
            np_value = values[0]
        elif option == "-x" and "=" in values[0]:
            key, _, value = values[0].partition("=")
            env[key] = value
        elif option in ("-genv", "-env"):
            env[values[0]] = values[1]
        elif option in ("-wdir", "--wdir", "-wd"):
            working_dir = values[0]
        elif option != "-x":
            not_applied.append(option)
    program = words[i:]
    if not program:
        errors.add(place, "mpirun starts no program: give it after mpirun's options")
        return [], None
    if np_value is not None and np_value != str(workers):
        errors.add(
            place,
            f"mpirun -np {np_value} cannot be honoured: the job has {workers} workers with one slot each; use -np {workers}",
        )
    out.warnings.append(
        f"{place}: {words[0]} is not run: Yardmaster starts {' '.join(program)[:80]!r} once on each of the {workers} "
        "workers with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (Horovod with Gloo and torch.distributed "
        "read them); the -x variables are set on every worker"
        + (f"; {', '.join(sorted(set(not_applied)))} not applied" if not_applied else "")
    )
    return program, working_dir
