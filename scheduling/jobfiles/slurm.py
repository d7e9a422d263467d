"""Slurm batch scripts: the #SBATCH directives as the job's fields, the script itself as its command, run on
every node with Slurm's variables, srun and scontrol (slurm_shims.py)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from scheduling.jobfiles.common import ENV_NAME, MAX_FILE_BYTES, TIER_WORDS, Errors, Translation, refuse
from scheduling.jobfiles.slurm_containers import PYXIS_HONOURED, PYXIS_WARN, Given, read_pyxis
from scheduling.jobfiles.slurm_options import (
    SLURM_HONOURED,
    SLURM_REFUSED,
    SLURM_WARN,
    Directive,
    gpu_spec,
    known_type,
    positive,
    read_directives,
    slurm_memory_mb,
    slurm_time,
)
from scheduling.jobfiles.slurm_shims import SCONTROL_SHIM, SRUN_OPTION_WORDS, SRUN_SHIM

_SHELLS = {"sh", "bash", "dash", "ksh", "zsh"}
# %A and %a as Slurm fills them outside an array too: the job's own id, and NO_VAL (4294967294).
_OUTPUT_PATTERNS = {"%j": "${SLURM_JOB_ID}", "%J": "${SLURM_JOB_ID}", "%x": "${SLURM_JOB_NAME}", "%u": "${USER:-$(id -un)}",
                    "%N": "$(hostname -s)", "%n": "${SLURM_NODEID}", "%t": "${SLURM_NODEID}", "%%": "%",
                    "%A": "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}", "%a": "${SLURM_ARRAY_TASK_ID:-4294967294}"}  # fmt: skip
# The symbols that are numbers, which sbatch zero-pads to a width given between % and the letter (%4a).
_NUMERIC_PATTERNS = {"%j": "$SLURM_JOB_ID", "%J": "$SLURM_JOB_ID", "%n": "$SLURM_NODEID", "%t": "$SLURM_NODEID",
                     "%A": "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}", "%a": "${SLURM_ARRAY_TASK_ID:-4294967294}"}  # fmt: skip
_WIDTH = re.compile(r"%(\d+)([A-Za-z])")


def translate_slurm(script: str, *, gpu_types: Sequence[str] = ()) -> Translation:
    """An sbatch script -> a job whose command runs the script on every node, with Slurm's variables and srun."""
    out = Translation(source="slurm")
    errors = Errors()
    if len(script.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise refuse("file", f"A batch script is at most {MAX_FILE_BYTES // 1024} KiB")
    if "\x00" in script:
        raise refuse("file", "A batch script is text: it must not contain NUL characters")
    first = script.lstrip("\ufeff").split("\n", 1)[0].strip()
    if not first.startswith("#!"):
        raise refuse(
            "line 1",
            "This does not look like a batch script: the first line must start with #! and an interpreter "
            "(#!/bin/bash), as sbatch requires",
        )
    try:
        shebang = shlex.split(first[2:])
    except ValueError:
        shebang = first[2:].split()
    interpreter = shebang[0].rsplit("/", 1)[-1] if shebang else ""
    if interpreter == "env" and len(shebang) > 1:
        interpreter = shebang[1].rsplit("/", 1)[-1]
    if interpreter not in _SHELLS:
        raise refuse(
            "line 1",
            f"{first[:60]!r}: Yardmaster runs batch scripts with a shell (#!/bin/bash or #!/bin/sh); run another "
            "interpreter from the script (python3 train.py)",
        )
    directives = read_directives(script, out, errors)
    seen: dict[str, Directive] = {}
    for d in directives:
        if d.option in seen and seen[d.option].value != d.value:
            out.warnings.append(f"{d.place} overrides {seen[d.option].place}, as sbatch does")
        seen[d.option] = d
    nodes = ntasks_per_node = ntasks = None
    gpus_per_node: tuple[int, str] | None = None
    gpus_total: tuple[int, str] | None = None
    gpus_per_task: tuple[int, str] | None = None
    env: dict[str, str] = {}
    gpu_type_from: tuple[str, str] | None = None
    output = error_file = chdir = None
    job_name = None
    sizes: dict[str, tuple[int, Directive]] = {}  # cpus-per-task, mem-per-gpu, ...: read once the gang is known
    segment: tuple[int, Directive] | None = None  # --segment: read once the node count is known
    whole_node_memory = False  # --mem=0
    pyxis: dict[str, Given] = {}  # --container-image and its kin (slurm_containers.py)
    for option, d in seen.items():
        value = d.value
        if option in PYXIS_HONOURED:
            if value is None:
                errors.add(d.place, "needs a value")
            else:
                pyxis[option] = Given(value, d.place)
            continue
        if option in PYXIS_WARN:
            out.warnings.append(f"{d.place} is ignored: {PYXIS_WARN[option]}")
            continue
        if option in SLURM_REFUSED:
            errors.add(d.place, f"cannot be honoured: {SLURM_REFUSED[option]}")
            continue
        if option in SLURM_WARN:
            out.warnings.append(f"{d.place} is ignored: {SLURM_WARN[option]}")
            continue
        if option not in SLURM_HONOURED:
            out.warnings.append(f"{d.place} is not an sbatch option Yardmaster knows: ignored")
            continue
        if value is None and option != "export":
            errors.add(d.place, "needs a value")
            continue
        assert value is not None or option == "export"
        if option == "job-name":
            job_name = value
            out.set("name", value, d.place)
        elif option == "nodes":
            nodes = positive(d, errors)
        elif option == "ntasks-per-node":
            ntasks_per_node = positive(d, errors)
        elif option == "ntasks":
            ntasks = positive(d, errors)
        elif option in ("gpus-per-node", "gpus", "gpus-per-task", "gres"):
            spec_text = value or ""
            if option == "gres":
                gres = [g for g in spec_text.split(",") if g]
                gpu_gres = [g for g in gres if g.split(":")[0] == "gpu"]
                for other in (g for g in gres if g.split(":")[0] != "gpu"):
                    errors.add(d.place, f"generic resource {other!r} cannot be honoured: Yardmaster allocates GPUs only")
                if len(gpu_gres) != 1:
                    if not gpu_gres:
                        errors.add(d.place, "give gpu:N or gpu:TYPE:N")
                    else:
                        errors.add(d.place, "give one gpu: generic resource")
                    continue
                spec_text = gpu_gres[0]
            parsed = gpu_spec(spec_text, gpu_types)
            if parsed is None or parsed[1] < 1:
                errors.add(d.place, "give a GPU count: N or TYPE:N (for --gres, gpu:N or gpu:TYPE:N)")
                continue
            gpu_type, count = parsed
            if gpu_type is not None:
                gpu_type_from = (gpu_type, d.place)
            if option in ("gpus-per-node", "gres"):
                if gpus_per_node is not None and gpus_per_node[0] != count:
                    errors.add(d.place, f"says {count} GPUs per node but {gpus_per_node[1]} says {gpus_per_node[0]}")
                gpus_per_node = (count, d.place)
            elif option == "gpus":
                gpus_total = (count, d.place)
            else:
                gpus_per_task = (count, d.place)
        elif option == "time":
            seconds = slurm_time(value or "")
            if seconds is None:
                if (value or "").upper() in ("UNLIMITED", "INFINITE"):
                    errors.add(d.place, "an unlimited time cannot be honoured: jobs here have a time limit of at most 30 days")
                else:
                    errors.add(d.place, "a time as sbatch takes it: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
            else:
                out.set("time_limit_s", seconds, d.place)
        elif option == "time-min":
            out.warnings.append(f"{d.place} is ignored: the job runs up to its --time")
        elif option == "partition":
            parts = [p for p in (value or "").split(",") if p]
            if len(parts) != 1:
                errors.add(d.place, "give one partition: Yardmaster's partitions are GPU types")
                continue
            known = known_type(parts[0], gpu_types)
            if known is None:
                kinds = ", ".join(gpu_types) or "none registered yet"
                errors.add(d.place, f"no partition {parts[0]!r}: partitions here are GPU types ({kinds})")
                continue
            if gpu_type_from is not None and gpu_type_from[0].lower() != known.lower():
                errors.add(d.place, f"is {known} but {gpu_type_from[1]} asks for {gpu_type_from[0]}")
            out.set("gpu_type", known, d.place)
        elif option == "qos":
            tier = TIER_WORDS.get((value or "").lower())
            if tier is None:
                errors.add(d.place, "no such QOS: production (tier 1), research (tier 2) or spot (tier 3)")
            else:
                out.set("tier", tier, d.place)
        elif option == "account":
            out.set("team", value, d.place)
        elif option == "output":
            output = (value or "", d)
        elif option == "error":
            error_file = (value or "", d)
        elif option == "chdir":
            chdir = value
        elif option == "export":
            _slurm_export(d, env, out, errors)
        elif option in ("nice", "priority"):
            try:
                number = int(value or "0")
            except ValueError:
                errors.add(d.place, "give a whole number")
                continue
            out.set("priority", -number if option == "nice" else number, d.place)
        elif option in ("cpus-per-task", "cpus-per-gpu"):
            if (cores := positive(d, errors)) is not None:
                sizes[option] = (cores, d)
        elif option == "mem" and re.fullmatch(r"0+[KMGT]?", (value or "").strip(), flags=re.IGNORECASE):
            # Slurm: all of the node's memory. Yardmaster has no whole-node ask: the replica asks for no
            # memory at placement and is held to no memory limit on its node, so it may use all of it.
            whole_node_memory = True
            out.warnings.append(
                f"{d.place} (all of each node's memory): the replicas ask for no memory at placement and have no "
                "memory limit on their nodes, so each may use all of it; other jobs on those nodes may use memory too"
            )
        elif option in ("mem", "mem-per-cpu", "mem-per-gpu"):
            if (mib := slurm_memory_mb(d, errors)) is not None:
                sizes[option] = (mib, d)
        elif option == "switches":
            # --switches=count[@max-time]: one leaf switch, or wait for one (Yardmaster's "required");
            # with a wait bound or more switches allowed, Yardmaster's own weighing ("auto") decides.
            switches, _, bound = (value or "").partition("@")
            if not switches.strip().isdigit() or int(switches) < 1:
                errors.add(d.place, "give a switch count, e.g. --switches=1 (one leaf switch)")
                continue
            if int(switches) == 1 and not bound:
                out.set("leaf_locality", "required", d.place)
            else:
                out.warnings.append(
                    f"{d.place}: a gang waits for one leaf switch only while that costs less than spanning leaves "
                    "(leaf_locality auto, weighed against YARD_SPAN_SLOWDOWN), not for a count or a fixed time"
                )
        elif option == "array":
            # Checked where the API's own field is (scheduling/arrayspec.py), its error located here.
            out.set("array", value, d.place)
        elif option == "segment" and (segment_nodes := positive(d, errors)) is not None:
            segment = (segment_nodes, d)
    if gpu_type_from is not None and "gpu_type" not in out.fields:
        out.set("gpu_type", gpu_type_from[0], gpu_type_from[1])
    # the gang: nodes x GPUs per node, tasks per node started by srun
    if ntasks is not None:
        if nodes is None:
            if ntasks == 1:
                nodes = 1
            else:
                errors.add(
                    f"#SBATCH --ntasks={ntasks}",
                    "without --nodes cannot be honoured: Yardmaster places whole nodes; give --nodes and --ntasks-per-node",
                )
        elif ntasks_per_node is None:
            if ntasks % nodes:
                errors.add(f"#SBATCH --ntasks={ntasks}", f"does not divide evenly over {nodes} nodes: use --ntasks-per-node")
            else:
                ntasks_per_node = ntasks // nodes
        elif ntasks != nodes * ntasks_per_node:
            errors.add(f"#SBATCH --ntasks={ntasks}", f"is not --nodes × --ntasks-per-node ({nodes} × {ntasks_per_node})")
    nodes = nodes or 1
    ntasks_per_node = ntasks_per_node or 1
    if segment is not None:
        # --segment=N: nodes in segments of N inside one block (a multi-node NVLink domain). One segment
        # for the whole gang is Yardmaster's one_fabric; smaller segments cannot be asked for here.
        if segment[0] >= nodes:
            out.set("one_fabric", True, segment[1].place)
        else:
            out.warnings.append(
                f"{segment[1].place}: a gang is kept inside one NVLink fabric domain whole (one_fabric) or not at all, "
                f"not in segments of {segment[0]} nodes; it is placed by the topology search"
            )
    gpus = gpus_per_node[0] if gpus_per_node else None
    if gpus_total is not None:
        if gpus_total[0] % nodes:
            errors.add(gpus_total[1], f"{gpus_total[0]} GPUs do not divide evenly over {nodes} nodes: use --gpus-per-node")
        elif gpus is not None and gpus != gpus_total[0] // nodes:
            errors.add(gpus_total[1], "disagrees with --gpus-per-node")
        gpus = gpus_total[0] // nodes
    if gpus_per_task is not None:
        wanted = gpus_per_task[0] * ntasks_per_node
        if gpus is not None and gpus != wanted:
            errors.add(gpus_per_task[1], f"× {ntasks_per_node} tasks per node is {wanted}, not the {gpus} GPUs per node")
        gpus = wanted
    if gpus is None:
        errors.add("#SBATCH --gpus-per-node", "give the GPUs per node (--gpus-per-node=N or --gres=gpu:N): jobs here use GPUs")
        gpus = 1
    gpu_place = (gpus_per_node or gpus_total or gpus_per_task or (0, "#SBATCH --gpus-per-node"))[1]
    out.set("replicas", nodes, f"#SBATCH --nodes={nodes}")
    out.set("gpus_per_replica", gpus, gpu_place)
    _slurm_sizes(sizes, gpus=gpus, tasks=ntasks_per_node, out=out, errors=errors)
    if nodes > 1:
        out.warnings.append(
            f"the script runs on each of the {nodes} nodes (Slurm runs it on the first and srun fans out): "
            "its srun steps run once per node as in Slurm, but commands outside srun run on every node; "
            'guard first-node-only work with [ "$SLURM_NODEID" = 0 ]'
        )
        # Slurm's --nodes=N is N distinct nodes: each replica on a node of its own, never two on one.
        out.set("one_per_node", True, f"#SBATCH --nodes={nodes}")
    read_pyxis(pyxis, script, out, errors)
    out.warnings.extend(_body_warnings(script))
    errors.raise_any()
    name = job_name or ""
    if not job_name:
        out.set("name", "sbatch", "sbatch's name for a script without --job-name")  # a ?name= default wins
    extra = ""
    if "cpus_per_replica" in out.fields and "cpus-per-task" in sizes:
        extra += f" SLURM_CPUS_PER_TASK={sizes['cpus-per-task'][0]}"
    if "memory_mb_per_replica" in out.fields:
        extra += f" SLURM_MEM_PER_NODE={out.fields['memory_mb_per_replica']}"
    elif whole_node_memory:
        extra += " SLURM_MEM_PER_NODE=0"
    if "gpu_type" in out.fields:
        extra += f" SLURM_JOB_PARTITION={shlex.quote(str(out.fields['gpu_type']))}"
    header = [
        "# Slurm's variables, from Yardmaster's (this job was translated from an sbatch script)",
        'export SLURM_JOB_ID="$YARD_JOB_ID" SLURM_JOBID="$YARD_JOB_ID" SLURM_NNODES="$WORLD_SIZE" '
        'SLURM_JOB_NUM_NODES="$WORLD_SIZE" SLURM_NODEID="$NODE_RANK" SLURM_PROCID="$NODE_RANK" SLURM_LOCALID=0 '
        'SLURM_GPUS_ON_NODE="$YARD_NUM_GPUS" SLURM_SUBMIT_DIR="$PWD" SLURM_RESTART_COUNT=$((YARD_ATTEMPT - 1))',
        f"export SLURM_NTASKS_PER_NODE={ntasks_per_node} SLURM_NTASKS=$(({ntasks_per_node} * WORLD_SIZE)) "
        f'SLURM_NPROCS=$(({ntasks_per_node} * WORLD_SIZE)) SLURM_TASKS_PER_NODE="{ntasks_per_node}(x$WORLD_SIZE)" '
        f'SLURM_JOB_NAME="${{YARD_JOB_NAME:-{_double_quoted(name)}}}" SLURM_GPUS_PER_NODE={gpus}{extra}',
        # The gang's nodes, rank order, in Slurm's compressed form (the agent's YARD_NODELIST); this node alone
        # under an agent that does not send them.
        'export SLURM_JOB_NODELIST="${YARD_NODELIST:-$(hostname -s)}" SLURM_NODELIST="${YARD_NODELIST:-$(hostname -s)}" '
        'SLURMD_NODENAME="$(hostname -s)" SLURM_CLUSTER_NAME=yardmaster',
        # A task of a job array (--array): SLURM_JOB_ID is its own job id, SLURM_ARRAY_JOB_ID its array's.
        'if [ -n "${YARD_ARRAY_JOB_ID:-}" ]; then export SLURM_ARRAY_JOB_ID="$YARD_ARRAY_JOB_ID" '
        'SLURM_ARRAY_TASK_ID="$YARD_ARRAY_TASK_ID" SLURM_ARRAY_TASK_COUNT="$YARD_ARRAY_TASK_COUNT" '
        'SLURM_ARRAY_TASK_MIN="$YARD_ARRAY_TASK_MIN" SLURM_ARRAY_TASK_MAX="$YARD_ARRAY_TASK_MAX" '
        'SLURM_ARRAY_TASK_STEP="$YARD_ARRAY_TASK_STEP"; fi',
        SRUN_SHIM.replace("__WORDS__", SRUN_OPTION_WORDS),
        SCONTROL_SHIM,
    ]
    if chdir:
        header.append(f"cd {shlex.quote(chdir)} || exit 1")
    if output is not None:
        header.append(f'exec > >(tee -a "{_output_path(output[0], output[1], errors)}") 2>&1; _yard_tees="$!"')
    if error_file is not None:
        err = _output_path(error_file[0], error_file[1], errors)
        header.append(f'exec 2> >(tee -a "{err}" >&2); _yard_tees="${{_yard_tees:-}} $!"')
    if output is not None or error_file is not None:
        # The tee processes outlive the script by a moment: the script's end waits for them to write all it
        # said, or a loaded node's agent could find the task over (and its processes gone) with the
        # --output file still short of its last lines.
        header.append("trap '_yard_rc=$?; exec >&- 2>&-; wait $_yard_tees; exit $_yard_rc' EXIT")
    errors.raise_any()
    if env:
        out.set("env", env, "#SBATCH --export")
    out.set("command", "\n".join(header) + "\n# ---- the batch script\n" + script, "the script")
    return out


def _double_quoted(text: str) -> str:
    """``text`` for inside a double-quoted shell word: nothing in it is expanded."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text)


# Lines of a batch script that need something on the nodes Yardmaster does not provide.
_BODY_NEEDS = (
    (re.compile(r"^(module|ml)\s+(load|add|use|swap|purge|restore)\b"), "environment modules (module load) must be "
     "installed on the nodes, with these modules; where they are not, this line fails and the script goes on without them"),
    (re.compile(r"^(conda|mamba)\s+activate\b|^(source|\.)\s+activate\b"), "conda and this environment must exist "
     "on every node (the job runs in its nodes' environment)"),
    (re.compile(r"^(source|\.)\s+\S"), "this file must exist on every node; a relative path is read from the job's "
     "working directory ($SLURM_SUBMIT_DIR), not from where it was submitted"),
    (re.compile(r"\bsrun\b.*(\s-w\s*\S|\s--nodelist[=\s])"), "srun -w NODE runs the step on the node running the "
     "script (every node runs it here); only `srun -w NODE hostname [-i|-s]` answers for NODE"),
    (re.compile(r"^(sbatch|squeue|scancel|sacct|salloc|sinfo)\b|\$\((sbatch|squeue|scancel|sacct|salloc|sinfo)\b"),
     "Slurm's other commands do not exist here (only srun and scontrol show hostnames/job do): use yard"),
)  # fmt: skip


# An absolute path to a program or data file the script names (not one of the system's own directories).
_ABSOLUTE_FILE = re.compile(
    r"(?<![\w$}/.-])(/(?!(?:usr|bin|sbin|etc|dev|proc|sys|tmp|lib|lib64|opt/conda)/)[\w.+-]+(?:/[\w.+-]+)*"
    r"\.(?:py|sh|bash|yaml|yml|json|toml|cfg|ini|txt|csv|ckpt|pt|pth|safetensors))(?![\w/])"
)


def _body_warnings(script: str) -> list[str]:
    """What the script's own commands need that Yardmaster's nodes may lack, said at submit."""
    found: list[str] = []
    paths: list[str] = []
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for pattern, why in _BODY_NEEDS:
            if pattern.search(line):
                found.append(f"line {number}: {line[:60]!r}: {why}")
                break
        for path in _ABSOLUTE_FILE.findall(line):
            if path not in paths:
                paths.append(path)
                found.append(f"line {number}: {path} must exist on every node: the job runs on its nodes' file systems")
    return found


def _slurm_sizes(sizes: dict[str, tuple[int, Directive]], *, gpus: int, tasks: int, out: Translation, errors: Errors) -> None:
    """Cores and memory per node (a Yardmaster replica is one node's share of the gang), as sbatch counts them."""
    if "cpus-per-task" in sizes and "cpus-per-gpu" in sizes:
        errors.add(sizes["cpus-per-gpu"][1].place, "give --cpus-per-task or --cpus-per-gpu, not both")
    cpus: int | None = None
    if "cpus-per-task" in sizes:
        cpus = sizes["cpus-per-task"][0] * tasks
        out.set("cpus_per_replica", cpus, sizes["cpus-per-task"][1].place)
    elif "cpus-per-gpu" in sizes:
        cpus = sizes["cpus-per-gpu"][0] * gpus
        out.set("cpus_per_replica", cpus, sizes["cpus-per-gpu"][1].place)
    memory = [option for option in ("mem", "mem-per-cpu", "mem-per-gpu") if option in sizes]
    if len(memory) > 1:
        errors.add(sizes[memory[1]][1].place, "give one of --mem, --mem-per-cpu and --mem-per-gpu, as sbatch wants")
    elif memory:
        size, d = sizes[memory[0]]
        if memory[0] == "mem-per-cpu" and cpus is None:
            errors.add(d.place, "needs --cpus-per-task or --cpus-per-gpu: the cores it is per")
            return
        factor = {"mem": 1, "mem-per-gpu": gpus, "mem-per-cpu": cpus or 1}[memory[0]]
        out.set("memory_mb_per_replica", size * factor, d.place)


def _output_path(pattern: str, d: Directive, errors: Errors) -> str:
    """--output's file name with sbatch's replacement symbols, as a double-quoted shell word."""
    pieces: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "%":
            wide = _WIDTH.match(pattern, i)
            if wide is not None and f"%{wide.group(2)}" in _NUMERIC_PATTERNS:
                pieces.append(f'$(printf %0{int(wide.group(1))}d "{_NUMERIC_PATTERNS["%" + wide.group(2)]}")')
                i = wide.end()
                continue
            symbol = pattern[i : i + 2]
            if symbol in _OUTPUT_PATTERNS:
                pieces.append(_OUTPUT_PATTERNS[symbol])
            else:
                errors.add(d.place, f"{symbol!r} is not a file-name symbol Yardmaster fills (%j, %A, %a, %x, %u, %N, %n, %t, %%)")
            i += 2
            continue
        char = pattern[i]
        pieces.append("\\" + char if char in '"$`\\' else char)
        i += 1
    return "".join(pieces)


def _slurm_export(d: Directive, env: dict[str, str], out: Translation, errors: Errors) -> None:
    value = d.value or "ALL"
    for item in value.split(","):
        if item in ("ALL", "NIL"):
            out.warnings.append(f"{d.place}: the submitting shell's variables are not sent; give them as --export=NAME=value")
        elif item == "NONE":
            continue
        elif "=" in item:
            key, _, val = item.partition("=")
            if not ENV_NAME.match(key):
                errors.add(d.place, f"{key!r} is not a variable name")
            else:
                env[key] = val
        else:
            errors.add(d.place, f"{item}: the submitting shell's variables are not sent; give {item}=value")
