#!/usr/bin/env bash
# Run bert_jax on this machine (CPU, or the local GPUs/TPU chips JAX finds).
#   launch/local.sh [--dry-run] [--fake-devices N] [--tuned-malloc] [driver flags...]
# Example: launch/local.sh --fake-devices 8 --config=configs/pretrain.py:size=tiny --config.mesh.fsdp=2 \
#            --workdir=/tmp/bert_jax_local
# --tuned-malloc: glibc keeps freed memory in one heap (GLIBC_TUNABLES: one arena, no mmap, no trim), so each XLA:CPU
# step reuses its ~1 GB of temporaries instead of faulting in fresh pages (BERT-base fp32 on 2 cores: about 0.35 s
# of a 3.5-4 s step). The driver sets the same itself on CPU runs (bert_jax.runtime.CPU_GLIBC_TUNABLES); this flag sets
# it for any platform. The process keeps its peak heap, and its threads share one arena's lock.
# Other arguments (--help too) go to the driver unchanged. launch/tpu.sh and launch/slurm.sh start it on clusters.
set -euo pipefail

dry_run=0
fake_devices=0
tuned_malloc=0
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry_run=1; shift ;;
    --tuned-malloc) tuned_malloc=1; shift ;;
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

# The driver's XLA:CPU options and allocator setting, from the one table that holds them (bert_jax.runtime; the
# driver adds the options too, --dry-run shows them here), each option only where XLA_FLAGS does not name it, so
# `XLA_FLAGS=--NAME=VALUE launch/local.sh ...` overrides it.
read -r -d '' settings < <(python -c 'import os
from bert_jax import runtime
print(runtime.with_cpu_xla_flags(os.environ.get("XLA_FLAGS", "")))
print(runtime.CPU_GLIBC_TUNABLES)') || true
{ read -r xla_flags; read -r tunables; } <<< "${settings}"
if [[ -z "${tunables}" ]]; then
  echo "$(basename "$0"): error: cannot import bert_jax with $(command -v python || echo 'no python'): install it" \
    "first (pip install -e .)" >&2
  exit 1
fi
env_prefix=(env "XLA_FLAGS=${xla_flags}")
if [[ "${fake_devices}" -gt 0 ]]; then
  # Several CPU "devices" on one host: exercises data/FSDP/tensor sharding without accelerators.
  env_prefix=(env JAX_PLATFORMS=cpu "XLA_FLAGS=${xla_flags} --xla_force_host_platform_device_count=${fake_devices}")
fi
if [[ "${tuned_malloc}" -eq 1 ]]; then
  # Read by glibc when the process starts. The user's own GLIBC_TUNABLES come last: where a name repeats, glibc
  # keeps the last value, so the user's win.
  env_prefix+=("GLIBC_TUNABLES=${tunables}${GLIBC_TUNABLES:+:${GLIBC_TUNABLES}}")
fi
command=("${env_prefix[@]}" python -m bert_jax.main "${args[@]}")

if [[ "${dry_run}" -eq 1 ]]; then
  printf '%q ' "${command[@]}"
  echo
else
  exec "${command[@]}"
fi
