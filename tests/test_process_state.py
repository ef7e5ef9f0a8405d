"""Importing bert_jax changes no process-wide state; the driver sets the XLA:CPU options, and the user's win."""

import json
import os
import stat
import subprocess
import sys

from absl import app
import pytest

from bert_jax import main as driver
from bert_jax import runtime
from tests.helpers import ROOT

# Imports the package and every module in it in one fresh process and prints, as JSON, what changed: the variables
# each import changed, whether the environment after all of them equals the one before, and how glibc serves a large
# malloc before and after (mmapped by default; from the heap once M_MMAP_MAX=0, as an allocator tuning would set).
_IMPORT_ALL = r"""
import ctypes, importlib, json, os, pkgutil, sys
import jax, tensorflow  # noqa: F401  (they set variables of their own when imported: jax with libtpu, and TF)
from absl import flags


def large_malloc_is_mmapped():
    try:
        libc = ctypes.CDLL(None)
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None  # not glibc >= 2.33
    fields = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
              "keepcost")
    mallinfo2.restype = type("MallInfo2", (ctypes.Structure,), {"_fields_": [(f, ctypes.c_size_t) for f in fields]})
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    mapped = mallinfo2().hblks
    block = libc.malloc(64 << 20)
    mapped = mallinfo2().hblks > mapped
    libc.free(block)
    return mapped


before, mmapped_before, by_module = dict(os.environ), large_malloc_is_mmapped(), {}
import bert_jax
if dict(os.environ) != before:
    by_module["bert_jax"] = sorted(k for k in before.keys() | os.environ.keys() if before.get(k) != os.environ.get(k))
modules = ["bert_jax"]
for module in pkgutil.walk_packages(bert_jax.__path__, "bert_jax."):
    environment, defined = dict(os.environ), set(flags.FLAGS)
    importlib.import_module(module.name)
    modules.append(module.name)
    # Scripts define absl flags, some under the same names: each one's are dropped before the next is imported.
    for name in set(flags.FLAGS) - defined:
        delattr(flags.FLAGS, name)
    changed = sorted(k for k in environment.keys() | os.environ.keys() if environment.get(k) != os.environ.get(k))
    if changed:
        by_module[module.name] = changed
print(json.dumps({"modules": modules, "by_module": by_module, "environment_equal": dict(os.environ) == before,
                  "mmapped": [mmapped_before, large_malloc_is_mmapped()], "keras": "keras" in sys.modules}))
"""


@pytest.fixture(scope="module")
def import_report(tmp_path_factory):
    """_IMPORT_ALL's report, with any C/C++ compiler a module might start recording that it ran, and caches
    in a fresh directory."""
    tmp_path = tmp_path_factory.mktemp("imports")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    marker = tmp_path / "compiler_ran"
    for name in ("c++", "g++", "gcc", "cc", "clang", "clang++"):
        path = fake_bin / name
        path.write_text(f"#!/bin/sh\necho \"$0 $*\" >> {marker}\nexit 1\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    cache = tmp_path / "cache"
    env = dict(os.environ, JAX_PLATFORMS="cpu", PATH=f"{fake_bin}:{os.environ['PATH']}", CXX=str(fake_bin / "c++"),
               CC=str(fake_bin / "cc"), XDG_CACHE_HOME=str(cache), BERT_JAX_CACHE_DIR=str(cache / "bert_jax"))
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["compiler_ran"] = marker.read_text() if marker.exists() else ""
    report["cached"] = sorted(str(path) for path in cache.rglob("*")) if cache.exists() else []
    return report


def test_importing_any_module_changes_no_environment_variable_allocator_setting_or_build(import_report):
    assert {"bert_jax.main", "bert_jax.model", "bert_jax.data.input_pipeline",
            "bert_jax.benchmarks.step"} <= set(import_report["modules"])
    changed = import_report["by_module"]
    assert changed == {} and import_report["environment_equal"], (
        f"importing these modules changed environment variables: {changed}")
    if import_report["mmapped"][0] is not None:
        assert import_report["mmapped"] == [True, True], "an import changed glibc's malloc settings (mallopt)"
    assert not import_report["compiler_ran"], f"an import started a compiler: {import_report['compiler_ran']}"
    assert import_report["cached"] == [], "an import wrote to a cache directory"
    # TensorFlow imported with the driver's TF_USE_LEGACY_KERAS=1 (the suite's too): no Keras, 2.3 s less.
    assert os.environ.get("TF_USE_LEGACY_KERAS") == "1" and not import_report["keras"]


def test_the_driver_sets_its_xla_cpu_flags_before_jax_starts_and_the_users_win(monkeypatch):
    seen = []
    monkeypatch.setattr(app, "run", lambda main, **kwargs: seen.append(os.environ["XLA_FLAGS"]))
    monkeypatch.delenv("XLA_FLAGS")
    driver.run()
    assert seen[-1].split() == [f"--{name}={value}" for name, value in runtime.CPU_XLA_FLAGS]
    # A flag the user names, with any value (an empty one too), is left as the user wrote it.
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_experimental_ynn_fusion_type=")
    driver.run()
    assert seen[-1].split() == ["--xla_force_host_platform_device_count=2", "--xla_cpu_experimental_ynn_fusion_type="]
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    driver.run()
    assert seen[-1].split() == ["--xla_force_host_platform_device_count=2",
                                "--xla_cpu_experimental_ynn_fusion_type=reduce"]
    assert runtime.with_cpu_xla_flags(seen[-1]) == seen[-1]  # idempotent: launch/local.sh and run() both add them


def test_the_driver_imports_tensorflow_without_keras_unless_the_user_says_otherwise(monkeypatch):
    monkeypatch.setattr(app, "run", lambda main, **kwargs: None)
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    driver.run()
    assert os.environ["TF_USE_LEGACY_KERAS"] == "1"
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    driver.run()
    assert os.environ["TF_USE_LEGACY_KERAS"] == "0"
