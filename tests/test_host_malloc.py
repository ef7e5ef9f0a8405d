"""bert_jax.host_malloc: XLA:CPU step memory is reused instead of faulted in afresh, and only where JAX runs on CPU."""

import os
import subprocess
import sys
import textwrap

import pytest

from bert_jax import host_malloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A jitted step with a 64 MiB temporary (the operand of a matrix-vector product) that XLA:CPU allocates from a worker
# thread and frees on every call, as it does a train step's temporaries. Prints whether the settings were applied,
# then the minor page faults per page of that array for each of 20 calls.
_FAULTS = textwrap.dedent("""
    import resource
    import bert_jax
    from bert_jax import host_malloc
    import jax, jax.numpy as jnp
    x = jnp.ones((16 * 2**20,), jnp.float32)
    step = jax.jit(lambda v: (v * 2.0).reshape(4096, 4096) @ v[:4096])
    ratios = []
    for _ in range(20):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step(x).block_until_ready()
        ratios.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (x.nbytes / 4096))
    print(host_malloc.state[0], *ratios)
""")


def _faults_per_page(mode):
    env = dict(os.environ, BERT_JAX_HOST_MALLOC=mode, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    result = subprocess.run([sys.executable, "-c", _FAULTS], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    applied, *ratios = result.stdout.split()
    return applied == "True", [float(ratio) for ratio in ratios]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_tuned_allocator_reuses_step_memory_and_system_faults_it_in_every_call():
    applied, tuned = _faults_per_page("tuned")
    assert applied
    # Once the heap has grown to the working set, calls touch no fresh page. (XLA releases some buffers after a call
    # returns, and glibc may split a free block for a small request, so the heap still grows now and then.)
    reused = [ratio < 0.05 for ratio in tuned[4:]]
    assert sum(reused) >= len(reused) // 2, tuned
    applied, system = _faults_per_page("system")
    assert not applied
    # glibc's default: each block is mmapped and unmapped on every call, so every page faults again, every call.
    assert min(system[4:]) > 0.8, system


def test_auto_applies_only_where_jax_runs_on_cpu(monkeypatch):
    monkeypatch.setattr(host_malloc, "state", host_malloc.state)  # restored afterwards
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert host_malloc._accelerator_expected() == "JAX_PLATFORMS=tpu"
    applied, why = host_malloc.configure("auto")
    assert not applied and "JAX_PLATFORMS=tpu" in why
    assert host_malloc.configure("system") == (False, "BERT_JAX_HOST_MALLOC=system")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert host_malloc._accelerator_expected() is None


def test_unknown_mode_names_the_variable_and_the_choices():
    with pytest.raises(ValueError, match=r"BERT_JAX_HOST_MALLOC='fast'.*'auto', 'tuned', 'system'"):
        host_malloc.configure("fast")
    env = dict(os.environ, BERT_JAX_HOST_MALLOC="fast")
    result = subprocess.run([sys.executable, "-c", "import bert_jax"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and "BERT_JAX_HOST_MALLOC='fast'" in result.stderr
