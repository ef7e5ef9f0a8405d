"""Encoder layer forms that must not change results: scanned layers (nn.scan), rematerialisation, and the last
layer computed at the rows the heads read only (BertForPreTraining(sequence_output=False))."""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.interop import flax_files
from bert_jax.interop import huggingface
from bert_jax.interop import layout
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import optim
from tests import helpers

BATCH, LENGTH = 3, 16


def _config(**overrides):
    values = dict(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                  max_position_embeddings=LENGTH, dropout_rate=0.0, attention_dropout_rate=0.0)
    return model_lib.BertConfig(**{**values, **overrides}).validate()


def _inputs():
    """Three rows of LENGTH with 16, 11 and 5 real tokens, and 4 masked positions each."""
    rng = np.random.default_rng(0)
    mask = (np.arange(LENGTH)[None, :] < np.array([[16], [11], [5]])).astype(np.int32)
    ids = rng.integers(1, 97, size=(BATCH, LENGTH)).astype(np.int32) * mask
    segments = (np.arange(LENGTH)[None, :] >= 4).astype(np.int32) * mask
    positions = np.array([[1, 4, 7, 9], [2, 3, 9, 10], [0, 1, 3, 4]], np.int32)
    return dict(input_ids=ids, input_mask=mask, segment_ids=segments, masked_lm_positions=positions)


def _packed_inputs():
    """Three packed rows of LENGTH: instances of lengths (8, 4) + 4 padding, (4, 4, 8) and (16), with per-instance
    positions, instance ids, each instance's [CLS] position (an empty slot points at 0) and masked positions."""
    spans = [[(0, 8), (8, 12)], [(0, 4), (4, 8), (8, 16)], [(0, 16)]]
    instance_ids, position_ids, segment_ids = (np.zeros((BATCH, LENGTH), np.int32) for _ in range(3))
    nsp_positions = np.zeros((BATCH, 3), np.int32)
    for row, row_spans in enumerate(spans):
        for number, (start, stop) in enumerate(row_spans, 1):
            instance_ids[row, start:stop] = number
            position_ids[row, start:stop] = np.arange(stop - start)
            segment_ids[row, start + (stop - start) // 2:stop] = 1
            nsp_positions[row, number - 1] = start
    mask = (instance_ids > 0).astype(np.int32)
    masked_lm_positions = np.array([[1, 5, 9, 10, 0], [2, 6, 9, 13, 15], [3, 4, 8, 12, 14]], np.int32)
    return dict(input_ids=_inputs()["input_ids"] * mask, input_mask=mask, segment_ids=segment_ids,
                masked_lm_positions=masked_lm_positions, position_ids=position_ids, instance_ids=instance_ids,
                nsp_positions=nsp_positions)


@functools.lru_cache(maxsize=None)
def _unrolled_params():
    return helpers.random_params(model_lib.BertForPreTraining(_config()), **_inputs())


def _params(config):
    """The same weights for every config: unrolled, stacked for a scanned one."""
    params = _unrolled_params()
    return layout.stack_layers(params, config.num_layers) if config.scan_layers else params


@functools.lru_cache(maxsize=None)
def _results(config, deterministic=True, packed=False, sequence_output=True, sequence_loss=True):
    """(loss, outputs, grads) of a scalar of the logits, plus (`sequence_loss`) one of the sequence output."""
    model = model_lib.BertForPreTraining(config)
    inputs = _packed_inputs() if packed else _inputs()

    def loss_fn(params):
        outputs = model.apply({"params": params}, **inputs, deterministic=deterministic,
                              sequence_output=sequence_output, rngs={"dropout": jax.random.key(7)})
        loss = jnp.mean(outputs["mlm_logits"] ** 2) + jnp.mean(outputs["nsp_logits"] ** 2)
        if sequence_output and sequence_loss:
            weights = jnp.asarray(inputs["input_mask"], jnp.float32)[..., None]
            loss += jnp.mean((outputs["sequence_output"] * weights) ** 2)
        return loss, outputs

    (loss, outputs), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(_params(config))
    return loss, outputs, grads


def _assert_trees_close(actual, expected, atol, rtol=0.0):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(actual), jax.tree.leaves(expected)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=rtol,
                                   err_msg=jax.tree_util.keystr(path))


# --- scanned layers and rematerialisation --------------------------------------------------------------------

