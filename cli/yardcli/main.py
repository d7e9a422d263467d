"""The `yard` commands. Each one is a few REST calls and a table; `--json` prints what the API answered.

Coming from Slurm: `yard submit`/`yard sbatch` ~ sbatch, `yard ls` ~ squeue, `yard cancel` ~ scancel,
`yard report` ~ sacct/sreport. Coming from Kubeflow: `yard submit pytorchjob.yaml` ~ kubectl apply -f.

This module is only the root group and its commands' registration; each group lives in yardcli/commands/
(auth, submit, jobs, arrays, notebooks, dev, ssh, serve, usage) and what they share in yardcli/commands/common.py.
"""

from __future__ import annotations

import click

from yardcli import __version__
from yardcli.client import credentials
from yardcli.commands import arrays, auth, dev, jobs, notebooks, registry, serve, ssh, submit, usage


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="yard")
def cli() -> None:
    """Yardmaster from the command line: submit jobs (flags, Yardmaster job files, Kubeflow PyTorchJob/MPIJob
    manifests, Slurm batch scripts), follow them, run inference services (`yard serve`), work on GPUs over SSH
    (`yard dev`, `yard ssh`), and read quotas and usage.

    Sign in once with `yard login`, or set YARD_URL and YARD_TOKEN (CI)."""


for command in (
    auth.login,
    auth.logout,
    auth.whoami,
    submit.submit,
    submit.sbatch,
    submit.help_exit_codes,
    jobs.wait,
    jobs.list_jobs,
    jobs.show,
    jobs.logs,
    jobs.cancel,
    jobs.rerun,
    arrays.array,
    notebooks.notebook,
    dev.dev,
    ssh.ssh,
    ssh.ssh_key,
    serve.serve,
    usage.quota,
    usage.report,
    registry.registry_credential,
):
    cli.add_command(command)


__all__ = ["cli", "credentials"]
