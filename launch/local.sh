#!/usr/bin/env bash
# Run bert_jax on this machine (CPU, or the local GPUs/TPU chips JAX finds).
#   launch/local.sh [--dry-run] [--fake-devices N] [driver flags...]
# Example: launch/local.sh --fake-devices 8 --config=configs/pretrain.py:size=tiny --config.mesh.fsdp=2 \
#            --workdir=/tmp/bert_jax_local
# Other arguments (--help too) go to the driver unchanged. launch/tpu.sh and launch/slurm.sh start it on clusters.
set -euo pipefail

dry_run=0
fake_devices=0
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --fake-devices)
      # Checked here: a missing or non-numeric value would otherwise surface as a bash arithmetic error.
      if [[ $# -lt 2 || ! "$2" =~ ^[0-9]+$ ]]; then
        echo "$(basename "$0"): error: --fake-devices needs a number of CPU devices, e.g. --fake-devices 8" >&2
        exit 2
      fi
      fake_devices="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

env_prefix=()
if [[ "${fake_devices}" -gt 0 ]]; then
  # Several CPU "devices" on one host: exercises data/FSDP/tensor sharding without accelerators.
  env_prefix=(env JAX_PLATFORMS=cpu "XLA_FLAGS=${XLA_FLAGS:-} --xla_force_host_platform_device_count=${fake_devices}")
fi
command=("${env_prefix[@]}" python -m bert_jax.main "${args[@]}")

if [[ "${dry_run}" -eq 1 ]]; then
  printf '%q ' "${command[@]}"
  echo
else
  exec "${command[@]}"
fi
