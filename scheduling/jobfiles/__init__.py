"""Job files, translated on the server into the job-submit input (the fields of ``JobSubmitIn``).

Three formats, so a CI pipeline can post what it already has (docs/job-files.md):

- a Yardmaster job file (YAML or JSON): the API's own fields, nothing else;
- a Kubeflow ``kubeflow.org/v1`` PyTorchJob or MPIJob manifest, or a ``kubeflow.org/v2beta1`` MPIJob
  (the mpi-operator's current API);
- a Slurm batch script with ``#SBATCH`` directives.

The rule for everything a file can say: it is honoured (mapped onto a job field, or kept by the
command the job runs), or it is accepted with a warning naming it because ignoring it does not
change what the job computes, or it is refused with a 400 naming it and saying what to change.
Nothing is dropped silently. The translation is plain Python over the parsed file (no database):
the caller passes the GPU types the cluster has, and validates the result with the API's serializer.

One module per format, each a pure function from the file to a Translation: yardmaster.py, pytorchjob.py and
mpijob.py (over kubeflow.py, what both Kubeflow kinds share), slurm.py (with slurm_options.py and
slurm_shims.py); common.py holds what they all use. translate() here picks the module. Nothing here imports
Django (an import-linter contract keeps it so): a refusal is a JobFileInvalid, which the API answers as its
400 naming each place in the file (scheduling/api/submission.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduling.jobfiles.common import (
    FORMATS,
    JOB_FIELDS,
    KUBEFLOW_API_VERSION,
    MAX_FILE_BYTES,
    MPI_V2_API_VERSION,
    SCRIPT_MEDIA_TYPES,
    YAML_MEDIA_TYPES,
    YARDMASTER_API_VERSION,
    JobFileInvalid,
    Translation,
    parse_yaml,
    refuse,
)
from scheduling.jobfiles.envelope import apply_defaults, located, missing_hints
from scheduling.jobfiles.mpijob import translate_mpijob
from scheduling.jobfiles.pytorchjob import translate_pytorchjob
from scheduling.jobfiles.slurm import translate_slurm
from scheduling.jobfiles.yardmaster import translate_yardmaster

__all__ = [
    "FORMATS",
    "JOB_FIELDS",
    "MAX_FILE_BYTES",
    "SCRIPT_MEDIA_TYPES",
    "YAML_MEDIA_TYPES",
    "JobFileInvalid",
    "Translation",
    "apply_defaults",
    "detect_format",
    "located",
    "missing_hints",
    "parse_yaml",
    "translate",
]


def detect_format(data: Any) -> str:
    """The format of a parsed YAML/JSON document: a Kubeflow manifest by its apiVersion and kind, else ours."""
    if not isinstance(data, Mapping):
        raise refuse("file", "A job file is a mapping of fields (YAML or JSON), not a list or a single value")
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if isinstance(api_version, str) and api_version.startswith("kubeflow.org/"):
        if api_version == MPI_V2_API_VERSION and kind == "MPIJob":
            return "mpijob"
        if api_version != KUBEFLOW_API_VERSION:
            raise refuse(
                "apiVersion",
                f"{api_version} is not supported: Yardmaster reads {KUBEFLOW_API_VERSION} manifests and "
                f"{MPI_V2_API_VERSION} MPIJobs",
            )
        if kind == "PyTorchJob":
            return "pytorchjob"
        if kind == "MPIJob":
            return "mpijob"
        raise refuse("kind", f"{kind!r} is not supported: Yardmaster reads {KUBEFLOW_API_VERSION} PyTorchJob and MPIJob")
    if api_version is not None and api_version != YARDMASTER_API_VERSION:
        raise refuse(
            "apiVersion",
            f"{str(api_version)[:80]!r} is not a format Yardmaster reads: use {YARDMASTER_API_VERSION} (a Yardmaster "
            f"job file), {KUBEFLOW_API_VERSION} PyTorchJob or MPIJob, or send a Slurm batch script as text/x-shellscript",
        )
    return "yardmaster"


def translate(*, fmt: str, data: Any = None, text: str = "", gpu_types: Sequence[str] = ()) -> Translation:
    """The job fields a file asks for. ``data`` is the parsed document (YAML/JSON formats), ``text`` the
    script (Slurm). ``gpu_types`` are the GPU types the cluster has (Slurm partitions name them).

    Raises JobFileInvalid keyed by the place in the file, with what to change.
    """
    if fmt == "slurm":
        return translate_slurm(text, gpu_types=gpu_types)
    if data is None:
        data = parse_yaml(text)
    detected = detect_format(data)
    if fmt not in ("auto", detected):
        raise refuse("format", f"format is {fmt!r} but the file is a {detected} file")
    if detected == "yardmaster":
        return translate_yardmaster(data)
    return translate_pytorchjob(data) if detected == "pytorchjob" else translate_mpijob(data)
