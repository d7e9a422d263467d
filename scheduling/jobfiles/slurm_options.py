"""sbatch's options: which Yardmaster honours, accepts with a warning or refuses, the #SBATCH lines read as
sbatch reads them, and the values they take (times, GPU counts, sizes)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from scheduling.jobfiles.common import Errors, Translation
from scheduling.jobfiles.slurm_containers import PYXIS_FLAGS

_SBATCH = re.compile(r"^#SBATCH(\s+|$)(.*)$")
# short option -> long option (sbatch's own)
_SHORT = {
    "J": "job-name", "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "q": "qos",
    "A": "account", "o": "output", "e": "error", "D": "chdir", "G": "gpus", "w": "nodelist", "x": "exclude",
    "d": "dependency", "a": "array", "C": "constraint", "W": "wait", "H": "hold", "s": "oversubscribe",
    "i": "input", "k": "no-kill", "m": "distribution", "M": "clusters", "L": "licenses", "B": "extra-node-info",
    "F": "nodefile", "Q": "quiet", "v": "verbose", "S": "core-spec",
}  # fmt: skip
_FLAGS = {"exclusive", "requeue", "no-requeue", "wait", "hold", "oversubscribe", "contiguous", "overcommit", "quiet",
          "verbose", "parsable", "spread-job", "use-min-nodes", "no-kill", "test-only"} | PYXIS_FLAGS  # fmt: skip
# Accepted with a warning: ignoring them does not change what the job computes.
SLURM_WARN = {
    "mail-type": "mail about jobs is chosen per person in the portal (Notifications → Preferences), not per job",
    "mail-user": "mail goes to the job owner's address, as chosen in the portal (Notifications → Preferences)",
    "comment": "kept nowhere",
    "exclusive": "a replica holds its GPUs alone; other jobs may use the node's other GPUs",
    "open-mode": "the output file is appended to",
    "requeue": "Yardmaster always requeues a preempted or lost job from its checkpoint",
    "hint": "Yardmaster places by GPU topology",
    "threads-per-core": "Yardmaster places by GPU topology",
    "cores-per-socket": "Yardmaster places by GPU topology",
    "sockets-per-node": "Yardmaster places by GPU topology",
    "gpu-bind": "each replica gets CUDA_VISIBLE_DEVICES for its GPUs, NVLink-local where they fit",
    "cpu-bind": "Yardmaster places by GPU topology",
    "distribution": "one replica per node, ranks in node order",
    "wait": "use `yard submit --wait`",
    "parsable": "use `yard submit --json`",
    "quiet": "the CLI prints what it prints",
    "verbose": "the CLI prints what it prints",
    "profile": "no Slurm accounting plugins here",
    "acctg-freq": "no Slurm accounting plugins here",
    "propagate": "resource limits are the node's",
    "uid": "the job runs as its submitter",
    "gid": "the job runs as its submitter",
    "wckey": "usage is accounted by team (`yard report`)",
    "reservation": "Yardmaster reserves for the highest-priority waiting job itself",
    "signal": "a stopped job gets SIGTERM, then SIGKILL after the grace period (YARD_GRACE_PERIOD_S)",
    "tmp": "a replica uses its node's disk",
    "overcommit": "one replica per node",
    "contiguous": "Yardmaster packs a gang into the fewest leaf switches",
    "spread-job": "Yardmaster packs a gang into the fewest leaf switches",
    "network": "the job uses its nodes' network",
    "export-file": "the job's variables come from its own env",
    "get-user-env": "the job's variables come from its own env",
}  # fmt: skip
# Refused: ignoring them would change the result (where, when or how often the job runs, or what it computes).
SLURM_REFUSED = {
    "dependency": "job dependencies are not supported: chain jobs with `yard submit --wait` in your pipeline",
    "begin": "a delayed start is not supported: submit when the job should start",
    "deadline": "deadlines are not supported: give --time",
    "hold": "held jobs are not supported: submit when the job should run",
    "nodelist": "placement is Yardmaster's (topology-aware): a job cannot name its nodes",
    "nodefile": "placement is Yardmaster's (topology-aware): a job cannot name its nodes",
    "exclude": "placement is Yardmaster's (topology-aware): a job cannot exclude nodes",
    "constraint": "choose the GPU type with --partition (or --gres=gpu:TYPE:N); other node features are not known here",
    "no-requeue": "Yardmaster always requeues a preempted or lost job from its checkpoint: remove --no-requeue",
    "clusters": "Yardmaster is one cluster",
    "licenses": "licenses are not tracked",
    "mincpus": "Yardmaster allocates GPUs",
    "test-only": "ask with `yard submit` and read its admission verdict",
    "input": "a job has no standard input",
    "kill-on-invalid-dep": "job dependencies are not supported",
    "core-spec": "Yardmaster allocates GPUs",
    "thread-spec": "Yardmaster allocates GPUs",
    "extra-node-info": "Yardmaster places by GPU topology",
    "ntasks-per-socket": "Yardmaster places by GPU topology",
    "ntasks-per-core": "Yardmaster places by GPU topology",
    "ntasks-per-gpu": "give --ntasks-per-node and --gpus-per-node",
    "mem-bind": "Yardmaster places by GPU topology",
    "batch": "node features are not known here",
    "oversubscribe": "a replica's GPUs are its own",
    "prefer": "node features are not known here",
    "gpu-freq": "GPU clocks are the node's",
    "container": "an OCI bundle on the nodes cannot be run: name an image with --container-image (pyxis's), "
    "which each node pulls from its registry",
}
SLURM_HONOURED = {
    "job-name", "nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "gpus-per-task", "gres", "time",
    "partition", "qos", "account", "output", "error", "chdir", "export", "nice", "priority", "time-min",
    "switches", "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "segment", "array",
}  # fmt: skip


@dataclass
class Directive:
    option: str
    value: str | None
    line: int
    text: str

    @property
    def place(self) -> str:
        return f"#SBATCH --{self.option}" + (f"={self.value}" if self.value is not None else "") + f" (line {self.line})"


def read_directives(script: str, out: Translation, errors: Errors) -> list[Directive]:
    """#SBATCH lines as sbatch reads them: up to the first line that is neither blank nor a comment."""
    found: list[Directive] = []
    in_header = True
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        match = _SBATCH.match(line)
        if match is None:
            if line and not line.startswith("#"):
                in_header = False
            continue
        if not in_header:
            out.warnings.append(
                f"line {number}: {line[:60]!r} comes after the script's first command; sbatch ignores it, and so does Yardmaster"
            )
            continue
        try:
            words = shlex.split(match.group(2), comments=True)
        except ValueError as exc:
            errors.add(f"line {number}", f"cannot read this #SBATCH line: {exc}")
            continue
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if word.startswith("--"):
                option, eq, value = word[2:].partition("=")
                if not eq and option not in _FLAGS and i < len(words) and not words[i].startswith("-"):
                    value, i = words[i], i + 1
                found.append(Directive(option, value if (eq or value) else None, number, line))
            elif word.startswith("-") and len(word) >= 2 and word[1] in _SHORT:
                option = _SHORT[word[1]]
                short_value = word[2:].lstrip("=") or None
                if short_value is None and option not in _FLAGS and i < len(words) and not words[i].startswith("-"):
                    short_value, i = words[i], i + 1
                found.append(Directive(option, short_value, number, line))
            else:
                errors.add(f"line {number}", f"{word!r} is not an sbatch option")
    return found


