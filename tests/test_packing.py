"""Sequence packing: the packer keeps instances whole and exactly once, and packed rows train like unpacked ones."""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import input_pipeline
from bert_jax import model as model_lib
from bert_jax.data import packing
from bert_jax import job_config
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from configs import pretrain
from tests import helpers

FIXTURE = os.path.join(helpers.FIXTURES, "sample_seq128.tfrecord")
SEQ, PREDICTIONS, INSTANCES = 64, 5, 4


def _fixture_instances():
    """The 60 instances of the original tools' sample file, unpacked, in file order."""
    dataset = input_pipeline.tfrecord_dataset(FIXTURE, batch_size=60, max_seq_length=128, max_predictions_per_seq=20,
                                              training=False, seed=0)
    return {name: value.numpy() for name, value in next(iter(dataset)).items()}


def _short_instances(count=24, seed=0):
    """Valid BERT instances of 16..32 tokens (the synthetic generator's rules) in rows of SEQ: 2-4 fit a row."""
    batch = input_pipeline.synthetic_batch(np.random.default_rng(seed), batch_size=count, max_seq_length=SEQ // 2,
                                           max_predictions_per_seq=PREDICTIONS, vocab_size=helpers.TINY_VOCAB)
    for name in ("input_ids", "input_mask", "segment_ids"):
        batch[name] = np.pad(batch[name], ((0, 0), (0, SEQ // 2)))
    return batch


def _pack(batch, instances=INSTANCES, predictions=PREDICTIONS * INSTANCES):
    return packing.pack_batch(batch, max_instances_per_row=instances, max_predictions_per_row=predictions)


def _unpack(packed):
    """Every instance read back from packed rows alone, as a comparable tuple, checking each is one contiguous
    block at its [CLS] with positions restarting at 0."""
    found = []
    for row in range(len(packed["input_ids"])):
        for slot in np.flatnonzero(packed["nsp_weights"][row]):
            tokens = np.flatnonzero(packed["instance_ids"][row] == slot + 1)
            start = packed["nsp_positions"][row, slot]
            assert tokens[0] == start and np.array_equal(tokens, np.arange(start, start + len(tokens))), (row, slot)
            np.testing.assert_array_equal(packed["position_ids"][row, tokens], np.arange(len(tokens)))
            assert packed["input_mask"][row, tokens].all()
            predictions = np.isin(packed["masked_lm_positions"][row], tokens) & (packed["masked_lm_weights"][row] > 0)
            found.append((tuple(packed["input_ids"][row, tokens]), tuple(packed["segment_ids"][row, tokens]),
                          int(packed["next_sentence_labels"][row, slot]),
                          tuple(packed["masked_lm_positions"][row, predictions] - start),
                          tuple(packed["masked_lm_ids"][row, predictions])))
        # Padding is exactly what no instance holds.
        np.testing.assert_array_equal(packed["input_mask"][row] == 0, packed["instance_ids"][row] == 0)
    return found


def _originals(batch):
    result = []
    for index, length in enumerate(batch["input_mask"].sum(1)):
        predictions = batch["masked_lm_weights"][index] > 0
        result.append((tuple(batch["input_ids"][index, :length]), tuple(batch["segment_ids"][index, :length]),
                       int(batch["next_sentence_labels"][index]),
                       tuple(batch["masked_lm_positions"][index, predictions]),
                       tuple(batch["masked_lm_ids"][index, predictions])))
    return result


def test_packer_keeps_every_instance_whole_once_and_is_deterministic():
    batch = _fixture_instances()
    packed = _pack(batch, predictions=20 * INSTANCES)
    again = _pack(batch, predictions=20 * INSTANCES)
    assert all(np.array_equal(packed[name], again[name]) for name in packing.PACKED_FEATURES)
    assert sorted(_unpack(packed)) == sorted(_originals(batch))
    short = _short_instances()
    assert sorted(_unpack(_pack(short))) == sorted(_originals(short))


def test_numpy_packer_gives_the_tf_data_packers_rows():
    # The GPU check packs with pack_batch_numpy (its images may lack TensorFlow): its rows must be the pipeline's.
    fixture, short = _fixture_instances(), _short_instances(count=64, seed=5)
    for batch, instances, predictions in ((fixture, INSTANCES, 20 * INSTANCES), (fixture, 8, 40), (short, 1, 5),
                                          (short, 2, 6), (short, 3, 15), (short, 4, 20)):
        expected = _pack(batch, instances, predictions)
        got = packing.pack_batch_numpy(batch, max_instances_per_row=instances, max_predictions_per_row=predictions)
        assert set(got) == set(packing.PACKED_FEATURES)
        for name in packing.PACKED_FEATURES:
            assert got[name].dtype == expected[name].dtype, name
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    with pytest.raises(ValueError, match="more predictions than the 4 slots of a packed row"):
        packing.pack_batch_numpy(short, max_instances_per_row=4, max_predictions_per_row=4)
    shifted = dict(short, input_mask=np.roll(short["input_mask"], 1, axis=1))
    with pytest.raises(ValueError, match="packing needs trailing padding"):
        packing.pack_batch_numpy(shifted, max_instances_per_row=4, max_predictions_per_row=20)


def test_padding_fraction_falls_on_the_fixture():
    batch = _fixture_instances()
    assert int(batch["input_mask"].sum()) == 6207
    packed = _pack(batch, predictions=20 * INSTANCES)
    assert len(packed["input_ids"]) == 51  # 60 instances; 6207 tokens need at least 49 rows of 128
    assert packing.padding_fraction([batch]) == pytest.approx(1 - 6207 / (60 * 128))  # 0.1918
    assert packing.padding_fraction([packed]) == pytest.approx(1 - 6207 / (51 * 128))  # 0.0492


def test_rows_respect_the_instance_token_and_prediction_limits():
    short = _short_instances(count=64, seed=5)
    for instances, predictions in ((1, 5), (2, 6), (3, 15), (4, 20)):
        packed = _pack(short, instances, predictions)
        assert packed["nsp_weights"].shape[1] == instances and packed["masked_lm_weights"].shape[1] == predictions
        assert (packed["nsp_weights"].sum(1) >= 1).all()
        assert sorted(_unpack(packed)) == sorted(_originals(short))
    assert len(_pack(short, 1, 5)["input_ids"]) == 64
    with pytest.raises(tf.errors.InvalidArgumentError, match="more predictions than the 4 slots of a packed row"):
        _pack(short, 4, 4)
    shifted = dict(short, input_mask=np.roll(short["input_mask"], 1, axis=1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="packing needs trailing padding"):
        _pack(shifted)


@pytest.fixture(scope="module")
def tiny_model():
    """(config, model, params, unpacked, packed): a two-layer fp32 model without dropout and 24 instances."""
    config = helpers.tiny_config()
    config.model.num_layers, config.model.hidden_size, config.model.num_heads = 2, 32, 4
    config.model.intermediate_size = 64
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    unpacked = _short_instances()
    init = jax.jit(lambda rng: nn.meta.unbox(model.init(rng, **steps_lib.model_inputs(unpacked)))["params"])
    packed = _pack(unpacked)
    return config, model, init(jax.random.key(7)), unpacked, packed


def _instance_index(unpacked, packed):
    """(row, slot) of each instance, and the instance index at each (row, slot) of the packed rows (-1: empty)."""
    row, slot, _, _ = packing.place_instances(
        unpacked["input_mask"].sum(1), (unpacked["masked_lm_weights"] > 0).sum(1), max_seq_length=SEQ,
        max_instances_per_row=packed["nsp_weights"].shape[1],
        max_predictions_per_row=packed["masked_lm_weights"].shape[1])
    index = np.full(packed["nsp_weights"].shape, -1)
    index[row, slot] = np.arange(len(row))
    return row, slot, index


def test_packed_rows_give_each_instance_its_unpacked_losses(tiny_model):
    _, model, params, unpacked, packed = tiny_model
    assert len(packed["input_ids"]) <= len(unpacked["input_ids"]) // 2

    # The model and its per-instance NSP terms in one program: op by op, the terms would compile each operation for
    # each batch shape on its own.
    @jax.jit
    def apply(batch):
        outputs = model.apply({"params": params}, **steps_lib.model_inputs(batch))
        return outputs, steps_lib._nsp_terms(outputs["nsp_logits"], batch)[0]

    (alone, nsp_alone), (together, nsp_together) = apply(unpacked), apply(packed)
    assert together["nsp_logits"].shape == (len(packed["input_ids"]), INSTANCES, 2)
    row, slot, index = _instance_index(unpacked, packed)

    np.testing.assert_allclose(np.asarray(together["nsp_logits"])[row, slot], alone["nsp_logits"], rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(np.asarray(nsp_together).reshape(index.shape)[row, slot], nsp_alone, rtol=1e-5)

    def mlm_sums(outputs, batch, owner):
        logits = np.asarray(outputs["mlm_logits"], np.float64)
        log_norm = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        xent = log_norm - np.take_along_axis(logits, batch["masked_lm_ids"][..., None], -1)[..., 0]
        sums = np.zeros(len(unpacked["input_ids"]))
        np.add.at(sums, owner, (batch["masked_lm_weights"] * xent).ravel())
        return sums

    rows = np.arange(len(packed["input_ids"]))[:, None]
    owner_slot = packed["instance_ids"][rows, packed["masked_lm_positions"]] - 1  # padding slots: weight 0
    owner = index[np.broadcast_to(rows, owner_slot.shape), np.maximum(owner_slot, 0)].ravel()
    expected = mlm_sums(alone, unpacked, np.repeat(np.arange(len(unpacked["input_ids"])), PREDICTIONS))
    np.testing.assert_allclose(mlm_sums(together, packed, owner), expected, rtol=1e-5)
    assert (expected > 0).all()

    # One instance per row, positions 0.. and instance id 1 for real tokens: exactly the unpacked model.
    single = dict(unpacked, position_ids=np.broadcast_to(np.arange(SEQ, dtype=np.int32), (24, SEQ)),
                  instance_ids=unpacked["input_mask"], nsp_positions=np.zeros((24, 1), np.int32))
    np.testing.assert_allclose(apply(single)[0]["nsp_logits"][:, 0], alone["nsp_logits"], rtol=1e-5, atol=1e-6)


def test_packed_loss_gradient_and_eval_sums_equal_unpacked(tiny_model):
    config, model, params, unpacked, packed = tiny_model
    rules = sharding_lib.logical_rules(config.mesh)
    grad_fn = jax.jit(steps_lib.make_grad_fn(model, rules))
    (loss_alone, metrics_alone), grads_alone = grad_fn(params, unpacked, jax.random.key(0),
                                                       *steps_lib.batch_denominators(unpacked))
    denominators = steps_lib.batch_denominators(packed)
    assert float(denominators[1]) == 24.0  # NSP averages over the real instances, not rows or slots
    (loss, metrics), grads = grad_fn(params, packed, jax.random.key(0), *denominators)
    assert float(loss) == pytest.approx(float(loss_alone), rel=1e-5)
    for name in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
        assert float(metrics[name]) == pytest.approx(float(metrics_alone[name]), rel=1e-5, abs=1e-7), name
    scale = max(float(np.abs(leaf).max()) for leaf in jax.tree.leaves(grads_alone))
    for path, a, b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads),
                          jax.tree.leaves(grads_alone)):
        np.testing.assert_allclose(a, b, atol=1e-5 * scale, rtol=0, err_msg=jax.tree_util.keystr(path[0]))

    # Micro-batches of packed rows normalised by the whole batch sum to the whole batch's gradient. Each half keeps
    # the batch's shape (no recompilation) with the other half's rows emptied: empty rows contribute nothing.
    rows = np.arange(len(packed["input_ids"]))
    halves = [{name: value * (rows % 2 == part).reshape(-1, *[1] * (value.ndim - 1)).astype(value.dtype)
               for name, value in packed.items()} for part in (0, 1)]
    # Added on the host: on the devices each parameter shape would compile an addition of its own.
    summed = jax.tree.map(np.add, *(jax.device_get(grad_fn(params, half, jax.random.key(0), *denominators)[1])
                                    for half in halves))
    for a, b in zip(jax.tree.leaves(summed), jax.tree.leaves(grads)):
        np.testing.assert_allclose(a, b, atol=1e-6 * scale, rtol=0)

    eval_step = jax.jit(steps_lib.make_eval_step(model, rules))
    sums_alone, sums = eval_step(params, unpacked), eval_step(params, packed)
    assert float(sums["nsp_count"]) == 24.0 and float(sums["mlm_weight"]) == float(sums_alone["mlm_weight"])
    for name in sums:
        assert float(sums[name]) == pytest.approx(float(sums_alone[name]), rel=1e-5), name


def _data_config(**overrides):
    config = pretrain.get_config("size=tiny,data=tfrecord")
    config.data.input_files = config.data.eval_input_files = FIXTURE
    config.data.max_seq_length, config.data.max_predictions_per_seq = 128, 20
    config.data.pack = True
    for name, value in overrides.items():
        config.data[name] = value
    return config.data


def test_pipeline_packs_dynamically_masked_instances_and_resumes(tmp_path):
    data = _data_config(masking="dynamic", max_predictions_per_row=32, pack_window=32, shuffle_buffer=16)
    batches = input_pipeline.make_iterator(data, split="train", batch_size=8, vocab_size=30522, seed=3)
    first = [next(batches) for _ in range(2)]
    batch = first[0]
    assert set(batch) == set(packing.PACKED_FEATURES)
    assert batch["input_ids"].shape == (8, 128) and batch["masked_lm_positions"].shape == (8, 32)
    assert batch["nsp_positions"].shape == batch["nsp_weights"].shape == (8, 4)
    for packed in first:
        rows = np.arange(8)[:, None]
        real = packed["masked_lm_weights"] > 0
        # Masks were drawn per instance before packing: each prediction lies inside a real instance, never on its
        # [CLS] or [SEP], and every instance that has predictions keeps them inside itself.
        assert (packed["instance_ids"][rows, packed["masked_lm_positions"]][real] > 0).all()
        assert not np.isin(packed["masked_lm_ids"][real], (101, 102, 0)).any()
        np.testing.assert_array_equal(packed["input_ids"][rows, packed["nsp_positions"]][packed["nsp_weights"] > 0],
                                      101)
    assert packing.padding_fraction(first) < 0.1
    batches.save_state(str(tmp_path / "input"))
    following = [next(batches) for _ in range(2)]
    resumed = input_pipeline.make_iterator(data, split="train", batch_size=8, vocab_size=30522, seed=3)
    resumed.restore_state(str(tmp_path / "input"))
    for expected in following:
        got = next(resumed)
        assert all(np.array_equal(got[name], expected[name]) for name in packing.PACKED_FEATURES)

    # Held-out data is read once: every instance is packed in (static masks kept), the last batch padded.
    held_out = list(input_pipeline.make_iterator(_data_config(pack_window=60), split="eval", batch_size=8,
                                                 vocab_size=30522, seed=0))
    assert all(b["input_ids"].shape == (8, 128) for b in held_out)
    assert sum(float(b["nsp_weights"].sum()) for b in held_out) == 60


def test_packing_config_is_checked_and_off_by_default():
    defaults = pretrain.get_config().data
    assert defaults.pack is False and packing.PackingOptions.from_config(defaults) is None
    assert packing.PackingOptions.from_config(_data_config()) == packing.PackingOptions(4, 80, 256)
    with pytest.raises(ValueError, match="max_predictions_per_row=10 is below data.max_predictions_per_seq=20"):
        packing.validate_config(_data_config(max_predictions_per_row=10))
    with pytest.raises(ValueError, match="max_instances_per_row=0"):
        packing.validate_config(_data_config(max_instances_per_row=0))
    synthetic = helpers.tiny_config()
    synthetic.data.pack = True
    with pytest.raises(ValueError, match="data.pack=True .* synthetic"):
        job_config.validate(synthetic, "train", 1)
