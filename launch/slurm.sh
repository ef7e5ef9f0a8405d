#!/usr/bin/env bash
# Run bert_jax on a SLURM GPU cluster: writes an sbatch script that starts one driver process per GPU (or per
# node) with srun, and submits it. Every process runs the same command; jax.distributed finds the others.
#
#   launch/slurm.sh --nodes 2 --gpus-per-node 8 --partition gpu --time 24:00:00 \
#       --workdir /shared/runs/bert-base --venv /shared/venvs/bert_jax \
#       -- --config=configs/pretrain.py:size=base,data=tfrecord --config.data.input_files='/shared/data/train-*'
#
# Run with --help for the options; --dry-run prints the sbatch script and command instead of submitting.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prog=$(basename "$0")
repo_default=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  cat <<EOF
Usage: ${prog} --nodes N --gpus-per-node G --workdir DIR [options] -- DRIVER_FLAGS...

Writes and submits an sbatch job that runs, on every node,
  srun python -m bert_jax.main --workdir=DIR DRIVER_FLAGS...
The job is requeueable: SLURM sends SIGTERM 120 s before the time limit (the driver saves a checkpoint and
exits), the job requeues itself, and the next start resumes from DIR's latest checkpoint; so does a job that
SLURM requeues after a preemption or a node failure, or the same command submitted again.

