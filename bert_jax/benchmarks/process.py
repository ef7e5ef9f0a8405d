"""What a benchmark program sets up before JAX starts, as the driver (bert_jax.main) does for its own process.

Not imported from bert_jax.main: that module defines the driver's required absl flags. tests/test_benchmark.py
checks that the copies here equal the driver's.
"""

import importlib.util

# The driver's XLA:CPU options (bert_jax.main.CPU_XLA_FLAGS), so the step timed is the driver's.
DRIVER_XLA_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=reduce",)
# The allocator settings the driver's CPU runs re-execute themselves with (bert_jax.main.CPU_GLIBC_TUNABLES), for
# benchmarks that start a child process as the driver would run.
DRIVER_GLIBC_TUNABLES = "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647"


def with_driver_xla_flags(xla_flags: str) -> str:
    """`xla_flags` plus each of DRIVER_XLA_FLAGS it does not name (bert_jax.main.with_cpu_xla_flags' rule)."""
    named = {word.lstrip("-").split("=", 1)[0] for word in xla_flags.split()}
    return " ".join([*xla_flags.split(), *(flag for flag in DRIVER_XLA_FLAGS
                                           if flag.lstrip("-").split("=", 1)[0] not in named)])


def without_an_absent_tpu() -> None:
    """The CPU, quietly, where libtpu is installed but no TPU chip or GPU is attached (bert_jax.main's rule): JAX
    would otherwise try the TPU first and print libtpu's start-up errors. Call before JAX starts its backend."""
    import jax  # pylint: disable=import-outside-toplevel  # here: a torch benchmark process never loads jaxlib
    if jax.config.jax_platforms or importlib.util.find_spec("libtpu") is None:
        return
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel  # JAX's own test for TPU chips
    if not (hardware_utils.num_available_tpu_chips_and_device_id()[0] or hardware_utils.has_visible_nvidia_gpu()
            or hardware_utils.num_available_amd_gpus(stop_at=1)):
        jax.config.update("jax_platforms", "cpu")
