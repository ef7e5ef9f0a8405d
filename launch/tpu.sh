#!/usr/bin/env bash
# Run bert_jax on a Cloud TPU VM or pod slice: create the TPU (directly or as a queued resource), copy this
# source tree to every worker, install it, and run the same driver command on all workers at once (on a pod
# slice jax.distributed finds the other hosts itself). Logs stream here and are kept in a local log file.
#
#   launch/tpu.sh --name NAME --zone ZONE --accelerator-type TYPE --workdir gs://BUCKET/RUN [options] \
#       -- DRIVER_FLAGS...
#
# With --num-slices N (and --queued) it creates N such slices as one multi-slice queued resource (nodes NAME-0 ..
# NAME-{N-1}, joined by the data-centre network), gives each worker the MEGASCALE_* environment that makes them one
# JAX job, and runs the driver with --config.mesh.dcn_data=N (data parallelism across the slices).
#
# Example (a v5e-16 slice: 4 hosts of 4 chips):
#   launch/tpu.sh --name bert-base --zone us-west4-a --accelerator-type v5litepod-16 --queued --spot --reuse \
#       --workdir gs://my-bucket/bert-base -- --config=configs/pretrain.py:size=base,data=tfrecord \
#       --config.data.input_files='gs://my-bucket/data/train-*.tfrecord'
#
# Run with --help for the options; --dry-run prints the commands instead of running them.
set -euo pipefail
# shellcheck source=launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

prog=$(basename "$0")
repo_default=$(cd "$(dirname "$0")/.." && pwd)
# Seconds between queued-resource state checks; a variable so the tests need not wait.
poll_seconds=${BERT_JAX_POLL_SECONDS:-30}

usage() {
  cat <<EOF
Usage: ${prog} --name NAME --zone ZONE --accelerator-type TYPE --workdir gs://BUCKET/RUN [options] -- DRIVER_FLAGS...

Creates (or reuses) a Cloud TPU, installs this repository on every worker and runs
  python -m bert_jax.main --workdir=WORKDIR DRIVER_FLAGS...
on all workers. Re-running the same command after a preemption resumes from WORKDIR's latest checkpoint.

Options:
  --name NAME               TPU name (also the queued-resource id with --queued).         (required)
  --zone ZONE               e.g. us-west4-a.                                             (required)
  --project PROJECT         Google Cloud project (default: gcloud's configured project).
  --accelerator-type TYPE   e.g. v5litepod-16, v4-32, v5p-128, v6e-16.                    (required)
  --runtime-version VER     TPU software version (default by generation: v5litepod -> v2-alpha-tpuv5-lite,
                            v5p -> v2-alpha-tpuv5, v6e -> v2-alpha-tpuv6e, v2/v3/v4 -> tpu-ubuntu2204-base).
  --queued                  Create through 'queued-resources create' and wait until it is ACTIVE.
  --num-slices N            N slices of TYPE as one multi-slice job (needs --queued; nodes NAME-0 .. NAME-{N-1});
                            the driver gets --config.mesh.dcn_data=N. Default 1.
  --spot                    Spot capacity (can be preempted; cheaper).
  --preemptible             Preemptible TPU (older kind of --spot; not with --queued).
  --reuse                   Use the TPU if it already exists and is READY (a preempted or suspended one is
                            deleted and created again). Without it an existing TPU is an error.
  --workdir PATH            Checkpoints and logs; must be gs:// (each TPU VM has only its own disk).  (required)
  --allow-local-workdir     Accept a non-gs:// --workdir (only for a filesystem mounted on every worker).
  --repo DIR                Source tree to copy (default: ${repo_default}).
  --log-dir DIR             Where the local copy of the log goes (default: logs).
  --delete                  Delete the TPU (or queued resource) at the end, also when something fails.
  --dry-run                 Print every command, one per line, and run nothing.
  -h, --help                This help.
Everything after -- is passed to the driver (the driver's --workdir comes from --workdir).
EOF
}

# For failures after the options were accepted (no pointer to --help then).
fail() {
  echo "${prog}: error: $*" >&2
  exit 1
}

log() { echo "[${prog}] $*" >&2; }


# Joins the lines of stdin (each ending in ';', 'then', 'do', '{' ...) into one line, so that every printed
# command fits on one line and the remote shell gets the same text.
one_line() {
  local line text=""
  while IFS= read -r line; do
    line=${line#"${line%%[![:space:]]*}"}
    text+="${line} "
  done
  echo "${text% }"
}

name="" zone="" project="" accelerator_type="" runtime_version="" workdir="" repo="${repo_default}"
log_dir="logs"
num_slices=1 queued=0 spot=0 preemptible=0 reuse=0 allow_local_workdir=0 delete_at_end=0 dry_run=0
driver_args=()
while [[ $# -gt 0 ]]; do
  # Accept --opt=value as well as --opt value.
  if [[ "$1" == --*=* ]]; then
    set -- "${1%%=*}" "${1#*=}" "${@:2}"
  fi
  case "$1" in
    --name) need_value "$@"; name=$2; shift 2 ;;
    --zone) need_value "$@"; zone=$2; shift 2 ;;
    --project) need_value "$@"; project=$2; shift 2 ;;
    --accelerator-type) need_value "$@"; accelerator_type=$2; shift 2 ;;
    --runtime-version) need_value "$@"; runtime_version=$2; shift 2 ;;
    --workdir) need_value "$@"; workdir=$2; shift 2 ;;
    --repo) need_value "$@"; repo=$2; shift 2 ;;
    --log-dir) need_value "$@"; log_dir=$2; shift 2 ;;
    --queued) queued=1; shift ;;
    --num-slices) need_value "$@"; num_slices=$2; shift 2 ;;
    --spot) spot=1; shift ;;
    --preemptible) preemptible=1; shift ;;
    --reuse) reuse=1; shift ;;
    --allow-local-workdir) allow_local_workdir=1; shift ;;
    --delete) delete_at_end=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; driver_args=("$@"); break ;;
    *) die "unknown option '$1' (driver flags go after --)" ;;
  esac
