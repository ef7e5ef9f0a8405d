"""Performance options of the model change speed and memory, not results: bf16 mixed precision, fused attention,
scanned layers and rematerialisation, each checked against the plain float32 / reference / unrolled model."""

import dataclasses
import functools
import logging
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import export
from bert_jax.benchmarks import matmul_bound
from bert_jax import model as model_lib
from bert_jax import optim
from tests import helpers

BATCH, LENGTH = 3, 16


def _config(**overrides):
    values = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                  max_position_embeddings=LENGTH, dropout_rate=0.0, attention_dropout_rate=0.0)
    return model_lib.BertConfig(**{**values, **overrides}).validate()


def _inputs(lengths=(16, 11, 5), seed=0):
    rng = np.random.default_rng(seed)
    mask = (np.arange(LENGTH)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)
    ids = rng.integers(1, 97, size=(BATCH, LENGTH)).astype(np.int32) * mask
    segments = (np.arange(LENGTH)[None, :] >= 4).astype(np.int32) * mask
    positions = np.array([[1, 4, 7, 9], [2, 3, 9, 10], [0, 1, 3, 4]], np.int32)
    return ids, mask, segments, positions


def _init(config, seed=1):
    ids, mask, segments, positions = _inputs()
    variables = jax.jit(model_lib.BertForPreTraining(config).init)(jax.random.key(seed), ids, mask, segments,
                                                                     positions)
    return nn.meta.unbox(variables)["params"]


@functools.lru_cache(maxsize=None)
def _results(config, deterministic=True):
    """(loss, outputs, grads) of `_loss_and_grads` from the same initial weights (stacked for a scanned config);
    cached, since several tests compare against the same baseline."""
    params = _init(dataclasses.replace(config, scan_layers=False))
    if config.scan_layers:
        params = model_lib.stack_layers(params, config.num_layers)
    return _loss_and_grads(config, params, deterministic)


def _loss_and_grads(config, params, deterministic=True):
    """A scalar of every output (MLM logits, NSP logits, the whole sequence output) and its gradient."""
    model = model_lib.BertForPreTraining(config)
    inputs = _inputs()

    def loss_fn(params):
        outputs = model.apply({"params": params}, *inputs, deterministic=deterministic,
                              rngs={"dropout": jax.random.key(7)})
        weights = jnp.asarray(inputs[1], jnp.float32)[..., None]
        return (jnp.mean(outputs["mlm_logits"] ** 2) + jnp.mean(outputs["nsp_logits"] ** 2)
                + jnp.mean((outputs["sequence_output"] * weights) ** 2)), outputs

    (loss, outputs), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    return loss, outputs, grads


def _assert_trees_close(actual, expected, atol, rtol=0.0):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol,
                                   err_msg=jax.tree_util.keystr(path))


# --- mixed precision -------------------------------------------------------------------------------------------

def _train_losses(dtype, steps=6):
    config = helpers.tiny_config()
    config.model.dtype = dtype
    losses, state, _ = helpers.train_steps(config, jax.devices()[:1], steps)
    return losses, state


def test_bfloat16_training_tracks_float32():
    fp32_losses, _ = _train_losses("float32")
    bf16_losses, bf16_state = _train_losses("bfloat16")
    # Six AdamW steps of the tiny preset on one batch: the loss falls from 7.0 to 5.6; bf16 compute stays within
    # 0.01 of float32 at every step (measured: 1e-3).
    assert fp32_losses[-1] < fp32_losses[0] - 1.0, fp32_losses
    np.testing.assert_allclose(bf16_losses, fp32_losses, atol=0.01)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(bf16_state.params))


