"""The driver's process set-up (set_up_driver), made before JAX starts its backend: XLA:CPU's options, the CPU where
no accelerator is attached, glibc's allocator on CPU runs, the dropout RNG's libtpu option, and the checkpoint
libraries' logs and background errors.
The benchmark programs and launch/local.sh read the same settings here. Nothing runs at import, and importing it
imports no JAX (a torch benchmark process loads it too).
"""

import collections
import functools
import gc
import importlib.metadata
import importlib.util
import logging as std_logging
import os
import platform
import sys
import warnings

from absl import logging

# XLA:CPU options, set before JAX starts its backend (it reads XLA_FLAGS then, not at import). Other backends ignore
# them. launch/local.sh and tests/conftest.py read them here.
CPU_XLA_FLAGS = (
    # YNNPACK fusions for reductions only: its dot fusions returned NaN for a dot with a constant operand fused into
    # a reduction (jaxlib 0.10.2), and without "reduce" XLA:CPU emits each reduction as a much slower loop.
    ("xla_cpu_experimental_ynn_fusion_type", "reduce"),
    # Dots are chosen per program, not here: see CPU_DOTS_VARIABLE.
)

# The train and eval steps' dots on a CPU: "eigen" (XLA's own) or "onednn" (XLA:CPU's oneDNN fusion thunk), passed
# as compile options of those programs only (step_compiler_options), never process-wide: the thunk aborts the process
# (object_pool.h "Check failed: available_.size() == num_created_") when a program is freed while it runs, so it goes
# only to programs kept alive until their runs end (train.KeptUntilDone). "auto" picks by the instruction set, as
# measured (docs/performance.md, XLA:CPU options).
CPU_DOTS_VARIABLE = "BERT_JAX_CPU_DOTS"
CPU_DOTS = ("auto", "eigen", "onednn")
ONEDNN_DOT_OPTIONS = {"xla_cpu_use_onednn": True,
                      "xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}

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


def cpu_info(path: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first CPU's fields in Linux's /proc/cpuinfo ('model name', 'cpu family', 'model', 'flags', ...); empty
    where there is no such file."""
    fields = {}
    try:
        with open(path, encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    break  # the end of the first processor's block
                name, _, value = line.partition(":")
                fields[name.strip()] = value.strip()
    except OSError:
        pass
    return fields


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The host CPU's feature flags (read once; empty where cpu_info finds none)."""
    return frozenset(cpu_info().get("flags", "").split())


def cpu_dots(xla_flags: str | None = None, cpu_flags: frozenset[str] | None = None) -> str:
    """"eigen" or "onednn": BERT_JAX_CPU_DOTS (auto, eigen, onednn; default auto). auto: oneDNN on a CPU with AVX-512,
    Eigen on AVX2 (docs/performance.md has the figures) and wherever XLA_FLAGS names XLA's instruction set cap or
    oneDNN options itself (the user's setting stands)."""
    choice = os.environ.get(CPU_DOTS_VARIABLE, "auto") or "auto"
    if choice not in CPU_DOTS:
        raise ValueError(f"{CPU_DOTS_VARIABLE}={choice!r}: must be one of {', '.join(CPU_DOTS)}")
    if choice != "auto":
        return choice
    named = {word.lstrip("-").split("=", 1)[0]
             for word in (os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags).split()}
    if named & {"xla_cpu_max_isa", "xla_cpu_use_onednn", "xla_cpu_experimental_onednn_fusion_type"}:
        return "eigen"
    return "onednn" if "avx512f" in (_cpu_flags() if cpu_flags is None else cpu_flags) else "eigen"


def step_compiler_options(backend: str) -> dict | None:
    """The compile options of a train or eval step on `backend` (a device's platform): oneDNN's dots where cpu_dots()
    says so."""
    if backend != "cpu" or cpu_dots() != "onednn":
        return None
    # XLA cannot serialize the oneDNN thunk, so a persistent compilation cache (JAX_COMPILATION_CACHE_DIR) keeps no
    # such step and JAX warns at each compile; the step compiles as without a cache.
    warnings.filterwarnings("ignore", message=".*ToProto is not implemented for thunk kind: onednn-fusion")
    return dict(ONEDNN_DOT_OPTIONS)


# TensorFlow (imported for tf.data only, never tf.keras) imports Keras 3 eagerly when it is installed, as
# tensorflow-cpu's dependency always is (a quarter of the import's time: docs/performance.md). With
# TF_USE_LEGACY_KERAS=1 it tries the tf_keras package instead, and goes on without it where it is not installed.
TF_WITHOUT_KERAS = ("TF_USE_LEGACY_KERAS", "1")


# Python's collector for a process that traces and compiles: tracing makes objects by the million, and at the default
# thresholds (700, 10, 10) each of its many full collections walks every object TensorFlow and JAX hold. Measured on
# the README's default run cut to 4 steps (2 cores): 1.6 s of collection, 0.3 s at these; peak RSS 1.06-1.13 GB
# either way.
GC_THRESHOLDS = (50_000, 20, 20)


def set_up_collector() -> None:
    """GC_THRESHOLDS for this process: the driver, the benchmarks, the planner's compiling processes, the tests'."""
    gc.set_threshold(*GC_THRESHOLDS)


def set_up_jax() -> None:
    """What the driver and the benchmark programs set before JAX starts its backend: XLA:CPU's options (added to
    XLA_FLAGS), the CPU where no accelerator is attached, and TensorFlow's import without Keras (unless the
    variable is set already); and the collector's thresholds (set_up_collector)."""
    set_up_collector()
    os.environ["XLA_FLAGS"] = with_cpu_xla_flags(os.environ.get("XLA_FLAGS", ""))
    os.environ.setdefault(*TF_WITHOUT_KERAS)
    without_an_absent_tpu()


def without_an_absent_tpu() -> None:
    """The CPU, quietly, on a host with libtpu installed (the test and aot extras install it for ahead-of-time TPU
    compilation) but no TPU chip or GPU attached: JAX would otherwise try the TPU first and print libtpu's errors.
    Call before JAX starts its backend."""
    if _platforms_known() or importlib.util.find_spec("libtpu") is None:
        return
    import jax  # pylint: disable=import-outside-toplevel  # here, not at import: see the module docstring
    from jax._src import hardware_utils  # pylint: disable=import-outside-toplevel  # JAX's own test for TPU chips
    if not (hardware_utils.num_available_tpu_chips_and_device_id()[0] or hardware_utils.has_visible_nvidia_gpu()
            or hardware_utils.num_available_amd_gpus(stop_at=1)):
        jax.config.update("jax_platforms", "cpu")


# The dropout RNG's platform choice and the libtpu option it needs: read before JAX starts its TPU backend.
# What train.dropout_rng=auto means on each platform (docs/performance.md, "Dropout randomness", has the figures).
# On a TPU, unsafe_rbg: BERT-base's step for v5e compiled with 29% less temporary memory than with rbg (which draws
# every device's bits on each) and both RBG forms with fewer FLOPs and less compile time than threefry. Elsewhere
# threefry: exact across meshes, and no faster by the CPU step benchmark's noise.
AUTO_DROPOUT_RNG = {"tpu": "unsafe_rbg", "gpu": "threefry", "cpu": "threefry"}


def dropout_rng_name(choice: str, platform: str) -> str:
    """The dropout RNG `choice` (train.dropout_rng) means on `platform` ("auto" resolved)."""
    return AUTO_DROPOUT_RNG.get(platform, "threefry") if choice == "auto" else choice


# Set in LIBTPU_INIT_ARGS by set_libtpu_options (the driver and bert_jax.aot) before JAX starts its TPU backend, for
# unsafe_rbg dropout: XLA:TPU then partitions RngBitGenerator without replicating its bits (each device draws its own
# shard's), the point of unsafe_rbg (levanter #226 found it slower without) and why its masks depend on the mesh.
UNSAFE_RBG_LIBTPU_OPTION = ("xla_tpu_spmd_rng_bit_generator_unsafe", "true")


def with_libtpu_options(libtpu_args: str, dropout_rng: str) -> str:
    """`libtpu_args` plus the option dropout_rng=unsafe_rbg needs on a TPU, unless it is named there already."""
    if dropout_rng_name(dropout_rng, "tpu") != "unsafe_rbg":
        return libtpu_args
    name, value = UNSAFE_RBG_LIBTPU_OPTION
    if any(word.lstrip("-").split("=", 1)[0] == name for word in libtpu_args.split()):
        return libtpu_args
    return " ".join([*libtpu_args.split(), f"--{name}={value}"])


def set_libtpu_options(dropout_rng: str) -> None:
    """Adds to LIBTPU_INIT_ARGS what train.dropout_rng needs; libtpu reads it when JAX starts its TPU backend."""
    os.environ["LIBTPU_INIT_ARGS"] = with_libtpu_options(os.environ.get("LIBTPU_INIT_ARGS", ""), dropout_rng)


# The checkpoint libraries' logs and background errors, for the driver to tame (process-wide, so never on import).

# Orbax, and TensorFlow's checkpointing of the input position, log every step of every save at INFO.
_CHATTY = (f"{os.sep}orbax{os.sep}", os.path.join("tensorflow", "python", "checkpoint", ""))


class QuietLogs(std_logging.Filter):
    """Keeps every line of ours, and the checkpoint libraries' warnings and errors without their tracebacks
    (--verbosity=1 keeps them). A failed save is logged by each of Orbax's threads and, at exit, by asyncio once per
    abandoned write; bert_jax reports it once, so asyncio's repeats of one message are dropped too."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def filter(self, record) -> bool:
        from_asyncio = record.name == "asyncio"
        if not from_asyncio and not any(part in record.pathname for part in _CHATTY):
            return True
        if record.levelno < std_logging.WARNING:
            return False
        if logging.get_verbosity() < logging.DEBUG:
            record.exc_info, record.exc_text = None, None
            if from_asyncio:
                first_line = record.getMessage().split("\n", 1)[0]
                if first_line in self.seen:
                    return False
                self.seen.add(first_line)
        return True


def report_unraisable_once(unraisable, seen=collections.Counter()) -> None:
    """A sys.unraisablehook (the driver installs it): an exception that a background callback could not raise,
    logged once per message.

    After a failed save or restore, each of TensorStore's pending callbacks finds Orbax's event loop closed and
    prints the same traceback (a hundred or more per checkpoint); the error itself is reported once, by us.
    """
    key = f"{type(unraisable.exc_value).__name__}: {unraisable.exc_value}"
    seen[key] += 1
    if logging.get_verbosity() >= logging.DEBUG:
        sys.__unraisablehook__(unraisable)
    elif seen[key] == 1:
        logging.warning("ignored in a background callback: %s (repeats are not logged; --verbosity=1 shows them)",
                        key)


def _platforms_known() -> str:
    """jax_platforms as JAX has it, or, before JAX is imported, as it will read it (JAX_PLATFORMS): the driver's
    re-execution then comes before the import (1.0-1.2 s a process on the 2-core CPU), not after it."""
    if "jax" not in sys.modules:
        return os.environ.get("JAX_PLATFORMS", "")
    import jax  # pylint: disable=import-outside-toplevel  # imported already
    return jax.config.jax_platforms or ""


def runs_on_the_cpu(platforms: str | None = None) -> bool:
    """Whether JAX will pick its CPU backend (asked before it starts: `platforms`, default jax_platforms, which
    JAX_PLATFORMS sets; else no TPU or GPU plugin installed)."""
    if platforms is None:
        platforms = _platforms_known()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    return (importlib.util.find_spec("libtpu") is None and importlib.util.find_spec("jax_plugins") is None
            and not importlib.metadata.entry_points(group="jax_plugins"))


def _started_as(driver_file: str) -> bool:
    """`python -m bert_jax.main` or the `bert-jax` script, not a program that calls its run() (which exec must not
    replace)."""
    program = sys.argv[0] if sys.argv else ""
    return os.path.abspath(program) == os.path.abspath(driver_file) or os.path.basename(program) == "bert-jax"


def with_cpu_glibc_tunables(driver_file: str) -> None:
    """Re-executes this process once with GLIBC_TUNABLES=CPU_GLIBC_TUNABLES on a glibc CPU run of the driver
    (`driver_file`); the variable, set from then on, stops a second exec."""
    if ("GLIBC_TUNABLES" in os.environ or not sys.platform.startswith("linux") or not _started_as(driver_file)
            or platform.libc_ver()[0] != "glibc" or not runs_on_the_cpu()):
        return
    os.environ["GLIBC_TUNABLES"] = CPU_GLIBC_TUNABLES
    sys.stdout.flush()
    sys.stderr.flush()
    # orig_argv keeps the interpreter's own options and `-m bert_jax.main` (or the script's path).
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def set_up_driver(driver_file: str) -> None:
    """The driver's process, before JAX starts its backend: XLA:CPU's options, the CPU where no accelerator is
    attached, glibc's allocator on CPU runs (a re-execution), and the checkpoint libraries' logs and background
    errors reported once."""
    set_up_jax()
    with_cpu_glibc_tunables(driver_file)
    sys.unraisablehook = report_unraisable_once
    logging.get_absl_handler().addFilter(QuietLogs())


# Errors that are the user's to fix: a bad flag, field, file, path or corpus record. Command lines print the message
# alone (it names the problem and the fix); --verbosity=1 adds the traceback. The driver adds its own kinds.
USER_ERRORS = (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
               PermissionError)


def run_reporting_user_errors(main, argv, user_errors=USER_ERRORS):
    """`main(argv)`; a user error is one `bert_jax: error: MESSAGE` line on stderr and exit status 1."""
    try:
        return main(argv)
    except user_errors as error:
        logging.debug("traceback of the error below", exc_info=True)
        sys.stderr.write(f"bert_jax: error: {error}\n")
        sys.exit(1)
