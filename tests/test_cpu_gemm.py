"""The BLAS matmul custom call (bert_jax.cpu_gemm) and the model's choice of it (model.matmul)."""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import cpu_gemm
from bert_jax import model as model_lib
from tests import helpers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", autouse=True)
def _built():
    reason = cpu_gemm.unavailable_reason()
    assert reason is None, f"the custom call should build on the test machine (it has g++): {reason}"


def _op(x, transpose):
    return np.swapaxes(x, -1, -2) if transpose else x


# Shapes: 2-D ones split into tiles over XLA's threads along rows (M >= N) and along columns (N > M), odd sizes
# that do not divide evenly, and batched ones (attention's [batch, heads, length, dim]).
@pytest.mark.parametrize("shape_a,shape_b", [((300, 70), (70, 130)), ((130, 70), (70, 301)),
                                             ((5, 257, 65), (5, 65, 33)), ((2, 3, 40, 16), (2, 3, 16, 40))])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matmul_and_gradients_equal_references(shape_a, shape_b, transpose_a, transpose_b):
    rng = np.random.default_rng(0)
    a = _op(rng.standard_normal(shape_a).astype(np.float32), transpose_a)
    b = _op(rng.standard_normal(shape_b).astype(np.float32), transpose_b)
    expected = _op(a, transpose_a).astype(np.float64) @ _op(b, transpose_b).astype(np.float64)
    product = jax.jit(lambda x, y: cpu_gemm.matmul(x, y, transpose_a, transpose_b))(a, b)
    assert product.shape == expected.shape
    np.testing.assert_allclose(np.asarray(product), expected, atol=5e-5, rtol=1e-5)

    cotangent = rng.standard_normal(expected.shape).astype(np.float32)

    def loss(matmul):
        return lambda x, y: jnp.sum(matmul(x, y) * cotangent)

    grads = jax.jit(jax.grad(loss(lambda x, y: cpu_gemm.matmul(x, y, transpose_a, transpose_b)), (0, 1)))(a, b)
    reference = jax.grad(loss(lambda x, y: jnp.matmul(_op(x, transpose_a), _op(y, transpose_b),
                                                      precision="highest")), (0, 1))(a, b)
    for got, want in zip(grads, reference):
        assert got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5, rtol=1e-5)


def test_dot_general_is_a_drop_in_for_dense_and_falls_back():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((4, 9, 24)), jnp.float32)
    dense = nn.Dense(40, dot_general=cpu_gemm.dot_general)
    params = dense.init(jax.random.key(0), x)
    reference = nn.Dense(40).apply(params, x)
    hlo = jax.jit(dense.apply).lower(params, x).as_text()
    assert cpu_gemm.TARGET_NAME in hlo
    np.testing.assert_allclose(np.asarray(dense.apply(params, x)), np.asarray(reference), atol=1e-5)
    # Two contracting axes (an attention output projection over [heads, head_dim]), rhs contracted on its leading
    # or its trailing axes.
    h = jnp.asarray(rng.standard_normal((3, 5, 4, 6)), jnp.float32)
    kernel = jnp.asarray(rng.standard_normal((4, 6, 7)), jnp.float32)
    dims = (((2, 3), (0, 1)), ((), ()))
    np.testing.assert_allclose(np.asarray(cpu_gemm.dot_general(h, kernel, dims)),
                               np.asarray(jax.lax.dot_general(h, kernel, dims, precision="highest")), atol=1e-4)
    kernel_t = jnp.moveaxis(kernel, 2, 0)
    dims_t = (((2, 3), (1, 2)), ((), ()))
    np.testing.assert_allclose(np.asarray(cpu_gemm.dot_general(h, kernel_t, dims_t)),
                               np.asarray(jax.lax.dot_general(h, kernel_t, dims_t, precision="highest")), atol=1e-4)
    # Batch axes and bfloat16 are XLA's: no custom call in the program.
    batched = (((2,), (1,)), ((0,), (0,)))
    y = jnp.asarray(rng.standard_normal((4, 24, 3)), jnp.float32)
    assert cpu_gemm.TARGET_NAME not in jax.jit(lambda a, b: cpu_gemm.dot_general(a, b, batched)).lower(x, y).as_text()
    x16 = x.astype(jnp.bfloat16)
    w16 = jnp.ones((24, 8), jnp.bfloat16)
    plain = (((2,), (0,)), ((), ()))
    assert cpu_gemm.TARGET_NAME not in jax.jit(lambda a, b: cpu_gemm.dot_general(a, b, plain)).lower(x16, w16).as_text()


def _tiny(matmul, **overrides):
    config = helpers.tiny_config()
    config.model.matmul = matmul
    for key, value in overrides.items():
        setattr(config.model, key, value)
    return config


