"""The driver's XLA:CPU options (bert_jax.runtime.CPU_XLA_FLAGS, which tests/conftest.py sets too) take effect, the
reductions they fuse stay exact, and the programs they compile can be freed at any time."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# XLA:CPU as users' runs compile with it: full optimisation (tests/conftest.py).
pytestmark = pytest.mark.xla_optimized


def test_cpu_dots_do_not_use_the_onednn_fusion_thunk():
    # XLA:CPU's oneDNN fusion thunk (--xla_cpu_experimental_onednn_fusion_type=individual_dot) aborts the process
    # when a program is freed while it runs (the next test); XLA's own dots are what the driver compiles.
    operand = jnp.ones((64, 64), jnp.float32)
    compiled = jax.jit(lambda x: x @ x).lower(operand).compile().as_text()
    assert "__onednn_fusion" not in compiled and " dot(" in compiled, compiled


# Compiles and runs a fresh program per iteration and lets go of it at once: the running execution ends up as the
# program's last owner and frees it on XLA's thread pool (what a test's or a job's short-lived jax.jit does). With
# the oneDNN fusion thunk one run in two or three of this aborted the process (jaxlib 0.10.2, 2-core AMD EPYC, AVX2
# without AVX-512) with `object_pool.h:117] Check failed: available_.size() == num_created_ (0 vs. 1)` in
# ~OneDnnFusionThunk; the same abort killed pytest workers mid-suite in different tests.
_FREED_WHILE_RUNNING = """
import jax, jax.numpy as jnp, numpy as np
x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32)
for i in range(ITERATIONS):
    scale = float(i % 7 + 1)
    program = jax.jit(lambda a: jnp.tanh(a @ a.T * scale) @ a)
    y = program(x)
    del program
    if i % 5 == 0:
        jax.clear_caches()
y.block_until_ready()
print("done")
"""


@pytest.mark.slow
def test_programs_freed_while_they_run_do_not_abort_the_process():
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": runtime.with_cpu_xla_flags("")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # each program compiled afresh, as the abort needed, not fetched
    script = _FREED_WHILE_RUNNING.replace("ITERATIONS", "400")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=280,
                            check=False)
    assert result.returncode == 0 and "done" in result.stdout, result.stderr[-3000:]


_REDUCTIONS = {
    # name: (jax function, numpy float64 reference, compiled as a ynn fusion), on x [8, 32, 96] and a constant
    # c [96, 40]. XLA turns a matrix-vector product with ones into a dot followed by a reduce-window, without ynn.
    "column_sum": (lambda x, c: jnp.sum(x, (0, 1)), lambda x, c: x.sum((0, 1)), True),
    "sum_of_squares": (lambda x, c: jnp.sum(x * x), lambda x, c: np.square(x).sum(), True),
    "mean_last": (lambda x, c: jnp.mean(x, -1), lambda x, c: x.mean(-1), True),
    "var_last": (lambda x, c: jnp.var(x, -1), lambda x, c: x.var(-1), True),
    "max_last": (lambda x, c: jnp.max(x, -1), lambda x, c: x.max(-1), True),
    "logsumexp": (lambda x, c: jax.nn.logsumexp(x, -1), lambda x, c: np.log(np.exp(x).sum(-1)), True),
    "dot_with_constant_then_sum": (lambda x, c: jnp.sum(x @ jnp.asarray(c), (0, 1)),
                                   lambda x, c: (x @ c).sum((0, 1)), True),
    "dot_with_ones_then_sum": (lambda x, c: jnp.sum(x @ jnp.ones((96,), jnp.float32)), lambda x, c: x.sum(), False),
}


@pytest.mark.parametrize("name", sorted(_REDUCTIONS))
def test_cpu_reductions_under_the_ynn_reduce_fusion_equal_numpy(name):
    """XLA:CPU's "ynn" fusion for reductions (bias gradients, LayerNorm statistics, softmax, the global gradient
    norm): every kind of reduction the step uses stays finite and equals float64 numpy. Its dot fusions, which
    returned NaN for a dot with a constant operand fused into a reduction, stay off."""
    assert "--xla_cpu_experimental_ynn_fusion_type=reduce" in os.environ["XLA_FLAGS"].split()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 32, 96)).astype(np.float32)
    c = rng.standard_normal((96, 40)).astype(np.float32)
    fn, reference, via_ynn = _REDUCTIONS[name]
    jitted = jax.jit(lambda x: fn(x, c))
    assert ("__ynn_fusion" in jitted.lower(jnp.asarray(x)).compile().as_text()) == via_ynn, name
    out = np.asarray(jitted(jnp.asarray(x)))
    expected = reference(x.astype(np.float64), c.astype(np.float64))
    assert np.all(np.isfinite(out)), f"{name}: non-finite values from XLA:CPU"
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=2e-5 * float(np.abs(expected).max()))
