"""The attention back-ends agree with each other under padding and packed-row masks, and the platform choice."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import attention
from bert_jax import job_config
from bert_jax import model as model_lib


def _random_qkv(batch, length, heads=2, head_dim=8, seed=0, queries=None):
    rng = np.random.default_rng(seed)
    shapes = [(batch, queries or length, heads, head_dim)] + [(batch, length, heads, head_dim)] * 2
    return [jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in shapes]


def _segment_ids(length, spans_per_row):
    """[batch, length] instance ids 1..k per row of (start, stop) spans; 0 (padding) elsewhere."""
    ids = np.zeros((len(spans_per_row), length), np.int32)
    for row, spans in enumerate(spans_per_row):
        for number, (start, stop) in enumerate(spans, 1):
            ids[row, start:stop] = number
    return ids


def _softmax_attention(query, key, value, allowed):
    """float64 numpy softmax attention; `allowed`: boolean [batch, query, key]."""
    query, key, value = (np.asarray(x, np.float64) for x in (query, key, value))
    scores = np.einsum("bqhd,bkhd->bhqk", query, key) / np.sqrt(query.shape[-1])
    scores = np.where(allowed[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", probs / probs.sum(-1, keepdims=True), value)


def test_reference_and_xla_equal_softmax_attention_under_a_padding_mask():
    query, key, value = _random_qkv(2, 12)
    # Not trailing padding: nothing may assume it.
    padding = np.random.default_rng(3).random((2, 12)) > 0.3
    padding[:, 0] = True
    expected = _softmax_attention(query, key, value, np.broadcast_to(padding[:, None, :], (2, 12, 12)))
    for implementation in ("reference", "xla"):
        context = attention.dot_product_attention(implementation, query, key, value, jnp.asarray(padding))
        np.testing.assert_allclose(context, expected, atol=1e-6, err_msg=implementation)


def test_segment_mask_keeps_attention_inside_each_instance_for_every_query_subset():
    ids = _segment_ids(16, [[(0, 8), (8, 12)], [(0, 4), (4, 8), (8, 16)]])
    query, key, value = _random_qkv(2, 16)
    mask = attention.SegmentMask(jnp.asarray(ids))
    # Padding (id 0) is a block of its own: no query row is fully masked.
    np.testing.assert_array_equal(attention.boolean_mask(mask)[:, 0], ids[:, :, None] == ids[:, None, :])
    expected = _softmax_attention(query, key, value, ids[:, :, None] == ids[:, None, :])
    for implementation in ("reference", "xla"):
        np.testing.assert_allclose(attention.dot_product_attention(implementation, query, key, value, mask),
                                   expected, atol=1e-6, err_msg=implementation)
    # Queries at some rows only (repeats, any order): those rows of the full result.
    rows = np.array([[0, 9, 9, 15, 3], [3, 12, 4, 0, 8]], np.int32)
    at_rows = attention.at_queries(mask, jnp.asarray(rows))
    row_query = jnp.take_along_axis(query, jnp.asarray(rows)[:, :, None, None], axis=1)
    for implementation in ("reference", "xla"):
        np.testing.assert_allclose(attention.dot_product_attention(implementation, row_query, key, value, at_rows),
                                   np.take_along_axis(expected, rows[:, :, None, None], axis=1), atol=1e-6,
                                   err_msg=implementation)
    # A padding mask masks keys only: at_queries leaves it as it is.
    padding = jnp.asarray(ids > 0)
    assert attention.at_queries(padding, jnp.asarray(rows)) is padding


def test_reference_attention_softmax_is_float32_for_bfloat16_inputs():
    query, key, value = (x.astype(jnp.bfloat16) for x in _random_qkv(2, 8))
    jaxpr = jax.make_jaxpr(attention.reference_attention)(query, key, value, jnp.ones((2, 8), bool))
    exps = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "exp"]
    assert exps and all(eqn.outvars[0].aval.dtype == jnp.float32 for eqn in exps)
    context = attention.reference_attention(query, key, value, jnp.ones((2, 8), bool))
    assert context.dtype == jnp.bfloat16
    expected = _softmax_attention(query, key, value, np.ones((2, 8, 8), bool))
    np.testing.assert_allclose(np.asarray(context, np.float32), expected, atol=0.05)


def test_reference_attention_applies_dropout_to_the_probabilities():
    query, key, value = _random_qkv(1, 8)
    seen = []

    def dropout(probs):
        seen.append(probs.shape)
        return jnp.zeros_like(probs)

    context = attention.reference_attention(query, key, value, jnp.ones((1, 8), bool), dropout)
    assert seen == [(1, 2, 8, 8)]  # [batch, heads, query, key]
    np.testing.assert_array_equal(context, 0.0)


def test_pallas_splash_kernel_matches_softmax_attention():
    # The TPU kernel itself, run by the Pallas interpreter on CPU: segment ids from a padding mask or a
    # SegmentMask, query scaling and layout. Padding queries attend to padding keys there (outputs nothing reads).
    query, key, value = _random_qkv(2, 128, heads=2, head_dim=64)
    padding = np.arange(128)[None, :] < np.array([[100], [128]])
    ids = _segment_ids(128, [[(0, 40), (40, 90), (90, 120)], [(0, 64), (64, 128)]])
    key_padding = np.broadcast_to(padding[:, None, :], (2, 128, 128))
    splash = attention._splash_attention  # pylint: disable=protected-access
    for mask, allowed, real in ((jnp.asarray(padding), key_padding, padding),
                                (attention.SegmentMask(jnp.asarray(ids)), ids[:, :, None] == ids[:, None, :], ids > 0)):
        context = splash(query, key, value, mask, interpret=True)
        expected = _softmax_attention(query, key, value, allowed)
        np.testing.assert_allclose(np.asarray(context)[real], expected[real], atol=2e-5)


def _choose(requested, query, key, mask, training=False, dropout_rate=0.0):
    return attention.attention_implementation(requested, query, key, mask, training, dropout_rate)


def test_auto_chooses_by_target_platform():
    query, key, _ = _random_qkv(1, 128, head_dim=64)
    padding = jnp.ones((1, 128), bool)
    assert jax.default_backend() == "cpu" and attention.target_platform() == "cpu"
    # CPU: the einsum path, which XLA:CPU runs faster than dot_product_attention.
    assert _choose("auto", query, key, padding) == "reference"
    with attention.compiling_for("tpu"):
        assert attention.target_platform() == "tpu"
        assert _choose("auto", query, key, padding) == "pallas"
        assert _choose("auto", query, key, attention.SegmentMask(jnp.ones((1, 128), jnp.int32))) == "pallas"
        # Attention dropout in training: only the reference path has it.
        assert _choose("auto", query, key, padding, training=True, dropout_rate=0.1) == "reference"
        assert _choose("auto", query, key, padding, training=True, dropout_rate=0.0) == "pallas"
        with attention.compiling_for("gpu"):  # nested: the innermost wins
            assert _choose("auto", query.astype(jnp.bfloat16), key, padding) == "cudnn"
        assert attention.target_platform() == "tpu"
    assert attention.target_platform() == "cpu"  # the override ends with the block
    # The model module re-exports the override, which bert_jax.aot uses.
    assert model_lib.compiling_for is attention.compiling_for


def test_unsupported_kernels_fall_back_to_xla_with_the_reason_logged(caplog):
    query, key, _ = _random_qkv(1, 8)
    padding = jnp.ones((1, 8), bool)
    attention._logged_notes.clear()  # pylint: disable=protected-access
    with caplog.at_level(logging.INFO):
        assert _choose("cudnn", query, key, padding) == "xla"
        assert _choose("pallas", query, key, padding) == "xla"
        with attention.compiling_for("tpu"):
            assert _choose("pallas", query, key, padding) == "xla"  # length 8: not a multiple of 128
        with attention.compiling_for("gpu"):
            assert _choose("auto", query, key, padding) == "xla"  # float32: cuDNN needs 16-bit inputs
    assert "'cudnn' falls back to 'xla' because cuDNN flash attention needs a GPU" in caplog.text
    assert "'pallas' falls back to 'xla' because the Pallas splash-attention kernel needs a TPU" in caplog.text
    assert "needs query and key lengths that are multiples of 128, not 8 and 8" in caplog.text
    assert "cuDNN flash attention needs bfloat16 or float16 inputs, not float32" in caplog.text
    assert _choose("xla", query, key, padding, training=True) == "xla"
    assert _choose("reference", query, key, padding) == "reference"


def test_config_refuses_a_fused_kernel_with_attention_dropout():
    config = dict(hidden_size=32, num_heads=4)
    with pytest.raises(ValueError, match=r"--config.model.attention='cudnn'.*no attention dropout.*"
                                         r"attention_dropout_rate=0.0"):
        job_config.model_config(dict(config, attention="cudnn", attention_dropout_rate=0.1))
    job_config.model_config(dict(config, attention="cudnn", attention_dropout_rate=0.0))
    with pytest.raises(ValueError, match=r"--config.model.attention='flash': choose one of"):
        job_config.model_config(dict(config, attention="flash"))
