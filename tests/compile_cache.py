"""JAX's persistent compilation cache for one run of the suite: every program compiled once per run, not once per
test or per process.

At import (tests/conftest.py imports this before anything imports JAX) the first pytest process of a run makes a
fresh directory and names it in JAX_COMPILATION_CACHE_DIR; the xdist workers and every driver subprocess a test starts
inherit the variable, so all of them read and write that one directory. The process that made it removes it when the
run ends, so no run reads another's programs.

A cached program can only stand in for the same program: JAX's key (jax/_src/cache_key.py) hashes the lowered module,
the compile options (devices, partitions), the platform and its version, and XLA_FLAGS/LIBTPU_INIT_ARGS, so the AVX
pass and a test that sets its own XLA flags compile afresh. A user's own JAX_COMPILATION_CACHE_DIR is left as it is.
Driver processes that form one CPU mesh together do not use it (the driver turns it off: bert_jax/sharding.py).
"""

import os
import shutil
import tempfile

_OWNER = "BERT_JAX_TEST_COMPILE_CACHE_OWNER"  # the pid of the process that made the directory (and removes it)


def set_up():
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="bert_jax_test_compile_cache_")
    os.environ[_OWNER] = str(os.getpid())
    # Every program, however quick to compile: the suite's are small, and each is compiled by many tests.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"


def remove():
    """At the end of the run (tests/conftest.py's pytest_unconfigure): only in the process that made the directory."""
    if os.environ.get(_OWNER) == str(os.getpid()):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
