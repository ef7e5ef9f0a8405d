"""Where the suite's time goes: a pytest plugin that records it, and a script that prints it.

Record (any pytest run; loaded by tests/conftest.py):

    python -m pytest --profile-json=/tmp/profile.json      (or PYTEST_ADDOPTS=--profile-json=... .ci/run)

Each test's setup, call and teardown seconds, the seconds its own process spent in JAX compilation (tracing, lowering
to MLIR and the XLA compile or the persistent cache's fetch, from `jax.monitoring`'s duration events), the persistent
compilation cache's hits and misses there (tests/compile_cache.py), the programs it compiled (by the function's name:
how many times, how many seconds) and the processes it started (driver subprocesses compile in their own process:
their time shows as run time), and the CPU seconds of the test's process and of the processes it started and waited
for (what the run's cores did; above the seconds where the test ran on several threads, below where it waited).
The profile also names the CPU it was made on (its model, family, cores and widest vector instructions).

Print (one profile, or two side by side):

    python tests/profile_suite.py /tmp/profile.json [/tmp/profile_after.json] [--top 25]
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import time

import pytest

# jax.monitoring's duration events that make up a compilation in the test's process.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)
BACKEND_COMPILE = COMPILE_EVENTS[-1]  # XLA's compile or the cache's fetch, of one program: its name comes with it

class _Recorder:
    """What this process records of the test it runs (counters reset at each test's start), and, in the process that
    reports (the xdist controller, or the only process), every test's entry."""

    def __init__(self):
        self.listening = False
        self.config = None
        self.tests = {}
        self.started = time.time()
        self.reset()

    def reset(self):
        self.compile_s, self.processes, self.cache = 0.0, 0, {"hits": 0, "misses": 0}
        self.times = os.times()
        self.programs = {}  # function name -> [compiles, seconds]

    def on_duration(self, event, duration, **kwargs):
        if event in COMPILE_EVENTS:
            self.compile_s += duration
        if event == BACKEND_COMPILE:
            program = self.programs.setdefault(kwargs.get("fun_name", "?"), [0, 0.0])
            program[0] += 1
            program[1] = round(program[1] + duration, 3)

    def on_event(self, event, **kwargs):
        del kwargs
        kind = event.rsplit("_", 1)[-1]
        if event.startswith("/jax/compilation_cache/cache_") and kind in self.cache:
            self.cache[kind] += 1

    def count_processes(self, init):
        def counted(popen, *args, **kwargs):
            self.processes += 1
            return init(popen, *args, **kwargs)
        return counted


_RECORDER = _Recorder()


def pytest_addoption(parser):
    parser.addoption("--profile-json", default=None, metavar="PATH",
                     help="write each test's time, its compile seconds and its subprocess count to PATH "
                          "(print it with `python tests/profile_suite.py PATH`)")


def pytest_configure(config):
    if not config.getoption("profile_json"):
        return
    _RECORDER.config = config
    if not _RECORDER.listening:
        _RECORDER.listening = True
        from jax import monitoring  # the workers' jax: conftest has set the platform and flags already
        monitoring.register_event_duration_secs_listener(_RECORDER.on_duration)
        monitoring.register_event_listener(_RECORDER.on_event)
        subprocess.Popen.__init__ = _RECORDER.count_processes(subprocess.Popen.__init__)


def pytest_runtest_logstart(nodeid, location):
    del nodeid, location
    _RECORDER.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    # Runs in the process that ran the test (an xdist worker); user_properties travel with the report.
    if _RECORDER.config is not None and call.when == "teardown":
        now, then = os.times(), _RECORDER.times
        own = (now.user + now.system) - (then.user + then.system)
        children = (now.children_user + now.children_system) - (then.children_user + then.children_system)
        item.user_properties.append(("profile", {"compile_s": round(_RECORDER.compile_s, 3),
                                                 "cpu_s": round(own, 3), "children_cpu_s": round(children, 3),
                                                 "processes": _RECORDER.processes, "cache": dict(_RECORDER.cache),
                                                 "programs": dict(_RECORDER.programs)}))


def pytest_runtest_logreport(report):
    if _RECORDER.config is None:
        return
    entry = _RECORDER.tests.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and report.when == "setup":
        entry["outcome"] = "skipped"
    for name, value in report.user_properties:
        if name == "profile":
            entry.update(value)


def pytest_sessionfinish(session):
    path = session.config.getoption("profile_json")
    if not path or hasattr(session.config, "workerinput"):
        return
    # Never over another run's profile (PYTEST_ADDOPTS reaches every pytest of a script): PATH.2, PATH.3, ...
    taken, n = path, 1
    while os.path.exists(path):
        n += 1
        path = f"{taken}.{n}"
    with open(path, "w") as f:
        json.dump({"tests": _RECORDER.tests, "wall_s": round(time.time() - _RECORDER.started, 1),
                   "host": host_description()}, f, indent=1, sort_keys=True)


def host_description(cpuinfo_path="/proc/cpuinfo", cpu_count=None):
    """The CPU the profile was made on, e.g. 'AMD EPYC (family 26, model 2), 2 CPUs, AVX-512': hosts that share a
    model name differ severalfold in the suite's time, so profiles are compared only on the same one."""
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    fields = runtime.cpu_info(cpuinfo_path)
    if not fields:
        return "unknown CPU"
    flags = fields.get("flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return (f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, model "
            f"{fields.get('model', '?')}), {cpu_count or os.cpu_count()} CPUs, {isa}")


# ---- printing -------------------------------------------------------------------------------------------------------

def _module(nodeid):
    return nodeid.split("::")[0]


def _by_module(tests):
    modules = collections.defaultdict(lambda: {"seconds": 0.0, "compile_s": 0.0, "cpu_s": 0.0, "tests": 0,
                                               "processes": 0})
    for nodeid, entry in tests.items():
        m = modules[_module(nodeid)]
        m["seconds"] += entry["seconds"]
        m["compile_s"] += entry.get("compile_s", 0.0)
        m["processes"] += entry.get("processes", 0)
        m["cpu_s"] += _cpu(entry)  # the processes' and their children's together
        m["tests"] += 1
    return modules


def _cpu(entry):
    """CPU seconds of a test's process and the processes it waited for (absent in older profiles: 0)."""
    return entry.get("cpu_s", 0.0) + entry.get("children_cpu_s", 0.0)


def _table(title, rows, top):
    print(f"\n{title}")
    print(f"{'seconds':>9} {'compile':>8} {'run':>8} {'cpu':>8} {'procs':>5} {'tests':>5}  name")
    for name, r in sorted(rows.items(), key=lambda kv: -kv[1]["seconds"])[:top]:
        print(f"{r['seconds']:9.1f} {r.get('compile_s', 0.0):8.1f} {r['seconds'] - r.get('compile_s', 0.0):8.1f} "
              f"{_cpu(r):8.1f} "
              f"{r.get('processes', 0):5d} {r.get('tests', 1):5d}  {name}")


def _programs(label, tests, top):
    """The programs compiled in the tests' processes, by the seconds all their compiles took: what a shared fixture
    or a shape shared between tests would save."""
    programs = collections.defaultdict(lambda: [0, 0.0, 0])  # compiles, seconds, tests
    for entry in tests.values():
        for name, (count, seconds) in entry.get("programs", {}).items():
            programs[name][0] += count
            programs[name][1] += seconds
            programs[name][2] += 1
    if not programs:
        return
    print(f"\n{label}: programs (XLA compiles and cache fetches in the tests' processes)")
    print(f"{'seconds':>9} {'compiles':>8} {'tests':>5}  function")
    for name, (count, seconds, test_count) in sorted(programs.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{seconds:9.1f} {count:8d} {test_count:5d}  {name}")


def _summary(label, data):
    tests = data["tests"]
    total = sum(e["seconds"] for e in tests.values())
    compile_s = sum(e.get("compile_s", 0.0) for e in tests.values())
    outcomes = collections.Counter(e["outcome"] for e in tests.values())
    hits = sum(e.get("cache", {}).get("hits", 0) for e in tests.values())
    misses = sum(e.get("cache", {}).get("misses", 0) for e in tests.values())
    cpu_s = sum(_cpu(e) for e in tests.values())
    print(f"{label}: made on {data.get('host', 'an unrecorded host')}")
    print(f"{label}: {len(tests)} tests ({dict(outcomes)}), wall {data.get('wall_s', 0):.0f} s, "
          f"{total:.0f} worker-seconds of which {compile_s:.0f} compiling in the test's process, "
          f"{sum(e.get('processes', 0) for e in tests.values())} subprocesses started; persistent compilation cache "
          f"in the tests' processes: {hits} hits, {misses} misses")
    if cpu_s:
        print(f"{label}: {cpu_s:.0f} CPU-seconds in the tests' processes and the processes they waited for "
              f"({cpu_s / max(total, 1e-9):.2f} per worker-second)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profiles", nargs="+", help="one profile, or before and after")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    loaded = []
    for path in args.profiles:
        with open(path) as f:
            loaded.append((os.path.basename(path), json.load(f)))
    for label, data in loaded:
        _summary(label, data)
    for label, data in loaded:
        _table(f"{label}: modules", _by_module(data["tests"]), args.top)
        _table(f"{label}: tests", data["tests"], args.top)
        _programs(label, data["tests"], args.top)
    if len(loaded) == 2:
        (_, before), (_, after) = loaded
        b, a = _by_module(before["tests"]), _by_module(after["tests"])
        print(f"\nmodules side by side (worker-seconds)\n{'before':>9} {'after':>9} {'saved':>9}  module")
        for name in sorted(set(b) | set(a), key=lambda n: -b.get(n, {"seconds": 0})["seconds"]):
            sb, sa = b.get(name, {"seconds": 0.0})["seconds"], a.get(name, {"seconds": 0.0})["seconds"]
            print(f"{sb:9.1f} {sa:9.1f} {sb - sa:9.1f}  {name}")


if __name__ == "__main__":
    sys.exit(main())
