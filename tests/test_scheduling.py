"""The suite's own scheduling (tests/xdist_scheduling.py): a worker that dies fails the test it was running, with
what the worker wrote last, and the run still ends with a verdict on every other test. The suite's profile
(tests/profile_suite.py) names the CPU it was made on."""

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An inner suite: a module run as one unit (its name is in ONE_WORKER_MODULES) whose second test aborts the process
# after native code wrote to fd 2, single-test units of which one is killed with SIGKILL, and one test stuck past
# its pytest-timeout limit (thread method: the worker is ended with a stack dump).
_INNER = {
    "test_sharding.py": """
        import os, time

        def test_one():
            time.sleep(0.3)

        def test_dies():
            os.write(2, b"native message before the abort\\n")
            os.abort()

        def test_three():
            time.sleep(0.3)
        """,
    "test_other.py": """
        import os, signal, time
        import pytest

        @pytest.mark.parametrize("number", range(6))
        def test_quick(number):
            time.sleep(0.3)

        def test_killed():
            os.kill(os.getpid(), signal.SIGKILL)

        @pytest.mark.timeout(2)
        def test_stuck():
            time.sleep(60)

        def test_last():
            time.sleep(0.3)
        """,
}
_FAILED = {"test_sharding.py::test_dies", "test_other.py::test_killed", "test_other.py::test_stuck"}


def _outcomes(junit_path):
    """{nodeid: [outcome per report]}: a test run twice shows up twice."""
    outcomes = {}
    for case in ElementTree.parse(junit_path).iter("testcase"):
        module = case.get("classname").replace(".", "/") + ".py"
        failed = case.find("failure") is not None or case.find("error") is not None
        outcome = "failed" if failed else "skipped" if case.find("skipped") is not None else "passed"
        outcomes.setdefault(f"{module}::{case.get('name')}", []).append(outcome)
    return outcomes


@pytest.mark.timeout(240)
def test_dead_workers_fail_only_their_test_with_their_last_output_and_the_run_ends(tmp_path):
    for name, source in _INNER.items():
        (tmp_path / name).write_text(textwrap.dedent(source))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the outer suite's options
    # Nor the outer run's PYTEST_ADDOPTS (e.g. --profile-json, an option of the outer suite's conftest).
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "PYTHONPATH": ROOT}
    junit = tmp_path / "junit.xml"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.xdist_scheduling", "--numprocesses=2", "--dist=loadgroup",
         "--no-loadscope-reorder", "--capture=sys", "--timeout-method=thread", "-v", f"--junitxml={junit}",
         "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "INTERNALERROR" not in output, output
    outcomes = _outcomes(junit)
    expected = {f"test_other.py::test_quick[{number}]" for number in range(6)} | {
        "test_sharding.py::test_one", "test_sharding.py::test_three", "test_other.py::test_last"} | _FAILED
    assert set(outcomes) == expected, output
    for nodeid, reports in outcomes.items():  # each test ran once: a dead worker's test is not run again
        assert reports == ["failed" if nodeid in _FAILED else "passed"], (nodeid, reports, output)
    for nodeid in _FAILED:
        assert f"crashed while running '{nodeid}'" in output, output
    # The failure quotes what the worker wrote during that test: the native write, Python's fault traceback naming
    # the test's line, and pytest-timeout's stack dump.
    assert "native message before the abort" in output and "Fatal Python error: Aborted" in output, output
    assert 'test_sharding.py", line 9 in test_dies' in output, output
    assert "Timeout" in output and "in test_stuck" in output, output


def test_the_profile_names_the_cpu_it_was_made_on(tmp_path):
    from tests import profile_suite  # pylint: disable=import-outside-toplevel
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
                       "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n\n"
                       "processor\t: 1\nmodel name\t: another\n")
    assert profile_suite.host_description(str(cpuinfo), 2) == "AMD EPYC (family 26, model 2), 2 CPUs, AVX-512"
    cpuinfo.write_text("model name\t: Intel Xeon\ncpu family\t: 6\nmodel\t\t: 85\nflags\t\t: sse2 avx avx2 fma\n")
    assert profile_suite.host_description(str(cpuinfo), 4) == "Intel Xeon (family 6, model 85), 4 CPUs, AVX2"
    assert profile_suite.host_description(str(tmp_path / "absent"), 2) == "unknown CPU"