def test_bfloat16_keeps_softmax_layer_norm_statistics_and_logits_in_float32():
    config = _config(dtype="bfloat16")
    params = _init(config)
    outputs = jax.jit(model_lib.BertForPreTraining(config).apply)({"params": params}, *_inputs())
    assert outputs["sequence_output"].dtype == jnp.bfloat16
    assert outputs["mlm_logits"].dtype == jnp.float32 and outputs["nsp_logits"].dtype == jnp.float32
    # LayerNorm: every reduction (mean, variance) runs in float32 on bfloat16 activations.
    layer_norm = model_lib._layer_norm(config, "norm")  # pylint: disable=protected-access
    x = jnp.asarray(np.random.default_rng(0).normal(3.0, 2.0, (4, 1024)), jnp.bfloat16)
    ln_params = layer_norm.init(jax.random.key(0), x)
    jaxpr = jax.make_jaxpr(lambda x: layer_norm.apply(ln_params, x))(x)
    reductions = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "reduce_sum"]
    assert reductions and all(eqn.outvars[0].aval.dtype == jnp.float32 for eqn in reductions)
    out = layer_norm.apply(ln_params, x)
    exact = np.asarray(x, np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + config.layer_norm_eps)
    np.testing.assert_allclose(np.asarray(out, np.float64), exact, rtol=2 ** -7, atol=2 ** -7)
    # Attention softmax: float32 probabilities from bfloat16 queries and keys.
    query = jnp.asarray(np.random.default_rng(1).normal(size=(2, 8, 2, 16)), jnp.bfloat16)
    probs = model_lib.reference_attention_probs(query, query, jnp.ones((2, 8), bool), 16)
    assert probs.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(probs.sum(-1)), 1.0, rtol=1e-6)


# --- attention paths -------------------------------------------------------------------------------------------

def test_fused_xla_attention_equals_reference_with_padding():
    ref_loss, ref_outputs, ref_grads = _results(_config(attention="reference"))
    loss, outputs, grads = _results(_config(attention="xla"))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    real = _inputs()[1].astype(bool)
    np.testing.assert_allclose(np.asarray(outputs["sequence_output"])[real],
                               np.asarray(ref_outputs["sequence_output"])[real], atol=1e-5)
    np.testing.assert_allclose(outputs["mlm_logits"], ref_outputs["mlm_logits"], atol=1e-5)
    _assert_trees_close(grads, ref_grads, atol=1e-6, rtol=1e-4)


def _random_qkv(batch, length, heads=2, head_dim=8, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=(batch, length, heads, head_dim)), jnp.float32) for _ in range(3)]


def _reference_context(query, key, value, mask):
    probs = model_lib.reference_attention_probs(query, key, mask, query.shape[-1])
    return jnp.einsum("bhqk,bkhd->bqhd", probs, value)


def test_xla_attention_takes_any_padding_mask_and_full_masks():
    query, key, value = _random_qkv(2, 12)
    # Not trailing padding: the general boolean path must not assume it.
    padding = jnp.asarray(np.random.default_rng(3).random((2, 12)) > 0.3).at[:, 0].set(True)
    expected = _reference_context(query, key, value, padding)
    np.testing.assert_allclose(model_lib.fused_attention("xla", query, key, value, padding), expected, atol=1e-6)
    full = padding[:, None, None, :] & padding[:, None, :, None]
    np.testing.assert_allclose(model_lib.fused_attention("xla", query, key, value, full)[padding],
                               _reference_context(query, key, value, full)[padding], atol=1e-6)


def _block_diagonal(instance_ids):
    """[B, 1, T, T]: tokens attend within their own instance (id > 0); id 0 is padding."""
    ids = jnp.asarray(instance_ids)
    return ((ids[:, :, None] == ids[:, None, :]) & (ids[:, :, None] > 0))[:, None]


