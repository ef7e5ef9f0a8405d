"""Host allocator settings for XLA:CPU: keep freed memory in one glibc heap so each step reuses it.

XLA:CPU allocates every step's temporaries (about 1.1 GB for the base preset at batch 8, seq 128) as one block from
a worker thread, and frees it when the step ends. glibc serves a block that large from a thread's own arena with
mmap, whatever M_MMAP_MAX says, and returns it with munmap, so the kernel hands the next step fresh zeroed pages:
about 300,000 page faults and 0.45-0.76 s of system time a step on the project's 2-core benchmark machine. With one
arena (M_ARENA_MAX=1), no mmap for large blocks (M_MMAP_MAX=0) and no trimming of the heap's top, the second step on
reuses the same pages: the faults fall to near zero and the base step got 0.3 s faster there.

The cost is that the process keeps its peak heap instead of handing it back, and every thread shares one arena's
lock. Both suit a training process on a CPU backend; neither suits a TPU or GPU host whose input pipeline runs many
threads, so `auto` applies the settings only when JAX will run on the CPU.

`BERT_JAX_HOST_MALLOC` chooses: `auto` (default), `tuned` (always), `system` (never). The settings must be made
before JAX's and TensorFlow's threads first allocate, so bert_jax applies them when it is imported; a thread that has
already allocated keeps the arena it has.
"""

import ctypes
import importlib.metadata
import importlib.util
import os
import sys

ENV_VAR = "BERT_JAX_HOST_MALLOC"
MODES = ("auto", "tuned", "system")

# mallopt parameters, from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER_TRIM = 2**31 - 1

# What this process decided: (applied, why), for the benchmark header and the logs.
state = (False, "not configured")


def _accelerator_expected() -> str | None:
    """The reason JAX may pick a TPU or GPU backend in this process, or None when it will run on the CPU."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        first = platforms.split(",")[0].strip().lower()
        return None if first == "cpu" else f"JAX_PLATFORMS={platforms}"
    if importlib.util.find_spec("libtpu") is not None:
        return "libtpu is installed"
    plugins = sorted(entry.name for entry in importlib.metadata.entry_points(group="jax_plugins"))
    if plugins:
        return f"JAX plugin(s) {', '.join(plugins)} installed"
    return None


def configure(mode: str | None = None) -> tuple[bool, str]:
    """Applies the allocator settings for `mode` (default: $BERT_JAX_HOST_MALLOC, else auto); returns (applied, why)."""
    global state
    mode = (mode if mode is not None else os.environ.get(ENV_VAR, "auto")).strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV_VAR}={mode!r}: choose one of {MODES} (auto applies the settings on a CPU backend)")
    if mode == "system":
        state = (False, f"{ENV_VAR}=system")
        return state
    if mode == "auto":
        reason = _accelerator_expected()
        if reason is not None:
            state = (False, f"left to the system: {reason}")
            return state
    if not sys.platform.startswith("linux"):
        state = (False, f"left to the system: {sys.platform} is not Linux")
        return state
    try:
        libc = ctypes.CDLL("libc.so.6")
        version = libc.gnu_get_libc_version
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        state = (False, "left to the system: the C library is not glibc")
        return state
    version.restype = ctypes.c_char_p
    ok = all(mallopt(param, value) == 1 for param, value in (
        (_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER_TRIM)))
    glibc = version().decode()
    state = (ok, f"glibc {glibc}: one arena, no mmap, no trim" if ok else f"glibc {glibc} refused mallopt")
    return state