done

[[ -n "${name}" ]] || die "--name is required"
[[ -n "${zone}" ]] || die "--zone is required"
[[ -n "${accelerator_type}" ]] || die "--accelerator-type is required (e.g. v5litepod-16)"
[[ -n "${workdir}" ]] || die "--workdir is required (a gs:// path)"
# The name also names local files (log, tarball); gcloud allows only this form anyway.
[[ "${name}" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ ]] \
  || die "--name '${name}': use lower-case letters, digits and hyphens, starting with a letter"
(( spot && preemptible )) && die "--spot and --preemptible exclude each other"
(( queued && preemptible )) && die "--preemptible is not available with --queued; use --spot"
[[ -d "${repo}" ]] || die "--repo '${repo}' is not a directory"
[[ "${num_slices}" =~ ^[1-9][0-9]*$ ]] || die "--num-slices '${num_slices}': must be a positive number of slices"
if (( num_slices > 1 )); then
  (( queued )) || die "--num-slices ${num_slices}: multi-slice TPUs are made as queued resources; add --queued"
  for arg in "${driver_args[@]}"; do
    if [[ "${arg}" == --config.mesh.dcn_data=* && "${arg}" != "--config.mesh.dcn_data=${num_slices}" ]]; then
      die "${arg} after -- disagrees with --num-slices ${num_slices}; drop it (it is set from --num-slices)"
    fi
  done
fi
for arg in "${driver_args[@]}"; do
  if [[ "${arg}" == --workdir || "${arg}" == --workdir=* ]]; then
    die "pass the workdir as ${prog}'s --workdir, not after -- (it is added to the driver command)"
  fi
done

generation=${accelerator_type%-*}
size=${accelerator_type##*-}
[[ "${size}" =~ ^[0-9]+$ && "${generation}" != "${accelerator_type}" ]] \
  || die "--accelerator-type '${accelerator_type}': expected GENERATION-SIZE, e.g. v5litepod-16 or v4-32"

if [[ -z "${runtime_version}" ]]; then
  case "${generation}" in
    v5litepod) runtime_version=v2-alpha-tpuv5-lite ;;
    v5p) runtime_version=v2-alpha-tpuv5 ;;
    v6e) runtime_version=v2-alpha-tpuv6e ;;
    v2|v3|v4) runtime_version=tpu-ubuntu2204-base ;;
    *) die "no default runtime for --accelerator-type '${accelerator_type}'; pass --runtime-version" ;;
  esac
fi

# Hosts (TPU VMs) in the slice: v5e/v6e sizes count chips (8 on one host, else 4 per host); v2-v5p sizes
# count TensorCores (8 per host). 0 = unknown generation.
case "${generation}" in
  v5litepod|v6e) hosts=$(( size <= 8 ? 1 : size / 4 )) ;;
  v2|v3|v4|v5p) hosts=$(( size <= 8 ? 1 : size / 8 )) ;;
  *) hosts=0 ;;