def _step_program(config, devices):
    """The train step's StableHLO text, and the losses and parameters of three steps on `devices`."""
    losses, state, hlo = helpers.train_steps(config, devices, 3)
    return hlo, losses, jax.device_get(state.params)


def test_model_blas_matches_xla_and_auto_takes_it_where_it_can_run():
    xla_hlo, xla_losses, xla_params = _step_program(_tiny("xla"), jax.devices()[:1])
    blas_hlo, blas_losses, blas_params = _step_program(_tiny("blas"), jax.devices()[:1])
    auto_hlo, auto_losses, _ = _step_program(_tiny("auto"), jax.devices()[:1])
    remat_hlo, remat_losses, _ = _step_program(_tiny("auto", remat="matmuls"), jax.devices()[:1])
    assert cpu_gemm.TARGET_NAME not in xla_hlo
    # blas: per layer the 6 weight matmuls and 2 attention matmuls, forward; plus the decoder and the heads.
    config = _tiny("blas")
    call = f"custom_call @{cpu_gemm.TARGET_NAME}("
    assert blas_hlo.count(call) >= 3 * 8 * config.model.num_layers
    # auto on one CPU device in float32: the same program as blas.
    assert auto_hlo.count(call) == blas_hlo.count(call)
    # auto under remat="matmuls" (which saves XLA's dots): the MLM decoder's forward and its two gradients only.
    assert remat_hlo.count(call) == 3
    # Three AdamW steps: the losses (which fall) and the parameters agree to float32 rounding.
    assert xla_losses[-1] < xla_losses[0]
    np.testing.assert_allclose(blas_losses, xla_losses, atol=2e-5)
    np.testing.assert_allclose(auto_losses, blas_losses, atol=0)
    np.testing.assert_allclose(remat_losses, xla_losses, atol=2e-5)
    for got, want in zip(jax.tree.leaves(blas_params), jax.tree.leaves(xla_params)):
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_auto_keeps_xla_on_a_sharded_mesh_and_blas_there_names_the_problem():
    config = _tiny("auto")
    config.mesh.data = 2
    hlo, _, _ = _step_program(config, jax.devices()[:2])
    assert cpu_gemm.TARGET_NAME not in hlo
    config.model.matmul = "blas"
    with pytest.raises(ValueError, match=r"matmul='blas' cannot run here: .*mesh has 2"):
        _step_program(config, jax.devices()[:2])


def test_blas_with_remat_matmuls_is_refused_with_the_fix():
    config = _tiny("blas", remat="matmuls")
    with pytest.raises(ValueError, match=r"model.matmul='blas'.*remat=full"):
        model_lib.BertConfig.from_config(config.model)
    with pytest.raises(ValueError, match=r"model.matmul='gemm'.*choose one of"):
        model_lib.BertConfig.from_config(_tiny("gemm").model)


def test_without_a_compiler_auto_falls_back_and_blas_says_why(tmp_path):
    script = """
import jax, jax.numpy as jnp
from bert_jax import cpu_gemm, model as model_lib
from tests import helpers
reason = cpu_gemm.unavailable_reason()
print("REASON", reason)
config = helpers.tiny_config()
model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
ids = jnp.ones((2, 16), jnp.int32)
positions = jnp.ones((2, 3), jnp.int32)
params = model.init(jax.random.key(0), ids, ids, ids * 0, positions)
hlo = jax.jit(model.apply).lower(params, ids, ids, ids * 0, positions).as_text()
print("CUSTOM_CALL", cpu_gemm.TARGET_NAME in hlo)
config.model.matmul = "blas"
try:
    model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model)).init(
        jax.random.key(0), ids, ids, ids * 0, positions)
except ValueError as error:
    print("ERROR", error)
"""
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), BERT_JAX_CACHE_DIR=str(tmp_path / "cache"),
               JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=300, check=True)
    assert "REASON no C++ compiler" in result.stdout and "set $CXX or install g++" in result.stdout
    assert "CUSTOM_CALL False" in result.stdout
    assert "ERROR --config.model.matmul='blas' cannot run here: no C++ compiler" in result.stdout
    assert not os.path.exists(tmp_path / "cache")  # nothing built, nothing half-written


def test_build_is_cached_and_atomic(tmp_path):
    script = "from bert_jax import cpu_gemm; print('REASON', cpu_gemm.unavailable_reason())"
    env = dict(os.environ, BERT_JAX_CACHE_DIR=str(tmp_path), JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    first = None
    for _ in range(2):
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=300, check=True)
        assert "REASON None" in result.stdout
        built = [path for path in tmp_path.rglob("*") if path.is_file()]
        assert [path.name for path in built] == ["libbert_jax_cpu_gemm.so"]  # no leftover partial files
        identity = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in built]
        first = first or identity
    assert identity == first  # the second process loaded the first one's library, not a rebuilt one
