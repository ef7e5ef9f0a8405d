"""Dropout (flax.linen.Dropout, the "dropout" RNG stream): its rate and scale, in the model's training forward pass
too, and masks that do not depend on the sharding.

The tolerances are six binomial standard deviations of the dropped fraction: a correct dropout with any key
falls outside with probability about 2e-9, so the tests cannot flake, while a wrong rate (or a mask reused where
it should be fresh) shows at these sample sizes.
"""

import copy
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import job_config
from bert_jax import model as model_lib
from bert_jax import runtime
from bert_jax import train
from tests import helpers


def _assert_dropout_statistics(inputs, outputs, rate):
    """Of the nonzero inputs, a fraction `rate` is zeroed (to six standard deviations), the rest scaled by
    exactly 1 / (1 - rate)."""
    inputs, outputs = np.asarray(inputs, np.float32), np.asarray(outputs, np.float32)
    candidates = inputs != 0
    count = int(candidates.sum())
    dropped = (outputs == 0) & candidates
    tolerance = 6 * np.sqrt(rate * (1 - rate) / count)
    assert abs(dropped.sum() / count - rate) < tolerance, (dropped.sum() / count, rate, count)
    kept = candidates & ~dropped
    np.testing.assert_allclose(outputs[kept], inputs[kept] / np.float32(1 - rate), rtol=1e-6)


def test_dropout_drops_its_rate_and_scales_kept_elements():
    assert jax.config.jax_threefry_partitionable  # jax 0.10's default: masks do not depend on the sharding
    ones = jnp.ones((64, 128, 128))  # 1M decisions: six standard deviations are 0.0018 at rate 0.1
    for rate in (0.1, 0.5):
        dropped = nn.Dropout(rate).apply({}, ones, deterministic=False, rngs={"dropout": jax.random.key(2)})
        _assert_dropout_statistics(ones, dropped, rate)
    np.testing.assert_array_equal(nn.Dropout(0.1).apply({}, ones, deterministic=True), ones)


def test_every_dropout_of_the_training_forward_pass_drops_its_rate():
    # The train step's form of the model (the last layer at the [CLS] and masked rows only), with every dropout
    # recorded: the embeddings', each layer's on the attention probabilities, the attention output and the
    # feed-forward output.
    config = model_lib.BertConfig(vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128,
                                  max_position_embeddings=64, dropout_rate=0.1, attention_dropout_rate=0.2)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 128, size=(8, 64)).astype(np.int32)
    inputs = dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
                  masked_lm_positions=rng.integers(1, 64, size=(8, 10)).astype(np.int32))
    model = model_lib.BertForPreTraining(config)
    params = jax.jit(model.init)(jax.random.key(0), **inputs)
    rates = []

    def recorded(params):
        """Each dropout's input and output, returned from one jitted program (op by op, each operation of the
        model would compile as a program of its own); `rates` fills as it traces."""
        arrays = []

        def record(next_fun, args, kwargs, context):
            outputs = next_fun(*args, **kwargs)
            if isinstance(context.module, nn.Dropout) and context.method_name == "__call__":
                rates.append(context.module.rate)
                arrays.append((args[0], outputs))
            return outputs

        with nn.intercept_methods(record):
            model.apply(params, **inputs, deterministic=False, sequence_output=False,
                        rngs={"dropout": jax.random.key(1)})
        return arrays

    arrays = jax.jit(recorded)(params)
    calls = [(rate, x, dropped) for rate, (x, dropped) in zip(rates, arrays)]
    shapes = [(rate, tuple(x.shape)) for rate, x, _ in calls]
    hidden, probs, head_rows = (8, 64, 64), (8, 4, 64, 64), (8, 11, 64)
    assert shapes == [(0.1, hidden),  # embeddings
                      (0.2, probs), (0.1, hidden), (0.1, hidden),  # layer 0: probabilities, attention, feed-forward
                      (0.2, (8, 4, 11, 64)), (0.1, head_rows), (0.1, head_rows)], shapes  # layer 1 at the head rows
    for rate, x, dropped in calls:
        _assert_dropout_statistics(x, dropped, rate)
    # Each dropout draws its own mask.
    masks = [np.asarray(dropped == 0) for rate, _, dropped in calls if rate == 0.1 and dropped.shape == hidden]
    assert len(masks) == 3 and not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_dropout_mask_is_the_same_under_any_sharding():
    shape = (8, 4, 16, 32)

    def dropped(key):
        return nn.Dropout(0.1).apply({}, jnp.ones(shape), deterministic=False, rngs={"dropout": key})

    expected = np.asarray(jax.jit(dropped)(jax.random.key(7)))
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    for spec in (PartitionSpec("data"), PartitionSpec("data", "model"), PartitionSpec(None, None, "model")):
        mask = jax.jit(dropped, out_shardings=NamedSharding(mesh, spec))(jax.random.key(7))
        assert mask.sharding.spec == spec
        np.testing.assert_array_equal(np.asarray(mask), expected)


