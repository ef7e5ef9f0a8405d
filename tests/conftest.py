"""Test set-up: 8 fake CPU devices, set before JAX is imported anywhere."""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=8".strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bert_jax import runtime as _runtime  # noqa: E402
from tests import compile_cache as _compile_cache  # noqa: E402

_compile_cache.set_up()

# The libtpu option the driver adds for train.dropout_rng=auto (runtime.set_libtpu_options), set in every process of
# the run as the driver sets it in its own: JAX's compilation cache key hashes LIBTPU_INIT_ARGS, so without it a
# program compiled by a driver subprocess (or after an in-process driver run) would be compiled again elsewhere.
os.environ["LIBTPU_INIT_ARGS"] = _runtime.with_libtpu_options(os.environ.get("LIBTPU_INIT_ARGS", ""), "auto")

# TensorFlow's import without Keras, as the driver's (runtime.set_up_jax): the workers and every driver subprocess.
os.environ.setdefault(*_runtime.TF_WITHOUT_KERAS)

# Eigen's dots in the steps, whatever the CPU: the run's compilation cache cannot hold a step with oneDNN's (which
# runtime.cpu_dots picks on AVX-512), so each test would compile its steps afresh. test_train.py and test_xla_cpu.py
# test oneDNN's.
os.environ.setdefault(_runtime.CPU_DOTS_VARIABLE, "eigen")

# The driver's XLA:CPU options, which its run() sets: the tests compile what the driver runs. JAX reads XLA_FLAGS
# when its backend starts, after this.
os.environ["XLA_FLAGS"] = _runtime.with_cpu_xla_flags(os.environ["XLA_FLAGS"])

# The suite is compile-bound: its programs compile at XLA's -O0 unless JAX_DISABLE_MOST_OPTIMIZATIONS is set. The
# processes tests start inherit it (-O0 rounds differently), and tests marked xla_optimized compile as users' runs
# do (docs/architecture.md, Tests).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# At -O0, XLA:CPU's older kernel emitters too: the tiny train step compiles in 4.5 s instead of 7.3 and runs as fast;
# at -O2 they are slower to compile (10.3 s against 9.3; the checkpoint summaries 9.0 s against 2.9), so -O2 compiles
# keep XLA's default (docs/performance.md, Compile time on the CPU). The driver processes tests start read it from
# XLA_FLAGS (one marked xla_optimized starts them with the driver's own flags); this process's -O2 compiles override
# it (_default_emitters_at_o2). The AVX pass (.ci/run) runs at -O2 and so compiles as users' runs do.
_EMITTERS_FLAG = "xla_cpu_use_fusion_emitters"
_SUITES_EMITTERS = f"--{_EMITTERS_FLAG}=false"
# Set where this file added _SUITES_EMITTERS: pytest-xdist's workers inherit the controller's environment, flag and
# all, and must still tell the suite's flag from a user's.
_ADDED_MARK = "BERT_JAX_TESTS_ADDED_XLA_FLAG"
_USERS_XLA_FLAGS = " ".join(word for word in os.environ["XLA_FLAGS"].split()
                            if not (word == _SUITES_EMITTERS and os.environ.get(_ADDED_MARK)))
import jax  # noqa: E402  (after the variables above: JAX reads JAX_DISABLE_MOST_OPTIMIZATIONS as it is imported)

if jax.config.read("jax_disable_most_optimizations") and _EMITTERS_FLAG not in _USERS_XLA_FLAGS:
    os.environ["XLA_FLAGS"] = f"{_USERS_XLA_FLAGS} {_SUITES_EMITTERS}"
    os.environ[_ADDED_MARK] = _SUITES_EMITTERS

    def _default_emitters_at_o2():
        """XLA's default emitters for each compile of this process at -O2 (a test marked xla_optimized). JAX has no
        public setting for a compile option of every jit, so this wraps the function that makes them
        (jax._src.compiler); an XLA option passed per compile overrides XLA_FLAGS', and is part of the compilation
        cache's key. -O0 compiles pass nothing, so they share cache entries with the driver processes' compiles."""
        from jax._src import compiler  # pylint: disable=import-outside-toplevel
        get_compile_options = compiler.get_compile_options

        def with_emitters(*args, env_options_overrides=None, **kwargs):
            if not jax.config.read("jax_disable_most_optimizations"):
                env_options_overrides = {_EMITTERS_FLAG: True, **(env_options_overrides or {})}
            return get_compile_options(*args, env_options_overrides=env_options_overrides, **kwargs)

        compiler.get_compile_options = with_emitters

    _default_emitters_at_o2()