@pytest.mark.parametrize("attention", ["reference", "xla"])
def test_block_diagonal_mask_equals_running_the_blocks_separately(attention):
    # Two packed rows: instances of lengths (8, 4) + 4 padding, and (4, 4, 8). A BertLayer (attention, residuals,
    # LayerNorms, feed-forward) on the packed row must give each instance exactly what it gives that instance alone.
    config = _config(attention=attention, dropout_rate=0.1, attention_dropout_rate=0.0)
    layer = model_lib.BertLayer(config)
    apply = jax.jit(layer.apply, static_argnums=3)
    blocks = [[(0, 8), (8, 12)], [(0, 4), (4, 8), (8, 16)]]
    instance_ids = np.zeros((2, LENGTH), np.int32)
    for row, spans in enumerate(blocks):
        for number, (start, stop) in enumerate(spans, 1):
            instance_ids[row, start:stop] = number
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, LENGTH, config.hidden_size)), jnp.float32)
    params = layer.init(jax.random.key(0), x, jnp.ones((2, LENGTH), bool), True)
    packed = apply(params, x, _block_diagonal(instance_ids), True)
    for row, spans in enumerate(blocks):
        for start, stop in spans:
            alone = apply(params, x[row:row + 1, start:stop], jnp.ones((1, stop - start), bool), True)
            np.testing.assert_allclose(packed[row, start:stop], alone[0], atol=2e-6)
    # The same through a [B, T] padding mask plus a block-diagonal mask equals the block-diagonal mask alone.
    with_padding = apply(params, x, _block_diagonal(instance_ids) & (instance_ids > 0)[:, None, None, :], True)
    np.testing.assert_allclose(with_padding, packed, atol=1e-6)
    # The layer at some rows only (query_positions), under the same full mask: those rows of the full output.
    rows = np.array([[0, 9, 9, 15], [3, 12, 4, 0]], np.int32)
    at_rows = apply(params, x, _block_diagonal(instance_ids), True, jnp.asarray(rows))
    np.testing.assert_allclose(at_rows, np.take_along_axis(np.asarray(packed), rows[..., None], axis=1), atol=2e-6)


def test_pallas_splash_kernel_matches_reference_at_real_tokens():
    # The TPU kernel itself, run by the Pallas interpreter on CPU: padding mask -> segment ids, query scaling and
    # layout. Padding queries attend to padding keys there (outputs no loss or pooler reads), so compare real ones.
    query, key, value = _random_qkv(2, 128, heads=2, head_dim=64)
    mask = jnp.asarray(np.arange(128)[None, :] < np.array([[100], [128]]))
    expected = _reference_context(query, key, value, mask)
    context = model_lib._splash_attention(query, key, value, mask, interpret=True)  # pylint: disable=protected-access
    np.testing.assert_allclose(np.asarray(context)[np.asarray(mask)], np.asarray(expected)[np.asarray(mask)],
                               atol=2e-5)


def test_pallas_splash_kernel_takes_packed_rows_as_segment_ids():
    # Packed rows reach the kernel as a SegmentMask: instance ids become splash's segment ids, so every token
    # attends inside its own instance, exactly as the block-diagonal mask of the reference path.
    query, key, value = _random_qkv(2, 128, heads=2, head_dim=64)
    ids = np.zeros((2, 128), np.int32)
    ids[0, :40], ids[0, 40:90], ids[0, 90:120] = 1, 2, 3  # three instances, then padding
    ids[1, :128] = np.repeat([1, 2], 64)
    segments = model_lib.SegmentMask(jnp.asarray(ids))
    expected = _reference_context(query, key, value, model_lib._full_attention_mask(segments))  # pylint: disable=protected-access
    context = model_lib._splash_attention(query, key, value, segments, interpret=True)  # pylint: disable=protected-access
    real = ids > 0
    np.testing.assert_allclose(np.asarray(context)[real], np.asarray(expected)[real], atol=2e-5)
    np.testing.assert_array_equal(model_lib._full_attention_mask(segments),  # pylint: disable=protected-access
                                  (ids[:, :, None] == ids[:, None, :])[:, None])  # padding: a block of its own
    # Only the TPU is missing here: the mask itself is accepted.
    reason = model_lib._pallas_unsupported(query, segments)  # pylint: disable=protected-access
    assert reason.startswith("the Pallas splash-attention kernel needs a TPU")