esac

if [[ "${workdir}" != gs://* ]] && (( ! allow_local_workdir )); then
  if (( hosts != 1 || num_slices > 1 )); then
    die "--workdir '${workdir}' must be a gs:// path: each of the ${hosts/#0/several} hosts of a \
${accelerator_type} slice has its own disk, so checkpoints would be split across them and the run could not \
resume. (--allow-local-workdir accepts it for a filesystem mounted on every worker, e.g. Filestore.)"
  fi
  die "--workdir '${workdir}' must be a gs:// path: a directory on the TPU VM's disk is lost when the TPU is \
preempted or deleted, and with it the checkpoints to resume from. (--allow-local-workdir accepts it anyway.)"
fi

# --- the commands -----------------------------------------------------------------------------------------
scope=(--zone="${zone}")
[[ -n "${project}" ]] && scope+=(--project="${project}")
capacity=()
(( spot )) && capacity=(--spot)
(( preemptible )) && capacity=(--preemptible)

# The TPU VMs: NAME, or NAME-0 .. NAME-{N-1} for N slices (the queued resource's node prefix is NAME).
nodes=("${name}")
if (( num_slices > 1 )); then
  nodes=()
  for (( slice = 0; slice < num_slices; slice++ )); do nodes+=("${name}-${slice}"); done
fi
describe_node=(gcloud compute tpus tpu-vm describe "${nodes[0]}" "${scope[@]}" "--format=value(state)")
describe_queued=(gcloud compute tpus queued-resources describe "${name}" "${scope[@]}" "--format=value(state.state)")
# tpu-vm create calls the runtime --version; queued-resources create calls it --runtime-version.
create_node=(gcloud compute tpus tpu-vm create "${name}" "${scope[@]}" --accelerator-type="${accelerator_type}"
  --version="${runtime_version}" "${capacity[@]}")
node_spec=(--node-id="${name}")
(( num_slices > 1 )) && node_spec=(--node-count="${num_slices}" --node-prefix="${name}")
create_queued=(gcloud compute tpus queued-resources create "${name}" "${node_spec[@]}" "${scope[@]}"
  --accelerator-type="${accelerator_type}" --runtime-version="${runtime_version}" "${capacity[@]}")
delete_node=(gcloud compute tpus tpu-vm delete "${name}" "${scope[@]}" --quiet)
# --force also deletes the TPU the queued resource holds.
delete_queued=(gcloud compute tpus queued-resources delete "${name}" "${scope[@]}" --force --quiet)

tarball="${TMPDIR:-/tmp}/bert_jax-${name}.tar.gz"
# The working tree (uncommitted edits included), without what is local to this machine.
make_tarball=(tar -czf "${tarball}" --exclude=.git --exclude=__pycache__ --exclude='*.egg-info'
  --exclude=.pytest_cache --exclude=./.venv --exclude=./venv --exclude=./build --exclude=./dist
  --exclude='./workdir*' --exclude=./logs -C "${repo}" .)
copy_to() { copy_command=(gcloud compute tpus tpu-vm scp "${tarball}" "$1:bert_jax.tar.gz" "${scope[@]}" --worker=all); }

# On each worker: stop a run a previous launch left behind (a lost ssh connection does not stop it, and it
# holds the TPU chips; after 2 minutes it is killed, since a process whose peer hosts are gone can hang in a
# collective), unpack, and install into ~/bert_jax_venv. A venv with Python >= 3.11 because the TPU
# images' system Python is 3.10, older than bert_jax (and JAX) support.
remote_install=$(one_line <<'EOF'
set -e;
p=$(cat ~/bert_jax.pid 2>/dev/null || true);
if [ -n "$p" ] && grep -qa bert_jax.main "/proc/$p/cmdline" 2>/dev/null; then
  echo "$(hostname): stopping the previous run (pid $p)"; kill "$p" || true;
  for i in $(seq 60); do kill -0 "$p" 2>/dev/null || break; sleep 2; done; kill -9 "$p" 2>/dev/null || true;
fi;
rm -rf ~/bert_jax; mkdir -p ~/bert_jax; tar -xzf ~/bert_jax.tar.gz -C ~/bert_jax;
if [ ! -x ~/bert_jax_venv/bin/python ]; then
  py=$(command -v python3.13 python3.12 python3.11 | head -n 1);
  if [ -z "$py" ]; then
    sudo apt-get -q -o DPkg::Lock::Timeout=600 update;
    sudo apt-get -q -y -o DPkg::Lock::Timeout=600 install python3.11 python3.11-venv; py=python3.11;
  fi;
  "$py" -m venv --clear ~/bert_jax_venv || {
    sudo apt-get -q -y -o DPkg::Lock::Timeout=600 install "$(basename "$py")-venv";
    "$py" -m venv --clear ~/bert_jax_venv; };
fi;
cd ~/bert_jax; ~/bert_jax_venv/bin/pip install -q --upgrade pip; ~/bert_jax_venv/bin/pip install -q -e ".[tpu]"
EOF
)
ssh_to() { local node=$1; shift; ssh_command=(gcloud compute tpus tpu-vm ssh "${node}" "${scope[@]}" --worker=all "$@"); }

# Every worker runs the same command; the pid file lets the next launch stop it (see above). Over several
# slices each worker also gets the MEGASCALE_* variables: the coordinator (worker 0 of slice 0, whose internal
# address describe_coordinator prints), the slice count and its own slice, from which JAX forms one job.
(( num_slices > 1 )) && driver_args+=(--config.mesh.dcn_data="${num_slices}")
describe_coordinator=(gcloud compute tpus tpu-vm describe "${nodes[0]}" "${scope[@]}"
  "--format=value(networkEndpoints[0].ipAddress)")
remote_run() {  # slice coordinator_address
  local environment=""
  (( num_slices > 1 )) && environment="MEGASCALE_COORDINATOR_ADDRESS=$2:8080 MEGASCALE_PORT=8080 \
MEGASCALE_NUM_SLICES=${num_slices} MEGASCALE_SLICE_ID=$1 "
  echo "echo \$\$ > ~/bert_jax.pid; cd ~/bert_jax && ${environment}exec ~/bert_jax_venv/bin/python -m bert_jax.main \
$(quote --workdir="${workdir}" "${driver_args[@]}")"
}

log_file="${log_dir}/${name}-$(date +%Y%m%d-%H%M%S).log"

if (( dry_run )); then
  quote "${describe_node[@]}"
  (( queued )) && quote "${describe_queued[@]}"
  log "(an existing TPU is an error without --reuse; with it a READY one is used and not created)"
  if (( queued )); then
    quote "${create_queued[@]}"
    quote "${describe_queued[@]}"
    log "(the describe command repeats every ${poll_seconds} s until the state is ACTIVE)"
  else
    quote "${create_node[@]}"
  fi
  quote "${make_tarball[@]}"
  for node in "${nodes[@]}"; do copy_to "${node}"; quote "${copy_command[@]}"; done
  quote mkdir -p "${log_dir}"
  coordinator=""
  if (( num_slices > 1 )); then
    quote "${describe_coordinator[@]}"
    log "(COORDINATOR_IP below: the address that describe command prints)"
    coordinator=COORDINATOR_IP
  fi
  for node in "${nodes[@]}"; do
    ssh_to "${node}" --command="${remote_install}"
    echo "$(quote "${ssh_command[@]}") 2>&1 | $(quote tee -a "${log_file}")"
  done
  for slice in "${!nodes[@]}"; do
    ssh_to "${nodes[slice]}" --command="$(remote_run "${slice}" "${coordinator}")"
    background=""
    (( num_slices > 1 )) && background=" &"
    echo "$(quote "${ssh_command[@]}") 2>&1 | $(quote tee -a "${log_file}")${background}"
  done
  (( num_slices > 1 )) && echo wait
  if (( delete_at_end )); then
    if (( queued )); then quote "${delete_queued[@]}"; else quote "${delete_node[@]}"; fi
  fi
  exit 0
fi

# --- running them -----------------------------------------------------------------------------------------
command -v gcloud >/dev/null || fail "gcloud is not on PATH (install the Google Cloud CLI, or use --dry-run)"

run() {
  log "+ $(quote "$@")"
  "$@"
}

# Prints the state a describe command reports, or nothing when the resource does not exist; any other
# failure (credentials, API not enabled, ...) stops the launch rather than being taken for "absent".
state_of() {
  local state errors
  errors=$(mktemp)
  if state=$("$@" 2>"${errors}"); then
    rm -f "${errors}"
    echo "${state}"
    return 0
  fi
  if grep -qE 'NOT_FOUND|not found' "${errors}"; then
    rm -f "${errors}"
    return 0
  fi
  cat "${errors}" >&2
  rm -f "${errors}"
  fail "$(quote "$@") failed"
}

delete_tpu() {
  # The TPU may have been made directly or through a queued resource (e.g. by an earlier launch): try both.
  if (( queued )); then
    run "${delete_queued[@]}" || run "${delete_node[@]}"
  else
    run "${delete_node[@]}" || run "${delete_queued[@]}"
  fi
}

ours=0  # set once this launch created or adopted the TPU: only then does --delete touch it
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  rm -f "${tarball}"
  if (( delete_at_end && ours )); then
    log "deleting ${name} (--delete)"
    delete_tpu || log "warning: could not delete ${name}; check: $(quote gcloud compute tpus tpu-vm list "${scope[@]}")"
  fi
  [[ -f "${log_file}" ]] && log "log: ${log_file}"
  exit "${status}"
}
# Set before creation, so that --delete also removes a TPU or queued request left by a failure or Ctrl-C.
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_until_active() {
  local state="" last=""
  while true; do
    state=$(state_of "${describe_queued[@]}")
    if [[ "${state}" != "${last}" ]]; then
      log "queued resource ${name}: ${state:-gone}"
      last=${state}
    fi
    case "${state}" in
      ACTIVE) return 0 ;;
      ""|FAILED|SUSPENDING|SUSPENDED)
        fail "queued resource ${name} is ${state:-gone}; details: $(quote gcloud compute tpus queued-resources \
describe "${name}" "${scope[@]}")" ;;
    esac
    sleep "${poll_seconds}"
  done
}