import gc  # noqa: E402
import logging  # noqa: E402
import socket  # noqa: E402

import pytest  # noqa: E402

# --profile-json: where the suite's time goes (tests/profile_suite.py).
pytest_plugins = ["tests.profile_suite"]


@pytest.fixture(autouse=True)
def _logging_levels():
    """Parsing the driver's absl flags in-process (test_main, test_finetune) sets the absl and root loggers' levels
    from --verbosity (WARNING by default); restored after each test, so later tests in the worker see INFO records."""
    loggers = (logging.getLogger(), logging.getLogger("absl"))
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


@pytest.fixture(autouse=True)
def _xla_optimized(request, monkeypatch):
    """A test marked xla_optimized compiles at full optimisation, in this process and the processes it starts."""
    if not request.node.get_closest_marker("xla_optimized"):
        yield
        return
    less_optimized = jax.config.read("jax_disable_most_optimizations")  # JAX's reading of the variable set above
    monkeypatch.setenv("JAX_DISABLE_MOST_OPTIMIZATIONS", "0")
    monkeypatch.setenv("XLA_FLAGS", _USERS_XLA_FLAGS)
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", less_optimized)


@pytest.fixture
def network_attempts(monkeypatch):
    """Fails any network connection fast and records it: TFDS retries downloads for minutes when offline."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


# Scheduling over pytest-xdist workers, per-test limits and the per-test log: a plugin of its own, so that a test can
# run an inner pytest under exactly this scheduling (tests/test_scheduling.py).
from tests.xdist_scheduling import (  # noqa: E402,F401  (pytest finds hooks by name in a conftest's namespace)
    pytest_configure, pytest_configure_node, pytest_handlecrashitem,
    pytest_runtest_logstart, pytest_xdist_make_scheduler)
from tests import xdist_scheduling  # noqa: E402

# The time limit of a test marked slow that sets none of its own (pytest.ini's `timeout` holds for the rest): the
# slowest took 198 s in a fresh-clone run of the suite on the 2-core CI machine.
SLOW_TEST_TIMEOUT_S = 900


# Python's collector as the driver sets it (runtime.set_up_collector), in the test processes, which trace programs
# all day. Measured on test_sharding.py and test_model.py in one process: collection 6.5 s -> 1.9 s, the process
# 129 -> 121 user-s, peak RSS 1747 -> 1770 MiB.
_runtime.set_up_collector()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    xdist_scheduling.pytest_collection_modifyitems(config, items)


def pytest_collection_finish(session):
    """What the imports and the collection made lives as long as the process: out of every later full collection's
    walk (each took about 0.45 s in a worker that has imported TensorFlow, torch and JAX)."""
    del session
    gc.collect()
    gc.freeze()


_XDIST_OPTIONS = (  # (flags, keyword arguments) of the pytest-xdist options in pytest.ini's addopts
    (("--numprocesses",), dict(dest="numprocesses", default=None)),
    (("--dist",), dict(dest="dist", default="no")),
    (("--no-loadscope-reorder",), dict(dest="loadscopereorder", action="store_false", default=True)),
)


def pytest_addoption(parser, pluginmanager):
    """Without pytest-xdist (`-p no:xdist`) its options in pytest.ini are accepted and ignored: tests run serially."""
    if not pluginmanager.has_plugin("xdist"):
        group = parser.getgroup("xdist", "pytest-xdist is not loaded: these options are ignored")
        for flags, kwargs in _XDIST_OPTIONS:
            group.addoption(*flags, **kwargs, help="ignored: pytest-xdist is not loaded")


def pytest_unconfigure(config):
    xdist_scheduling.pytest_unconfigure(config)
    _compile_cache.remove()