def test_attention_auto_picks_reference_only_for_dropout_and_falls_back_with_a_reason(caplog):
    query, _, _ = _random_qkv(1, 8)
    padding = jnp.ones((1, 8), bool)
    choose = model_lib.attention_implementation
    auto = _config(attention_dropout_rate=0.1)
    assert choose(auto, query, padding, deterministic=False) == "reference"  # attention dropout: exact path
    # Without attention dropout auto takes the platform's kernel: on CPU the einsum path, XLA:CPU's fastest.
    assert jax.default_backend() == "cpu"
    assert choose(auto, query, padding, deterministic=True) == "reference"
    assert choose(_config(), query, padding, deterministic=False) == "reference"
    assert choose(_config(attention="xla"), query, padding, deterministic=False) == "xla"
    model_lib._LOGGED_NOTES.clear()  # pylint: disable=protected-access
    with caplog.at_level(logging.INFO):
        assert choose(_config(attention="cudnn"), query, padding, deterministic=True) == "xla"
        assert choose(_config(attention="pallas"), query, padding, deterministic=True) == "xla"
    assert "model.attention='cudnn': using 'xla' because cuDNN flash attention needs a GPU" in caplog.text
    assert "model.attention='pallas': using 'xla' because the Pallas splash-attention kernel needs a TPU" in caplog.text
    with pytest.raises(ValueError, match=r"--config.model.attention='cudnn'.*no attention dropout.*"
                                         r"attention_dropout_rate=0.0"):
        _config(attention="cudnn", attention_dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"--config.model.remat='some'"):
        _config(remat="some")


# --- scanned layers and rematerialisation --------------------------------------------------------------------

def test_scanned_layers_equal_unrolled_with_the_same_weights():
    unrolled = _config(attention="xla")
    scanned = _config(attention="xla", scan_layers=True)
    params = _init(unrolled)
    stacked = model_lib.stack_layers(params, unrolled.num_layers)
    # The scanned model's own init has exactly this layout, with "layers" as the leading logical axis.
    abstract = nn.meta.unbox(jax.eval_shape(lambda: model_lib.BertForPreTraining(scanned).init(
        jax.random.key(0), *_inputs())))["params"]
    assert jax.tree.map(lambda leaf: leaf.shape, abstract) == jax.tree.map(lambda leaf: leaf.shape, stacked)
    boxed = jax.eval_shape(lambda: model_lib.BertForPreTraining(scanned).init(jax.random.key(0), *_inputs()))
    assert boxed["params"]["layers"]["attention"]["query"]["kernel"].names == ("layers", "embed", "heads")
    _assert_trees_close(model_lib.unstack_layers(stacked), params, atol=0)

    loss, outputs, grads = _results(unrolled)
    scanned_loss, scanned_outputs, scanned_grads = _results(scanned)
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
    for name in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(scanned_outputs[name], outputs[name], atol=1e-6, err_msg=name)
    _assert_trees_close(model_lib.unstack_layers(scanned_grads), grads, atol=1e-6)
    # Weight decay skips LayerNorm parameters and biases of stacked layers too, whose rank grew by one.
    _assert_trees_close(optim.decay_mask(stacked), model_lib.stack_layers(optim.decay_mask(params), 2), atol=0)


def test_exports_of_scanned_parameters_equal_those_of_unrolled(tmp_path):
    unrolled, scanned = _config(), _config(scan_layers=True)
    params = _init(unrolled)
    stacked = model_lib.stack_layers(params, unrolled.num_layers)
    export.export_flax(stacked, scanned, str(tmp_path / "flax"))
    loaded_config, loaded = export.load_flax(str(tmp_path / "flax"))
    assert not loaded_config.scan_layers
    _assert_trees_close(loaded, params, atol=0)
    export.export_hf(stacked, scanned, str(tmp_path / "hf_scanned"))
    export.export_hf(params, unrolled, str(tmp_path / "hf_unrolled"))
    assert ((tmp_path / "hf_scanned" / "model.safetensors").read_bytes()
            == (tmp_path / "hf_unrolled" / "model.safetensors").read_bytes())


@pytest.mark.parametrize("remat, scan_layers", [("matmuls", False), ("full", True)])
def test_remat_leaves_loss_and_gradients_unchanged(remat, scan_layers):
    # With dropout active: the recomputed forward pass must reuse the same dropout masks.
    plain = _config(dropout_rate=0.1, attention_dropout_rate=0.1, scan_layers=scan_layers)
    loss, _, grads = _results(plain, deterministic=False)
    remat_loss, _, remat_grads = _results(dataclasses.replace(plain, remat=remat), deterministic=False)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    _assert_trees_close(remat_grads, grads, atol=1e-6)