def test_scanned_layers_equal_unrolled_with_the_same_weights():
    unrolled, scanned = _config(), _config(scan_layers=True)
    params = _unrolled_params()
    stacked = layout.stack_layers(params, unrolled.num_layers)
    # The scanned model's own init has exactly this layout, with "layers" as the leading logical axis.
    boxed = jax.eval_shape(lambda: model_lib.BertForPreTraining(scanned).init(jax.random.key(0), **_inputs()))
    shapes = jax.tree.map(lambda leaf: leaf.shape, nn.meta.unbox(boxed)["params"])
    assert shapes == jax.tree.map(lambda leaf: leaf.shape, stacked)
    assert boxed["params"]["layers"]["attention"]["query"]["kernel"].names == ("layers", "embed", "heads")
    _assert_trees_close(layout.unstack_layers(stacked), params, atol=0)

    loss, outputs, grads = _results(unrolled)
    scanned_loss, scanned_outputs, scanned_grads = _results(scanned)
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
    for name in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
        np.testing.assert_allclose(scanned_outputs[name], outputs[name], atol=1e-6, err_msg=name)
    _assert_trees_close(layout.unstack_layers(scanned_grads), grads, atol=1e-6)
    # Weight decay skips LayerNorm parameters and biases of stacked layers too, whose rank grew by one.
    _assert_trees_close(optim.decay_mask(stacked), layout.stack_layers(optim.decay_mask(params), 2), atol=0)


def test_scanned_hidden_states_are_each_layers_output():
    config = _config(scan_layers=True)

    def hidden_states(model, params):  # jitted: op by op, each operation would compile as a program of its own
        return jax.jit(lambda p: model.apply({"params": p}, **_inputs(), output_hidden_states=True))(params)[
            "hidden_states"]

    unrolled = hidden_states(model_lib.BertForPreTraining(_config()), _unrolled_params())
    scanned = hidden_states(model_lib.BertForPreTraining(config), _params(config))
    assert len(scanned) == len(unrolled) == config.num_layers + 1
    for a, b in zip(scanned, unrolled):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_exports_of_scanned_parameters_equal_those_of_unrolled(tmp_path):
    unrolled, scanned = _config(), _config(scan_layers=True)
    params = _unrolled_params()
    stacked = layout.stack_layers(params, unrolled.num_layers)
    flax_files.export_flax(stacked, scanned, str(tmp_path / "flax"))
    loaded_config, loaded = flax_files.load_flax(str(tmp_path / "flax"))
    assert not loaded_config.scan_layers
    _assert_trees_close(loaded, params, atol=0)
    huggingface.export_hf(stacked, scanned, str(tmp_path / "hf_scanned"))
    huggingface.export_hf(params, unrolled, str(tmp_path / "hf_unrolled"))
    assert ((tmp_path / "hf_scanned" / "model.safetensors").read_bytes()
            == (tmp_path / "hf_unrolled" / "model.safetensors").read_bytes())


@pytest.mark.parametrize("remat, scan_layers", [("matmuls", False), ("full", True)])
def test_remat_leaves_loss_and_gradients_unchanged(remat, scan_layers):
    # With dropout on: the recomputed forward pass must draw the same dropout masks.
    plain = _config(dropout_rate=0.1, attention_dropout_rate=0.1, scan_layers=scan_layers)
    loss, _, grads = _results(plain, deterministic=False)
    remat_loss, _, remat_grads = _results(dataclasses.replace(plain, remat=remat), deterministic=False)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    _assert_trees_close(remat_grads, grads, atol=1e-6)


def test_scanned_program_does_not_grow_with_depth():
    # A proxy for compile time that asserts no timing: the lowered gradient program of the scanned model has the
    # same number of lines at any depth, while the unrolled one grows with it (a third layer adds ~370 lines; each
    # unrolled layer costs its own tracing, so the unrolled model grows by one layer only).
    def program_lines(config):
        model = model_lib.BertForPreTraining(config)
        abstract = jax.eval_shape(lambda: nn.meta.unbox(model.init(jax.random.key(0), **_inputs())))
        grad = jax.grad(lambda variables: jnp.sum(model.apply(variables, **_inputs())["mlm_logits"]))
        return len(jax.jit(grad).lower(abstract).as_text().splitlines())

    assert program_lines(_config(scan_layers=True)) == program_lines(_config(scan_layers=True, num_layers=6))
    assert program_lines(_config(num_layers=3)) > program_lines(_config()) + 100


# --- the last layer at the rows the heads read -----------------------------------------------------------------

@pytest.mark.parametrize("remat, scan_layers, packed", [("none", False, False), ("none", False, True),
                                                        ("full", False, True), ("none", True, True)])
