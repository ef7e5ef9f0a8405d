"""How this suite runs over pytest-xdist workers (pytest.ini: --numprocesses=auto --dist=loadgroup
--no-loadscope-reorder): which tests share a worker, in what order they start, and what happens when a worker dies.

A plugin of its own (the conftest imports its hooks) so that tests/test_scheduling.py can run an inner pytest under
exactly this scheduling: `python -m pytest -p tests.xdist_scheduling -n 2 --dist=loadgroup ...`.

- Units: each module of ONE_WORKER_MODULES is one unit of work, any other test its own.
- A worker that dies (a native abort, a kill, pytest-timeout's thread method ending a stuck test) fails the test it
  was running, with the end of what that worker wrote (its log: the native crash message, Python's fault traceback,
  the timeout's stack dump), and never runs it again; the rest of its units go back to the front of the queue for
  the other workers and the replacement xdist starts. pytest-xdist 3.8's own loadscope scheduling reran the test
  that killed the worker (killing the next one), gave work to a replacement before its collection arrived
  (INTERNALERROR KeyError in `_assign_work_unit`) and could leave a worker holding one test forever (a worker runs a
  test only once it knows the next one), so the run hung.
- Each worker writes its file descriptors 1 and 2 (native output: XLA, TensorFlow, faulthandler) to
  <a temporary directory>/<worker>.log, a marker line before each test; Python output is captured per test as usual
  (pytest.ini: --capture=sys, so that native output reaches the log even when the process dies mid-test).
"""

import faulthandler
import os
import shutil
import tempfile

import pytest

# Modules whose tests share an expensive module-scoped fixture or cache (a compiled step, an unsharded reference
# run): each runs on one worker, as one unit, so that the fixture is made once. pytest-xdist's xdist_group mark
# would say this in the module, but under pytest 9.2 it no longer groups anything (pytest-dev/pytest-xdist#1386).
ONE_WORKER_MODULES = ("test_aot.py", "test_sharding.py", "test_glue.py")

# What a crash report quotes of the dead worker's log: the end of what it wrote during the test that crashed.
CRASH_TAIL_CHARS = 6000
_MARKER = "\n===== bert_jax test start: "


def _module(nodeid):
    return os.path.basename(nodeid.split("::", 1)[0])


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown with -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    """--dist=loadgroup's scheduler, with every module of ONE_WORKER_MODULES one unit (any other test its own) and
    a dead worker's tests handled as the module docstring says."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling  # pylint: disable=import-outside-toplevel

    class ModuleGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0]
            return module if _module(nodeid) in ONE_WORKER_MODULES else super()._split_scope(nodeid)

        def remove_node(self, node):
            # Its collection stays registered, as in xdist: the count of collections says when collection is done.
            workload = self.assigned_work.pop(node)
            pending = [(scope, nodeid) for scope, unit in workload.items()
                       for nodeid, completed in unit.items() if not completed]
            if not pending:
                return None
            # A worker runs what it was sent in order: the first test not completed is the one it died in. xdist
            # reports it failed; it is marked done here so that no other worker runs it (and dies) again.
            crash_scope, crashitem = pending[0]
            workload[crash_scope][crashitem] = True
            for scope in reversed([scope for scope, unit in workload.items() if not all(unit.values())]):
                self.workqueue[scope] = workload[scope]
                self.workqueue.move_to_end(scope, last=False)
            for other in self.nodes:
                self._reschedule(other)
            return crashitem

        def _assign_work_unit(self, node):
            try:
                super()._assign_work_unit(node)
            except OSError:
                # The worker died after its last report, before this send ("cannot send (already closed?)"): its
                # errordown event comes next, and remove_node puts this unit back with the rest of its work.
                pass

        def _reschedule(self, node):
            # A replacement worker is scheduled once its collection arrives (schedule() runs then), not before.
            if node in self.registered_collections:
                super()._reschedule(node)

    return ModuleGroups(config, log)


# --- the workers' logs -------------------------------------------------------------------------------------------

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Controller: tell each worker (replacements too) where to write its log."""
    node.workerinput["bert_jax_worker_log_dir"] = node.config.bert_jax_worker_log_dir


_WORKER_LOG = []  # in a worker: its log file, once pytest_configure has opened it


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    if config.pluginmanager.has_plugin("xdist") and not hasattr(config, "workerinput"):
        config.bert_jax_worker_log_dir = tempfile.mkdtemp(prefix="bert_jax_workers_")
        return
    directory = getattr(config, "workerinput", {}).get("bert_jax_worker_log_dir")
    if directory is None:
        return
    log = open(os.path.join(directory, config.workerinput["workerid"] + ".log"), "a", encoding="utf-8",
               buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    _WORKER_LOG.append(log)
    # After pytest's own faulthandler set-up (trylast): a fatal signal's traceback goes to the log too.
    faulthandler.enable(file=log, all_threads=True)


def pytest_unconfigure(config):
    directory = getattr(config, "bert_jax_worker_log_dir", None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def pytest_runtest_logstart(nodeid, location):
    del location
    for log in _WORKER_LOG:
        log.write(f"{_MARKER}{nodeid}\n")
        log.flush()


def worker_log_tail(directory, worker_id, nodeid):
    """What the worker wrote since it started `nodeid`, at most CRASH_TAIL_CHARS from the end."""
    try:
        with open(os.path.join(directory, worker_id + ".log"), encoding="utf-8", errors="replace") as log:
            text = log.read()
    except OSError as error:
        return f"(no worker log: {error})"
    start = text.rfind(f"{_MARKER}{nodeid}\n")
    text = text[start + len(_MARKER) + len(nodeid) + 1:] if start >= 0 else text
    return text[-CRASH_TAIL_CHARS:] if text.strip() else "(the worker wrote nothing during this test)"


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """Controller: the failure of the test a worker died in quotes the end of that worker's log."""
    del sched
    directory = getattr(report.node.config, "bert_jax_worker_log_dir", None)
    if directory is None:
        return
    tail = worker_log_tail(directory, report.node.gateway.id, crashitem)
    report.longrepr = f"{report.longrepr}\n--- the end of worker {report.node.gateway.id}'s output ---\n{tail}"


# --- order -------------------------------------------------------------------------------------------------------

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