def test_scanned_program_does_not_grow_with_depth():
    # A proxy for compile time that asserts no timing: the lowered gradient program of the scanned model has the
    # same number of lines at any depth, while the unrolled one grows with it.
    def program_lines(config):
        model = model_lib.BertForPreTraining(config)
        inputs = _inputs()
        grad = jax.grad(lambda p: jnp.sum(model.apply({"params": p}, *inputs)["mlm_logits"]))
        return len(jax.jit(grad).lower(jax.eval_shape(lambda: _init(config))).as_text().splitlines())

    assert program_lines(_config(scan_layers=True, num_layers=2)) == program_lines(_config(scan_layers=True,
                                                                                           num_layers=6))
    assert program_lines(_config(num_layers=6)) > program_lines(_config(num_layers=2)) + 100


# --- the last layer at the rows the heads read ------------------------------------------------------------------

def _packed_inputs():
    """Three packed rows of LENGTH: instances of lengths (8, 4) + 4 padding, (4, 4, 8) and (16), with per-instance
    positions, instance ids, each instance's [CLS] position (an empty slot points at 0) and masked positions."""
    ids, _, _, _ = _inputs()
    spans = [[(0, 8), (8, 12)], [(0, 4), (4, 8), (8, 16)], [(0, 16)]]
    instance_ids = np.zeros((BATCH, LENGTH), np.int32)
    position_ids = np.zeros((BATCH, LENGTH), np.int32)
    segment_ids = np.zeros((BATCH, LENGTH), np.int32)
    nsp_positions = np.zeros((BATCH, 3), np.int32)
    for row, row_spans in enumerate(spans):
        for number, (start, stop) in enumerate(row_spans, 1):
            instance_ids[row, start:stop] = number
            position_ids[row, start:stop] = np.arange(stop - start)
            segment_ids[row, start + (stop - start) // 2:stop] = 1
            nsp_positions[row, number - 1] = start
    mask = (instance_ids > 0).astype(np.int32)
    masked_lm_positions = np.array([[1, 5, 9, 10, 0], [2, 6, 9, 13, 15], [3, 4, 8, 12, 14]], np.int32)
    return dict(input_ids=ids * mask, input_mask=mask, segment_ids=segment_ids,
                masked_lm_positions=masked_lm_positions, position_ids=position_ids, instance_ids=instance_ids,
                nsp_positions=nsp_positions)


def _head_results(config, params, inputs, sequence_output, deterministic=False):
    model = model_lib.BertForPreTraining(config)

    def loss_fn(params):
        outputs = model.apply({"params": params}, **inputs, deterministic=deterministic,
                              sequence_output=sequence_output, rngs={"dropout": jax.random.key(7)})
        return jnp.mean(outputs["mlm_logits"] ** 2) + jnp.mean(outputs["nsp_logits"] ** 2), outputs

    (loss, outputs), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    return loss, outputs, grads


@pytest.mark.parametrize("remat, scan_layers, packed", [("none", False, True), ("full", False, False),
                                                        ("none", True, True)])
def test_last_layer_at_the_head_rows_equals_the_full_model(remat, scan_layers, packed):
    # With dropout on everywhere: the rows the last layer computes must drop exactly what the full layer drops there.
    config = _config(dropout_rate=0.1, attention_dropout_rate=0.1, remat=remat, scan_layers=scan_layers)
    params = _init(dataclasses.replace(config, scan_layers=False))
    if scan_layers:
        params = model_lib.stack_layers(params, config.num_layers)
    ids, mask, segments, positions = _inputs()
    inputs = _packed_inputs() if packed else dict(input_ids=ids, input_mask=mask, segment_ids=segments,
                                                  masked_lm_positions=positions)
    loss, outputs, grads = _head_results(config, params, inputs, sequence_output=True)
    head_loss, head_outputs, head_grads = _head_results(config, params, inputs, sequence_output=False)
    assert "sequence_output" in outputs and "sequence_output" not in head_outputs
    for name in ("mlm_logits", "nsp_logits", "pooled_output"):
        assert head_outputs[name].shape == outputs[name].shape, name
        np.testing.assert_allclose(head_outputs[name], outputs[name], atol=2e-6, rtol=0, err_msg=name)
    np.testing.assert_allclose(head_loss, loss, rtol=1e-6)
    _assert_trees_close(head_grads, grads, atol=1e-6)
    # The comparison saw dropout at work: without it the logits are different.
    _, quiet, _ = _head_results(config, params, inputs, sequence_output=False, deterministic=True)
    assert np.abs(np.asarray(quiet["mlm_logits"]) - np.asarray(head_outputs["mlm_logits"])).max() > 1e-2


@pytest.mark.parametrize("scan_layers", [False, True])
def test_last_layer_at_the_head_rows_skips_exactly_the_other_rows_matmuls(scan_layers):
    config = _config(scan_layers=scan_layers, num_layers=3)
    params = _init(config)
    model = model_lib.BertForPreTraining(config)
    ids, mask, segments, positions = _inputs()

    def matmul_flops(sequence_output):
        def loss(params):
            outputs = model.apply({"params": params}, ids, mask, segments, positions,
                                  sequence_output=sequence_output)
            return jnp.sum(outputs["mlm_logits"] ** 2) + jnp.sum(outputs["nsp_logits"] ** 2)

        counts, _ = matmul_bound.collect_matmuls(jax.grad(loss), params)
        return sum(matmul.flops * count for matmul, count in counts.items())

    # Rows the heads read: [CLS] and the 4 masked positions. Each other row of the last layer skips, forward and
    # backward (3x), its query and output projections and feed-forward (2 x the parameters: 12 h^2 + 12 h i) and
    # its attention over LENGTH keys (12 h LENGTH).
    hidden, inner = config.hidden_size, config.intermediate_size
    skipped_rows = BATCH * (LENGTH - 1 - positions.shape[1])
    assert matmul_flops(True) - matmul_flops(False) == skipped_rows * 12 * hidden * (hidden + inner + LENGTH)


def test_heads_only_model_refuses_hidden_states():
    config = _config()
    ids, mask, segments, positions = _inputs()
    with pytest.raises(ValueError, match="output_hidden_states=True needs sequence_output=True"):
        model_lib.BertForPreTraining(config).apply({"params": _init(config)}, ids, mask, segments, positions,
                                                   output_hidden_states=True, sequence_output=False)


# --- dropout ---------------------------------------------------------------------------------------------------

def test_unrolled_threefry_equals_jax_threefry():
    from jax.extend.random import threefry_2x32  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    for _ in range(3):
        key = rng.integers(0, 2 ** 32, size=2, dtype=np.uint64).astype(np.uint32)
        count = rng.integers(0, 2 ** 32, size=64, dtype=np.uint64).astype(np.uint32)
        x0, x1 = model_lib.threefry2x32(jnp.uint32(key[0]), jnp.uint32(key[1]), jnp.asarray(count[:32]),
                                        jnp.asarray(count[32:]))
        np.testing.assert_array_equal(np.concatenate([x0, x1]), threefry_2x32(jnp.asarray(key), jnp.asarray(count)))


def test_dropout_mask_rate_independence_and_unbiased_scale():
    shape = (16, 12, 128, 128)  # 3.1M decisions
    keep, keep_probability = model_lib.dropout_keep_mask(jax.random.key(0), shape, 0.1)
    assert keep.shape == shape and keep.dtype == jnp.bool_
    assert keep_probability == 1 - 6554 / 65536  # the rate realised to 1/65536
    keep = np.asarray(keep)
    # Binomial standard deviation of the drop fraction is ~1.7e-4 here: allow 5 of them.
    assert abs((1 - keep.mean()) - (1 - keep_probability)) < 1e-3
    # Each of the four 16-bit slots of a threefry call, and rows far apart, drop at the same rate.
    for slot in range(4):
        assert abs(1 - keep[..., slot::4].mean() - 0.1) < 2e-3
    # Another key gives an independent mask: both kept with probability 0.9^2.
    other, _ = model_lib.dropout_keep_mask(jax.random.key(1), shape, 0.1)
    assert abs((keep & np.asarray(other)).mean() - keep_probability ** 2) < 2e-3
    # Neighbouring elements are independent too (no shared bits between the halves of one word).
    assert abs((keep[..., 0::2] & keep[..., 1::2]).mean() - keep_probability ** 2) < 2e-3
    # Inverted dropout keeps the expectation: the mean of dropout(ones) is 1.
    dropped = model_lib.Dropout(0.1).apply({}, jnp.ones(shape), deterministic=False,
                                           rngs={"dropout": jax.random.key(2)})
    assert abs(float(jnp.mean(dropped)) - 1.0) < 2e-3
    assert set(np.unique(np.asarray(dropped)).tolist()) == {0.0, np.float32(1 / keep_probability)}
    np.testing.assert_array_equal(model_lib.Dropout(0.1).apply({}, jnp.ones(shape), deterministic=True),
                                  np.ones(shape))


def test_dropout_mask_is_the_same_under_any_sharding():
    shape = (8, 4, 16, 32)
    rng = jax.random.key(7)
    expected = np.asarray(jax.jit(lambda key: model_lib.dropout_keep_mask(key, shape, 0.1)[0])(rng))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    for spec in (PartitionSpec("data"), PartitionSpec("data", "model"), PartitionSpec(None, None, "model")):
        mask = jax.jit(lambda key: model_lib.dropout_keep_mask(key, shape, 0.1)[0],
                       out_shardings=NamedSharding(mesh, spec))(rng)
        assert mask.sharding.spec == spec
        np.testing.assert_array_equal(np.asarray(mask), expected)
    # Odd shapes take jax.random.bits; other PRNG implementations too.
    odd, _ = model_lib.dropout_keep_mask(rng, (5, 7), 0.5)
    assert odd.shape == (5, 7)
    rbg, _ = model_lib.dropout_keep_mask(jax.random.key(0, impl="rbg"), (4, 8), 0.5)
    assert rbg.shape == (4, 8)


def test_dropout_rows_equal_the_full_mask_at_those_rows():
    # Some rows of a mask (repeats and any order) equal the whole mask's rows, for the threefry fast path and for
    # keys of another PRNG implementation (jax.random.bits, then gathered).
    positions = np.array([[0, 5, 5, 15, 2], [3, 2, 1, 0, 9]], np.int32)
    for key in (jax.random.key(3), jax.random.key(3, impl="rbg")):
        full = np.asarray(model_lib.dropout_keep_mask(key, (2, 3, 16, 8), 0.1)[0])
        rows = np.asarray(model_lib.dropout_keep_mask(key, (2, 3, 5, 8), 0.1, rows=(2, positions[:, None, :], 16))[0])
        np.testing.assert_array_equal(rows, np.take_along_axis(full, positions[:, None, :, None], axis=2))
        full = np.asarray(model_lib.dropout_keep_mask(key, (2, 16, 8), 0.5)[0])
        rows = np.asarray(model_lib.dropout_keep_mask(key, (2, 5, 8), 0.5, rows=(1, positions, 16))[0])
        np.testing.assert_array_equal(rows, np.take_along_axis(full, positions[:, :, None], axis=1))
        assert 0 < rows.mean() < 1
    with pytest.raises(ValueError, match="rows axis 2 must index one of the leading axes"):
        model_lib.dropout_keep_mask(jax.random.key(0), (2, 5, 8), 0.1, rows=(2, positions, 16))


# --- XLA:CPU options -------------------------------------------------------------------------------------------

def test_cpu_dots_run_through_onednn_and_user_flags_win(monkeypatch):
    import bert_jax  # pylint: disable=import-outside-toplevel
    operand = jnp.ones((64, 64), jnp.float32)
    compiled = jax.jit(lambda x: x @ x).lower(operand).compile().as_text()
    assert "onednn" in compiled, "XLA:CPU dots are not going through oneDNN: bert_jax.CPU_XLA_FLAGS not applied?"
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_cpu_use_onednn=false")
    bert_jax._set_cpu_xla_flags()  # pylint: disable=protected-access
    flags = os.environ["XLA_FLAGS"].split()
    assert flags == ["--xla_force_host_platform_device_count=2", "--xla_cpu_use_onednn=false",
                     "--xla_cpu_experimental_ynn_fusion_type=reduce",
                     "--xla_cpu_experimental_onednn_fusion_type=individual_dot"]


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
    """bert_jax turns on XLA:CPU's "ynn" fusion for reductions (bias gradients, LayerNorm statistics, softmax and
    the global gradient norm): every kind of reduction the step uses stays finite and equals float64 numpy."""
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
