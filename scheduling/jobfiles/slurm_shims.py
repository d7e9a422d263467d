"""The shell functions a translated batch script runs with: srun and scontrol, as far as a script needs them
without Slurm (the agent's variables stand for Slurm's)."""

from __future__ import annotations

from scheduling.jobfiles.slurm_containers import SRUN_VALUE_OPTIONS

SRUN_OPTION_WORDS = " ".join(
    sorted(
        {"-n", "-N", "-c", "-G", "-J", "-o", "-e", "-p", "-t", "-w", "-x", "-m", "-D", "--ntasks", "--nodes",
         "--cpus-per-task", "--gpus", "--gres", "--gpus-per-task", "--ntasks-per-node", "--mpi", "--cpu-bind",
         "--export", "--job-name", "--output", "--error", "--partition", "--time", "--chdir", "--distribution",
         "--gpus-per-node", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--nodelist", "--exclude", "--label",
         *SRUN_VALUE_OPTIONS} - {"--label"}
    )
)  # fmt: skip

# srun inside the script: the step runs on this node, --ntasks-per-node copies of it, each with its own
# SLURM_PROCID and SLURM_LOCALID (Yardmaster starts the script on every node; Slurm's srun would fan out
# from the first). As Slurm's srun, it forwards the tasks' output whole lines at a time (sed -u: one write
# per line, so two tasks never splice their lines together), prefixed with the task's rank under
# --label/-l. srun's other options are dropped: the step gets the job's shape. `srun -w NODE hostname
# [-i|-I|-s]`, how scripts ask for the head node's address, answers for NODE (from YARD_NODE_ADDRS).
SRUN_SHIM = r"""_srun_lines() {
  if [ "$1" -eq 1 ]; then sed -u "s/^/$2: /"; else sed -u ""; fi
}
srun() {
  local label=0 target=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; break ;;
      --label|-l) label=1; shift ;;
      -w|--nodelist) target=$2; shift 2 ;;
      --nodelist=*) target=${1#--nodelist=}; shift ;;
      -w?*) target=${1#-w}; shift ;;
      --*=*) shift ;;
      --*|-?) case " __WORDS__ " in *" $1 "*) shift 2 ;; *) shift ;; esac ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  if [ -n "$target" ] && [ "$1" = hostname ]; then
    target=$(_yard_hostlist_expand "$target" | head -n 1)
    case "$2" in
      -i|--ip-address|-I|--all-ip-addresses) _yard_node_addr "$target" ;;
      -s|--short) printf '%s\n' "${target%%.*}" ;;
      *) printf '%s\n' "$target" ;;
    esac
    return 0
  fi
  if [ "$SLURM_NTASKS_PER_NODE" -le 1 ] && [ "$label" -eq 0 ]; then
    SLURM_LOCALID=0 SLURM_PROCID="$SLURM_NODEID" "$@"
    return $?
  fi
  local i=0 pids="" rc=0 pid rank codes s
  codes=$(mktemp -d) || return 1
  while [ "$i" -lt "$SLURM_NTASKS_PER_NODE" ]; do
    rank=$((SLURM_NODEID * SLURM_NTASKS_PER_NODE + i))
    { SLURM_LOCALID=$i SLURM_PROCID=$rank "$@"; echo $? > "$codes/$i"; } | _srun_lines "$label" "$rank" &
    pids="$pids $!"; i=$((i + 1))
  done
  for pid in $pids; do wait "$pid"; done
  i=0
  while [ "$i" -lt "$SLURM_NTASKS_PER_NODE" ]; do
    s=$(cat "$codes/$i" 2>/dev/null || echo 1); [ "$rc" -eq 0 ] && rc=$s; i=$((i + 1))
  done
  rm -rf "$codes"
  return "$rc"
}"""

# scontrol inside the script: `show hostnames [LIST]` (Slurm's compressed host list, by default
# SLURM_JOB_NODELIST, one name a line; a name that does not resolve here is given as the address the
# portal has for that node, so `scontrol show hostnames | head -n 1` is always a usable rendezvous host)
# and `show job [ID]` (this job, Slurm's key=value form, from the variables). Nothing else of scontrol.
SCONTROL_SHIM = r"""_yard_hostlist_expand() {
  local list="$1" depth=0 cur="" c i
  for ((i = 0; i < ${#list}; i++)); do
    c=${list:i:1}
    case "$c" in
      "[") depth=$((depth + 1)); cur+=$c ;;
      "]") depth=$((depth - 1)); cur+=$c ;;
      ",") if [ "$depth" -eq 0 ]; then [ -n "$cur" ] && _yard_host_expand "$cur"; cur=""; else cur+=$c; fi ;;
      *) cur+=$c ;;
    esac
  done
  [ -n "$cur" ] && _yard_host_expand "$cur"
  return 0
}
_yard_host_expand() {
  case "$1" in *"["*"]"*) ;; *) printf '%s\n' "$1"; return 0 ;; esac
  local pre=${1%%"["*} rest=${1#*"["} ranges post r lo hi n
  ranges=${rest%%"]"*}; post=${rest#*"]"}
  for r in ${ranges//,/ }; do
    lo=${r%%-*}; hi=${r#*-}
    for ((n = 10#$lo; n <= 10#$hi; n++)); do _yard_host_expand "$pre$(printf "%0${#lo}d" "$n")$post"; done
  done
}
_yard_node_addr() {
  local pair
  for pair in $YARD_NODE_ADDRS; do
    if [ "${pair%%=*}" = "$1" ]; then printf '%s\n' "${pair#*=}"; return 0; fi
  done
  printf '%s\n' "$1"
}
scontrol() {
  local name list
  case "$1 $2" in
    "show hostnames"|"show hostname")
      list=$(IFS=,; echo "${*:3}")
      for name in $(_yard_hostlist_expand "${list:-$SLURM_JOB_NODELIST}"); do
        if getent hosts "$name" > /dev/null 2>&1; then printf '%s\n' "$name"; else _yard_node_addr "$name"; fi
      done ;;
    "show job"|"show jobs"|"show jobid")
      printf 'JobId=%s JobName=%s\n   UserId=%s JobState=RUNNING Restarts=%s\n' \
        "$SLURM_JOB_ID" "$SLURM_JOB_NAME" "${USER:-$(id -un)}" "$SLURM_RESTART_COUNT"
      printf '   NumNodes=%s NumTasks=%s CPUs/Task=%s\n   TRES=gres/gpu=%s\n   NodeList=%s\n   WorkDir=%s\n' \
        "$SLURM_NNODES" "$SLURM_NTASKS" "${SLURM_CPUS_PER_TASK:-1}" "$((SLURM_GPUS_ON_NODE * SLURM_NNODES))" \
        "$SLURM_JOB_NODELIST" "$SLURM_SUBMIT_DIR" ;;
    *)
      echo "scontrol: Yardmaster runs this batch script without Slurm: only 'scontrol show hostnames [LIST]'" \
        "and 'scontrol show job' work here" >&2
      return 1 ;;
  esac
}
export -f _srun_lines srun _yard_hostlist_expand _yard_host_expand _yard_node_addr scontrol"""
