"""Process-wide settings made before JAX starts its backend, shared by the driver (bert_jax.main) and the benchmark
programs. Nothing here runs at import, and importing it imports no JAX (a torch benchmark process loads it too).
"""

import importlib.util

# XLA:CPU options, set before JAX starts its backend (it reads XLA_FLAGS then, not at import). Other backends ignore
# them. launch/local.sh and tests/conftest.py set the same ones.
CPU_XLA_FLAGS = (
    # YNNPACK fusions for reductions only: its dot fusions returned NaN for a dot with a constant operand fused into
    # a reduction (jaxlib 0.10.2), and without "reduce" XLA:CPU emits each reduction as a much slower loop.
    ("xla_cpu_experimental_ynn_fusion_type", "reduce"),
    # Dots stay Eigen's: XLA:CPU's oneDNN fusion thunk (--xla_cpu_experimental_onednn_fusion_type=individual_dot)
    # aborted the process (object_pool.h "Check failed: available_.size() == num_created_") when a compiled program
    # was freed while it ran (tests/test_xla_cpu.py), and was no faster (README, XLA:CPU options).
)

# glibc's allocator for CPU runs: one arena, no mmap for large blocks, no trimming of the heap. XLA:CPU allocates each
# step's temporaries afresh; with glibc's defaults they are mmapped and unmapped every step, and the kernel hands the
# next step fresh zeroed pages (mini pretraining, batch 32, on 2 cores: a sixth of the process's time in the kernel).
# The cost: the process keeps its peak heap. glibc reads GLIBC_TUNABLES only when a process starts, so the driver
# re-executes itself once with it (bert_jax.main); a GLIBC_TUNABLES of the user's (an empty one too) is left alone.
CPU_GLIBC_TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"


def with_cpu_xla_flags(xla_flags: str) -> str:
    """`xla_flags` plus each of CPU_XLA_FLAGS it does not name, so `XLA_FLAGS=--NAME=VALUE` overrides any of them."""
    named = {word.lstrip("-").split("=", 1)[0] for word in xla_flags.split()}
    added = [f"--{name}={value}" for name, value in CPU_XLA_FLAGS if name not in named]
    return " ".join([*xla_flags.split(), *added])


def without_an_absent_tpu() -> None:
    """The CPU, quietly, on a host with libtpu installed (the test and aot extras install it for ahead-of-time TPU
    compilation) but no TPU chip or GPU attached: JAX would otherwise try the TPU first and print libtpu's errors.
    Call before JAX starts its backend."""
    import jax  # pylint: disable=import-outside-toplevel  # here, not at import: see the module docstring
    if jax.config.jax_platforms or importlib.util.find_spec("libtpu") is None:
        return
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel  # JAX's own test for TPU chips
    if not (hardware_utils.num_available_tpu_chips_and_device_id()[0] or hardware_utils.has_visible_nvidia_gpu()
            or hardware_utils.num_available_amd_gpus(stop_at=1)):
        jax.config.update("jax_platforms", "cpu")