def slurm_time(text: str) -> int | None:
    """sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS. None: not one of those."""
    days = 0
    if "-" in text:
        day_text, _, text = text.partition("-")
        if not day_text.isdigit():
            return None
        days = int(day_text)
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            return None
        hours, minutes, seconds = [*map(int, parts), 0, 0][:3]
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = list(map(int, parts))
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]


def gpu_spec(text: str, gpu_types: Sequence[str]) -> tuple[str | None, int] | None:
    """'8', 'h100:8' (and for --gres 'gpu:8', 'gpu:h100:8') -> (type or None, count); None: not a GPU count."""
    parts = text.split(":")
    if parts and parts[0] == "gpu":
        parts = parts[1:]
    if len(parts) == 1 and parts[0].isdigit():
        return None, int(parts[0])
    if len(parts) == 2 and parts[1].isdigit():
        return known_type(parts[0], gpu_types) or parts[0], int(parts[1])
    return None


def known_type(name: str, gpu_types: Sequence[str]) -> str | None:
    return next((t for t in gpu_types if t.lower() == name.lower()), None)


def slurm_memory_mb(d: Directive, errors: Errors) -> int | None:
    """sbatch's memory sizes: MB by default, or with a unit K, M, G, T (--mem=64G)."""
    match = re.fullmatch(r"(\d+)([KMGT]?)", (d.value or "").strip(), flags=re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        errors.add(d.place, "give a size of at least 1 MB, e.g. 64G (or --mem=0: all of a node's memory)")
        return None
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    return max(1, round(int(match.group(1)) * scale))


def positive(d: Directive, errors: Errors) -> int | None:
    if d.value is None or not d.value.isdigit() or int(d.value) < 1:
        if d.value is not None and re.fullmatch(r"\d+-\d+", d.value):
            low, high = d.value.split("-")
            if low == high:
                return int(low)
            errors.add(d.place, "a range cannot be honoured: a Yardmaster gang has a fixed size; give one number")
            return None
        errors.add(d.place, "give a whole number of at least 1")
        return None
    return int(d.value)