@pytest.mark.parametrize("choice", ["rbg", "unsafe_rbg"])
def test_rbg_dropout_keys_drop_their_rate(choice):
    key = train.dropout_key(0, choice, "cpu")
    assert str(jax.random.key_impl(key)) == train.DROPOUT_RNG_IMPLS[choice]
    inputs = jnp.ones((64, 1024), jnp.float32)
    outputs = nn.Dropout(rate=0.1).apply({}, inputs, deterministic=False, rngs={"dropout": jax.random.fold_in(key, 7)})
    _assert_dropout_statistics(inputs, outputs, 0.1)


def test_an_unsafe_rbg_run_resumes_bit_for_bit_and_only_with_its_kind_of_key(tmp_path):
    """A run resumed from its step-2 checkpoint (the 4-word key saved and read back) gives the uninterrupted run's
    losses of steps 3 and 4; a threefry config is refused that checkpoint, naming train.dropout_rng."""
    config = helpers.tiny_config((-1, 1, 1), dropout=True, num_steps=4, log_every=1)
    config.model.num_layers = 1
    config.train.dropout_rng = "unsafe_rbg"
    config.checkpoint.every_steps = 2
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    helpers.run_pretraining(copy.deepcopy(config), str(whole))
    # The interrupted run: the uninterrupted one's workdir with its checkpoint 2 (saved mid-run) as the newest and no
    # logged step, so that every loss compared below is the resumed run's.
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "4")
    os.remove(resumed / "metrics.jsonl")
    helpers.run_pretraining(copy.deepcopy(config), str(resumed))
    losses = [[json.loads(line)["loss"] for line in open(run / "metrics.jsonl", encoding="utf-8")][-2:]
              for run in (whole, resumed)]
    assert [json.loads(line)["step"] for line in open(resumed / "metrics.jsonl", encoding="utf-8")] == [3, 4]
    assert losses[0] == losses[1]
    threefry = copy.deepcopy(config)
    threefry.train.dropout_rng = "threefry"
    threefry.train.num_steps = 6
    with pytest.raises(checkpoint_lib.CheckpointMismatchError, match=r"its dropout key has shape \(4,\) where this "
                                                                       r"config's train.dropout_rng has \(2,\)"):
        helpers.run_pretraining(threefry, str(resumed))


def test_the_driver_sets_the_libtpu_option_unsafe_rbg_needs_and_no_other():
    option = "--xla_tpu_spmd_rng_bit_generator_unsafe=true"
    assert runtime.with_libtpu_options("", "unsafe_rbg") == option
    assert runtime.with_libtpu_options("--a=1", "unsafe_rbg") == f"--a=1 {option}"
    assert runtime.with_libtpu_options("--xla_tpu_spmd_rng_bit_generator_unsafe=false", "unsafe_rbg") == \
        "--xla_tpu_spmd_rng_bit_generator_unsafe=false"  # the user's own setting wins
    for choice in ("threefry", "rbg"):
        assert runtime.with_libtpu_options("--a=1", choice) == "--a=1"
    # auto is unsafe_rbg on a TPU (and threefry on the CPU and GPUs), so the driver sets the option for it too.
    assert runtime.with_libtpu_options("", "auto") == option
    assert [runtime.dropout_rng_name("auto", platform) for platform in ("tpu", "gpu", "cpu")] == \
        ["unsafe_rbg", "threefry", "threefry"]
    with pytest.raises(ValueError, match=r"--config.train.dropout_rng='philox': choose auto or one of"):
        job_config.validate_dropout_rng("philox")