node_state=$(state_of "${describe_node[@]}")
queued_state=""
if (( queued )); then
  queued_state=$(state_of "${describe_queued[@]}")
fi
if (( ! reuse )) && [[ -n "${node_state}${queued_state}" ]]; then
  fail "${name} already exists (${node_state:-queued resource ${queued_state}}); pass --reuse to run on it \
(a re-run after a preemption resumes from the workdir), or delete it"
fi
ours=1

if [[ "${node_state}" == READY ]]; then
  log "reusing ${name} (READY)"
elif (( queued )); then
  case "${queued_state}" in
    "")
      # A node made without a queued resource (and now not READY) would block the new node's id.
      [[ -z "${node_state}" ]] || run "${delete_node[@]}"
      run "${create_queued[@]}" ;;
    FAILED|SUSPENDING|SUSPENDED)
      log "queued resource ${name} is ${queued_state} (a Spot TPU was preempted, say): creating it again"
      run "${delete_queued[@]}"
      run "${create_queued[@]}" ;;
    *) log "queued resource ${name} exists (${queued_state}): waiting for it" ;;
  esac
  wait_until_active
else
  case "${node_state}" in
    "") ;;
    PREEMPTED|TERMINATED|STOPPED)
      log "${name} is ${node_state}: creating it again"
      run "${delete_node[@]}" ;;
    *) fail "${name} is ${node_state}; wait until it is READY, or delete it" ;;
  esac
  run "${create_node[@]}"
