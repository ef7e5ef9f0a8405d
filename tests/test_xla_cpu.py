"""The driver's XLA:CPU options (bert_jax.runtime.CPU_XLA_FLAGS, which tests/conftest.py sets too) take effect, the
reductions they fuse stay exact, the steps' dots are oneDNN's only where chosen, and steps can be freed at any time."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# XLA:CPU as users' runs compile with it: full optimisation (tests/conftest.py).
pytestmark = pytest.mark.xla_optimized


def test_cpu_dots_are_chosen_by_instruction_set_and_the_users_settings_stand(monkeypatch):
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    monkeypatch.delenv(runtime.CPU_DOTS_VARIABLE, raising=False)
    avx512, avx2 = {"avx2", "avx512f", "fma"}, {"avx2", "fma"}
    assert runtime.cpu_dots("", avx512) == "onednn" and runtime.cpu_dots("", avx2) == "eigen"
    # XLA's instruction set cap (the AVX pass of .ci/run) or oneDNN options of the user's own: no per-program dots.
    assert runtime.cpu_dots("--xla_cpu_max_isa=AVX", avx512) == "eigen"
    assert runtime.cpu_dots("--xla_cpu_use_onednn=true", avx512) == "eigen"
    monkeypatch.setenv(runtime.CPU_DOTS_VARIABLE, "onednn")
    assert runtime.cpu_dots("", avx2) == "onednn"
    assert runtime.step_compiler_options("cpu") == runtime.ONEDNN_DOT_OPTIONS
    assert runtime.step_compiler_options("tpu") is None and runtime.step_compiler_options("gpu") is None
    monkeypatch.setenv(runtime.CPU_DOTS_VARIABLE, "eigen")
    assert runtime.cpu_dots("", avx512) == "eigen" and runtime.step_compiler_options("cpu") is None
    monkeypatch.setenv(runtime.CPU_DOTS_VARIABLE, "mkl")
    with pytest.raises(ValueError, match="BERT_JAX_CPU_DOTS='mkl': must be one of auto, eigen, onednn"):
        runtime.cpu_dots()


@pytest.mark.parametrize("dots", ["eigen", "onednn"])
def test_the_steps_dots_are_onednns_only_where_chosen_and_other_programs_keep_xlas(monkeypatch, dots):
    from bert_jax import runtime, sharding, train  # pylint: disable=import-outside-toplevel
    monkeypatch.setenv(runtime.CPU_DOTS_VARIABLE, dots)
    mesh = sharding.create_mesh({"dcn_data": 1, "data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1])
    operand = jnp.ones((64, 64), jnp.float32)
    step = train._jit_step(lambda x: x @ x, mesh)  # pylint: disable=protected-access  # as jit_train_step's
    assert isinstance(step, train.KeptUntilDone) == (dots == "onednn")  # the guard where the abort can happen
    assert ("__onednn_fusion" in step.lower(operand).compile().as_text()) == (dots == "onednn")
    np.testing.assert_allclose(np.asarray(step(operand)), np.full((64, 64), 64.0))
    assert "__onednn_fusion" not in jax.jit(lambda x: x @ x).lower(operand).compile().as_text()


# Compiles and runs a fresh program per iteration and lets go of it at once (what a test's or a job's short-lived
# step does), with oneDNN's dots as the steps get them. Unguarded, the running execution ends up as the program's last
# owner and frees it on XLA's thread pool: XLA:CPU's oneDNN fusion thunk then aborted the process with
# `object_pool.h:117] Check failed: available_.size() == num_created_ (0 vs. 1)` in ~OneDnnFusionThunk (jaxlib
# 0.10.2, 2-core AMD EPYC: in 1 of the first 4 runs of 300 iterations; it killed pytest workers mid-suite when the
# options were process-wide); and, on a loaded AMD EPYC with AVX-512, also when freed just after its outputs were
# ready (the clear_caches below). train.KeptUntilDone, which every step with oneDNN's dots is, waits for the last
# run and then keeps the program until later ones push it out.
_FREED_WHILE_RUNNING = """
import jax, jax.numpy as jnp, numpy as np
from bert_jax import runtime, train
x = jnp.asarray(np.random.default_rng(0).normal(size=(64, 64)), jnp.float32)
for i in range(ITERATIONS):
    scale = float(i % 7 + 1)
    program = train.KeptUntilDone(jax.jit(lambda a: jnp.tanh(a @ a.T * scale) @ a,
                                          compiler_options=runtime.ONEDNN_DOT_OPTIONS))
    y = program(x)
    del program
    if i % 5 == 0:
        jax.clear_caches()
y.block_until_ready()
print("done")
"""


@pytest.mark.slow
def test_steps_freed_while_they_run_do_not_abort_the_process():
    from bert_jax import runtime  # pylint: disable=import-outside-toplevel
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": runtime.with_cpu_xla_flags("")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # each program compiled afresh, as the abort needed, not fetched
    script = _FREED_WHILE_RUNNING.replace("ITERATIONS", "400")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=280,
                            check=False, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