def test_last_layer_at_the_head_rows_equals_the_full_model(remat, scan_layers, packed):
    config = _config(remat=remat, scan_layers=scan_layers)
    loss, outputs, grads = _results(config, packed=packed, sequence_output=False)
    full_loss, full_outputs, full_grads = _results(config, packed=packed, sequence_loss=False)
    assert "sequence_output" not in outputs
    for name in ("mlm_logits", "nsp_logits", "pooled_output"):
        assert outputs[name].shape == full_outputs[name].shape, name
        np.testing.assert_allclose(outputs[name], full_outputs[name], atol=2e-6, rtol=0, err_msg=name)
    np.testing.assert_allclose(loss, full_loss, rtol=1e-6)
    _assert_trees_close(grads, full_grads, atol=1e-6)


def test_layer_at_some_rows_equals_those_rows_of_the_full_layer():
    # A BertLayer on packed rows (a SegmentMask) gives each instance what it gives that instance alone, and the
    # layer at some rows only (repeats, any order) gives those rows of it.
    config = _config()
    layer = model_lib.BertLayer(config)
    apply = jax.jit(layer.apply, static_argnums=3)
    spans = [[(0, 8), (8, 12)], [(0, 4), (4, 8), (8, 16)]]
    instance_ids = np.zeros((2, LENGTH), np.int32)
    for row, row_spans in enumerate(spans):
        for number, (start, stop) in enumerate(row_spans, 1):
            instance_ids[row, start:stop] = number
    segments = model_lib.SegmentMask(jnp.asarray(instance_ids))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, LENGTH, config.hidden_size)), jnp.float32)
    params = {"params": helpers.random_params(layer, x, jnp.ones((2, LENGTH), bool), True)}
    packed = apply(params, x, segments, True)
    for row, row_spans in enumerate(spans):
        for start, stop in row_spans:
            alone = apply(params, x[row:row + 1, start:stop], jnp.ones((1, stop - start), bool), True)
            np.testing.assert_allclose(packed[row, start:stop], alone[0], atol=2e-6)
    rows = np.array([[0, 9, 9, 15], [3, 12, 4, 0]], np.int32)
    for mask, full in ((segments, packed), (jnp.asarray(instance_ids > 0), apply(params, x, instance_ids > 0, True))):
        at_rows = apply(params, x, mask, True, jnp.asarray(rows))
        np.testing.assert_allclose(at_rows, np.take_along_axis(np.asarray(full), rows[..., None], axis=1), atol=2e-6)


def _matmul_flops(closed_jaxpr) -> int:
    """FLOPs of every dot_general a jaxpr executes (a scan body times its length; a cond's costliest branch)."""
    def count(jaxpr):
        total = 0
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                (contracting, _), _ = eqn.params["dimension_numbers"]
                lhs = eqn.invars[0].aval.shape
                total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[axis] for axis in contracting)
            inner = [count(sub.jaxpr if hasattr(sub, "jaxpr") else sub) for sub in _sub_jaxprs(eqn.params)]
            if eqn.primitive.name == "cond":
                total += max(inner)
            else:
                total += sum(inner) * eqn.params.get("length", 1)
        return total

    return count(closed_jaxpr.jaxpr)


def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)):
                yield item


@pytest.mark.parametrize("scan_layers", [False, True])
def test_executed_matmul_flops_are_step_matmul_flops_per_sequence(scan_layers):
    # The count bert_jax.aot and the benchmark report beside the model FLOPs: unrolled, the last layer computes the
    # [CLS] and masked rows only; scanned, every layer computes every row.
    config = _config(scan_layers=scan_layers, num_layers=3)
    params = jax.eval_shape(lambda: nn.meta.unbox(model_lib.BertForPreTraining(config).init(
        jax.random.key(0), **_inputs()))["params"])
    model = model_lib.BertForPreTraining(config)

    def loss(params, sequence_output):
        outputs = model.apply({"params": params}, **_inputs(), sequence_output=sequence_output)
        return jnp.sum(outputs["mlm_logits"] ** 2) + jnp.sum(outputs["nsp_logits"] ** 2)

    def flops(sequence_output):
        return _matmul_flops(jax.make_jaxpr(jax.grad(functools.partial(loss, sequence_output=sequence_output)))(
            params))

    predictions = _inputs()["masked_lm_positions"].shape[1]
    assert flops(True) == BATCH * metrics_lib.model_flops_per_sequence(config, LENGTH, predictions)
    assert flops(False) == BATCH * metrics_lib.step_matmul_flops_per_sequence(config, LENGTH, predictions)
    assert (flops(False) < flops(True)) == (not scan_layers)


def test_heads_only_model_refuses_hidden_states():
    with pytest.raises(ValueError, match="output_hidden_states=True needs sequence_output=True"):
        model_lib.BertForPreTraining(_config()).apply({"params": _unrolled_params()}, **_inputs(),
                                                      output_hidden_states=True, sequence_output=False)