Options:
  --nodes N              Number of nodes.                                                      (required)
  --gpus-per-node G      GPUs per node.                                                        (required)
  --per gpu|node         One process per GPU (default), or one per node driving all its GPUs.
  --partition P          SLURM partition (default: the cluster's).
  --time T               Time limit, e.g. 24:00:00 (default: the partition's).
  --account A            Account to charge (default: yours).
  --job-name NAME        Job name (default: bert_jax).
  --cpus-per-task N      CPUs per process (default: the cluster's, often 1; the input pipeline wants more).
  --sbatch-option OPT    Extra '#SBATCH OPT' line, e.g. --sbatch-option=--constraint=h100 (repeatable).
  --workdir DIR          Checkpoints and logs: a filesystem shared by all nodes, or gs://.  (required)
  --venv DIR             Virtual environment to activate on the nodes (with bert_jax installed:
                         pip install -e '.[cuda]'). Default: whatever python is on PATH there.
  --repo DIR             Source tree the job runs in (default: ${repo_default}); must be on a shared filesystem.
  --log-dir DIR          sbatch script and job output (default: REPO/logs/slurm).
  --dry-run              Print the sbatch script and the sbatch command; write and submit nothing.
  -h, --help             This help.
Everything after -- is passed to the driver (the driver's --workdir comes from --workdir).
EOF
}


# Makes a local path absolute (the job runs elsewhere, in --repo); URLs such as gs:// stay as they are.
absolute() {
  if [[ "$1" == /* || "$1" == *://* ]]; then echo "$1"; else echo "${PWD}/$1"; fi
}

nodes="" gpus_per_node="" per="gpu" partition="" time_limit="" account="" job_name="bert_jax" cpus_per_task=""
workdir="" venv="" repo="${repo_default}" log_dir="" dry_run=0
extra_sbatch=()
driver_args=()
while [[ $# -gt 0 ]]; do
  # Accept --opt=value as well as --opt value.
  if [[ "$1" == --*=* ]]; then
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case "$1" in
    --nodes) need_value "$@"; nodes=$2; shift 2 ;;
    --gpus-per-node) need_value "$@"; gpus_per_node=$2; shift 2 ;;
    --per) need_value "$@"; per=$2; shift 2 ;;
    --partition) need_value "$@"; partition=$2; shift 2 ;;
    --time) need_value "$@"; time_limit=$2; shift 2 ;;
    --account) need_value "$@"; account=$2; shift 2 ;;
    --job-name) need_value "$@"; job_name=$2; shift 2 ;;
    --cpus-per-task) need_value "$@"; cpus_per_task=$2; shift 2 ;;
    --sbatch-option)
      # The value is itself an option (--constraint=h100), so need_value's check does not apply.
      [[ $# -ge 2 && -n "$2" ]] || die "--sbatch-option needs a value"
      extra_sbatch+=("$2"); shift 2 ;;
    --workdir) need_value "$@"; workdir=$2; shift 2 ;;
    --venv) need_value "$@"; venv=$2; shift 2 ;;
    --repo) need_value "$@"; repo=$2; shift 2 ;;
    --log-dir) need_value "$@"; log_dir=$2; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; driver_args=("$@"); break ;;
    *) die "unknown option '$1' (driver flags go after --)" ;;
  esac
done

[[ -n "${nodes}" ]] || die "--nodes is required"
[[ -n "${gpus_per_node}" ]] || die "--gpus-per-node is required"
[[ -n "${workdir}" ]] || die "--workdir is required (a shared directory or gs://)"
[[ "${nodes}" =~ ^[1-9][0-9]*$ ]] || die "--nodes '${nodes}' is not a positive integer"
[[ "${gpus_per_node}" =~ ^[1-9][0-9]*$ ]] || die "--gpus-per-node '${gpus_per_node}' is not a positive integer"
[[ -z "${cpus_per_task}" || "${cpus_per_task}" =~ ^[1-9][0-9]*$ ]] \
  || die "--cpus-per-task '${cpus_per_task}' is not a positive integer"
[[ "${per}" == gpu || "${per}" == node ]] || die "--per must be gpu or node, not '${per}'"
[[ -d "${repo}" ]] || die "--repo '${repo}' is not a directory"
for arg in "${driver_args[@]}"; do
  if [[ "${arg}" == --workdir || "${arg}" == --workdir=* ]]; then
    die "pass the workdir as ${prog}'s --workdir, not after -- (it is added to the driver command)"
  fi
done
repo=$(cd "${repo}" && pwd)
workdir=$(absolute "${workdir}")
[[ -n "${venv}" ]] && venv=$(absolute "${venv}")
log_dir=$(absolute "${log_dir:-${repo}/logs/slurm}")
# #SBATCH lines are not shell: their values cannot be quoted, so they must not contain spaces.
for value in "${job_name}" "${partition}" "${time_limit}" "${account}" "${repo}" "${log_dir}" "${extra_sbatch[@]}"; do
  [[ "${value}" != *[[:space:]]* ]] || die "'${value}' contains white space, which an #SBATCH line cannot hold"
done

# --- the sbatch script ------------------------------------------------------------------------------------
sbatch_lines=("--job-name=${job_name}" "--nodes=${nodes}")
if [[ "${per}" == gpu ]]; then
  # One task per GPU, and every task sees all GPUs of its node: JAX's SLURM detection then gives task i
  # (SLURM_LOCALID) GPU i. (--gpus-per-task=1 would leave each task only one visible GPU, device 0, and
  # every task but the first would ask for a device it cannot see.)
  sbatch_lines+=("--ntasks-per-node=${gpus_per_node}" "--gpus-per-node=${gpus_per_node}")
  layout="one process per GPU"
else
  sbatch_lines+=("--ntasks-per-node=1" "--gpus-per-node=${gpus_per_node}")
  layout="one process per node"
fi
[[ -n "${cpus_per_task}" ]] && sbatch_lines+=("--cpus-per-task=${cpus_per_task}")
[[ -n "${partition}" ]] && sbatch_lines+=("--partition=${partition}")
[[ -n "${time_limit}" ]] && sbatch_lines+=("--time=${time_limit}")
[[ -n "${account}" ]] && sbatch_lines+=("--account=${account}")
sbatch_lines+=(
  "--chdir=${repo}"
  "--output=${log_dir}/%x-%j.out"
  # A requeued job writes to the same file: keep the earlier part.
  "--open-mode=append"
  # Requeue after a node failure or preemption instead of failing; the next start resumes from the workdir.
  "--requeue"
  # SIGTERM to the srun tasks (not B:, the batch shell) 120 s before the time limit: the driver saves a
  # checkpoint and exits 0, and the end of this script requeues the job.
  "--signal=TERM@120"
  "${extra_sbatch[@]}"
)

driver=(python -m bert_jax.main --workdir="${workdir}" "${driver_args[@]}")
if [[ "${per}" == gpu ]]; then
  srun_line="srun --kill-on-bad-exit=1 $(quote "${driver[@]}")"
else
  # JAX's SLURM detection would give each process only GPU SLURM_LOCALID (here always 0). Without
  # SLURM_LOCALID it leaves the GPUs alone, so the coordinator, process count and id are passed explicitly
  # (the port is the one JAX would pick). SLURM_PROCID differs per task, hence bash -c.
  srun_line="srun --kill-on-bad-exit=1 bash -c 'exec env -u SLURM_LOCALID \"\$@\" --process_id=\"\${SLURM_PROCID}\"' \
bert_jax $(quote "${driver[@]}") --coordinator_address=\"\${coordinator}\" --num_processes=${nodes}"
fi

script() {
  echo "#!/bin/bash"
  echo "# bert_jax on ${nodes} node(s) x ${gpus_per_node} GPU(s), ${layout}. Written by launch/${prog}."
  printf '#SBATCH %s\n' "${sbatch_lines[@]}"
  echo "set -euo pipefail"
  if [[ -n "${venv}" ]]; then
    # (activate may read unset variables, hence set +u around it)
    cat <<EOF
set +u
# The activate script exists only on the cluster:
# shellcheck disable=SC1091
source $(quote "${venv}/bin/activate")
set -u
EOF
  fi
  cat <<'EOF'
export PYTHONUNBUFFERED=1  # log lines reach the output file as they happen
echo "bert_jax: job ${SLURM_JOB_ID} (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST}"
EOF
  if [[ "${per}" == node ]]; then
    cat <<'EOF'
# (No '| head -n 1': with pipefail, scontrol's SIGPIPE would fail the job.)
head_node=$(scontrol show hostnames "${SLURM_JOB_NODELIST}")
head_node=${head_node%%$'\n'*}
coordinator="${head_node}:$(( 61440 + SLURM_JOB_ID % 4096 ))"
EOF
  fi
  echo "status=0"
  if [[ "${per}" == node ]]; then
    echo "# \$@ and SLURM_PROCID expand in each task's bash:"
    echo "# shellcheck disable=SC2016"
  fi
  echo "${srun_line} || status=\$?"
  cat <<'EOF'
# Seconds left before the time limit (squeue prints [D-][H:]M:SS), or nothing if there is no limit.
seconds_left() {
  local left
  left=$(squeue -h -j "${SLURM_JOB_ID}" -o %L 2>/dev/null) || return 0
  if [[ "${left}" =~ ^(([0-9]+)-)?(([0-9]+):)?([0-9]+):([0-9]+)$ ]]; then
    echo $(( ((10#${BASH_REMATCH[2]:-0} * 24 + 10#${BASH_REMATCH[4]:-0}) * 60 + 10#${BASH_REMATCH[5]}) * 60 \
      + 10#${BASH_REMATCH[6]} ))
  fi
}
# A clean exit this close to the time limit is the SIGTERM stop, not the end of training: requeue, and the
# next start resumes from the latest checkpoint. (Had training just finished, the next start ends at once.)
left=$(seconds_left)
if [[ "${status}" -eq 0 && -n "${left}" && "${left}" -le 300 ]]; then
  echo "bert_jax: stopped for the time limit (${left} s left); requeueing job ${SLURM_JOB_ID}"
  scontrol requeue "${SLURM_JOB_ID}"
fi
exit "${status}"
EOF
}

timestamp=$(date +%Y%m%d-%H%M%S)
script_file="${log_dir}/${job_name}-${timestamp}.sbatch"
submit=(sbatch --parsable "${script_file}")

if (( dry_run )); then
  script
  echo "# ---- sbatch command (--dry-run: nothing written or submitted) ----"
  quote "${submit[@]}"
  exit 0
fi

command -v sbatch >/dev/null || die "sbatch is not on PATH (run this on the cluster's login node, or use --dry-run)"
if [[ -n "${venv}" && ! -f "${venv}/bin/activate" ]]; then
  die "--venv '${venv}': no bin/activate there"
fi
mkdir -p "${log_dir}"
script > "${script_file}"
echo "[${prog}] + $(quote "${submit[@]}")" >&2
job_id=$("${submit[@]}")
echo "[${prog}] submitted job ${job_id%%;*}: script ${script_file}, output ${log_dir}/${job_name}-${job_id%%;*}.out" >&2
echo "${job_id%%;*}"