fi

# Private: the tarball holds the whole source tree.
(umask 077 && run "${make_tarball[@]}")
for node in "${nodes[@]}"; do
  copy_to "${node}"
  run "${copy_command[@]}"
done
mkdir -p "${log_dir}"
log "logging to ${log_file}"
for node in "${nodes[@]}"; do
  ssh_to "${node}" --command="${remote_install}"
  run "${ssh_command[@]}" 2>&1 | tee -a "${log_file}"
done
coordinator=""
if (( num_slices > 1 )); then
  coordinator=$(run "${describe_coordinator[@]}")
  [[ -n "${coordinator}" ]] || fail "no internal address for ${nodes[0]}: $(quote "${describe_coordinator[@]}")"
fi
if (( num_slices == 1 )); then
  ssh_to "${name}" --command="$(remote_run 0 "")"
  run "${ssh_command[@]}" 2>&1 | tee -a "${log_file}"
  exit 0
fi
# All slices at once (each one's workers wait in jax.distributed for the others); the launch fails if any does.
pids=()
for slice in "${!nodes[@]}"; do
  ssh_to "${nodes[slice]}" --command="$(remote_run "${slice}" "${coordinator}")"
  run "${ssh_command[@]}" 2>&1 | tee -a "${log_file}" &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "${pid}" || fail "the driver failed on a slice; see ${log_file}"; done
