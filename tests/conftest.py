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

from bert_jax import main as _driver  # noqa: E402

# The driver's XLA:CPU options, which its run() sets: the tests compile what the driver runs. JAX reads XLA_FLAGS
# when its backend starts, after this.
os.environ["XLA_FLAGS"] = _driver.with_cpu_xla_flags(os.environ["XLA_FLAGS"])


import logging  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _logging_levels():
    """Parsing the driver's absl flags in-process (test_main, test_finetune) sets the absl and root loggers' levels
    from --verbosity (WARNING by default); restored after each test, so later tests in the worker see INFO records."""
    loggers = (logging.getLogger(), logging.getLogger("absl"))
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


# ---------------------------------------------------------------------------------------------------------------
# Scheduling over pytest-xdist workers (pytest.ini: --numprocesses=auto --dist=loadgroup --no-loadscope-reorder).

# Modules whose tests share an expensive module-scoped fixture or cache (a compiled step, an unsharded reference
# run): each runs on one worker, as one unit, so that the fixture is made once. pytest-xdist's xdist_group mark
# would say this in the module, but under pytest 9.2 it no longer groups anything (pytest-dev/pytest-xdist#1386).
ONE_WORKER_MODULES = ("test_aot.py", "test_sharding.py")


def _module(nodeid):
    return os.path.basename(nodeid.split("::", 1)[0])


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """--dist=loadgroup's scheduler, with every module of ONE_WORKER_MODULES one unit (any other test its own)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # pylint: disable=import-outside-toplevel

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return module if _module(nodeid) in ONE_WORKER_MODULES else super()._split_scope(nodeid)

    return ModuleGroups(config, log)


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


def _start_rank(item):
    """0: a test marked slow (driver subprocesses, several compilations: the longest single units); 1: a module of
    ONE_WORKER_MODULES (tens of seconds as one unit); 2: the rest."""
    if item.get_closest_marker("slow"):
        return 0
    return 1 if _module(item.nodeid) in ONE_WORKER_MODULES else 2


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist, longest first: the workers take units in this order, so the long ones start at once rather
    # than leaving one worker to finish a long test alone at the end. A stable sort: files keep their order. A serial
    # run keeps the files' order.
    if hasattr(config, "workerinput"):
        items.sort(key=_start_rank)
