"""The train step, the optimizer and config validation (the loop: test_pretraining.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import runtime
from bert_jax import sharding as sharding_lib
from bert_jax import steps as steps_lib
from bert_jax import train
from bert_jax.data import input_pipeline
from tests import helpers


def _trainer(config, devices=1, state=None):
    """(initial state, run(state, batch) -> (state, metrics)): the train step jitted without donation, so a state
    can be passed to several trainers (pass it as `state` to skip creating another)."""
    mesh = sharding_lib.create_mesh(config.mesh, jax.devices()[:devices])
    rules = sharding_lib.logical_rules(config.mesh)
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    with jax.set_mesh(mesh):
        if state is None:
            state, shardings = train.create_train_state(model, tx, mesh, rules, jax.random.key(0),
                                                        config.data.max_seq_length,
                                                        config.data.max_predictions_per_seq)
        else:
            _, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, config.data.max_seq_length,
                                                         config.data.max_predictions_per_seq)
        batch_sharding = sharding_lib.batch_sharding(mesh, rules)
        replicated = NamedSharding(mesh, PartitionSpec())
        step = jax.jit(steps_lib.make_train_step(model, tx, schedule, rules, mesh, config.optim.grad_accum_steps),
                       in_shardings=(shardings, batch_sharding, replicated), out_shardings=(shardings, replicated))

    def run(state, batch):
        with jax.set_mesh(mesh):
            return step(state, sharding_lib.make_global_batch(batch, batch_sharding), jax.random.key(1))

    return state, run


def _batch(config, seed=3):
    return next(input_pipeline.synthetic_batches(
        batch_size=config.train.batch_size, max_seq_length=config.data.max_seq_length,
        max_predictions_per_seq=config.data.max_predictions_per_seq, vocab_size=config.model.vocab_size, seed=seed))


def _one_layer(config):
    """One encoder layer: what these tests show (losses, metrics, accumulation) needs no second one, and each
    compilation takes less."""
    config.model.num_layers = 1
    return config


@pytest.mark.parametrize("optimizer, dtype", [("adamw", "float32"), ("lamb", "float32"), ("adamw", "bfloat16")])
def test_train_step_reports_every_metric_and_the_loss_falls_on_a_repeated_batch(optimizer, dtype):
    config = _one_layer(helpers.tiny_config())
    config.optim.optimizer = optimizer
    config.model.dtype = dtype
    config.optim.learning_rate = 3e-3 if optimizer == "adamw" else 5e-2
    config.train.num_steps = 40
    state, run = _trainer(config)
    batch = _batch(config)
    state, metrics = run(state, batch)
    # The first step's metrics: all of them, and those of a random model, which predicts ~uniformly: MLM loss
    # near log(vocab), NSP loss near log(2).
    assert set(metrics) == {"loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "grad_norm",
                            "learning_rate", "params_finite"}
    assert float(metrics["loss"]) == pytest.approx(float(metrics["mlm_loss"]) + float(metrics["nsp_loss"]), rel=1e-6)
    assert float(metrics["mlm_loss"]) == pytest.approx(np.log(helpers.TINY_VOCAB), rel=0.05)
    assert float(metrics["nsp_loss"]) == pytest.approx(np.log(2), rel=0.1)
    assert float(metrics["learning_rate"]) == 0.0  # step 0 of a linear warmup
    assert int(state.step) == 1
    losses = [float(metrics["loss"])]
    for _ in range(39):
        state, metrics = run(state, batch)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < 0.5 * losses[0], losses
    assert float(metrics["mlm_accuracy"]) > 0.5
    # bf16 compute keeps float32 master weights and optimizer state.
    assert all(leaf.dtype == np.float32 for leaf in jax.tree.leaves(state.params))


def test_mlm_accuracy_counts_the_weighted_predictions_equal_to_the_label():
    # Half the labels are set to the model's argmax prediction: the accuracy counts those (and chance matches).
    config = _one_layer(helpers.tiny_config())
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    batch = _batch(config)
    inputs = {k: batch[k] for k in ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")}

    # One jitted program: op by op, the model and the loss would compile each of their operations on their own.
    @jax.jit
    def predictions_and_metrics(rng, batch):
        params = model.init(rng, **inputs, deterministic=True)["params"]
        outputs = model.apply({"params": params}, **inputs, deterministic=True)
        predicted = outputs["mlm_logits"].argmax(-1)
        labels = batch["masked_lm_ids"]
        batch = {**batch, "masked_lm_ids": jnp.where(jnp.arange(labels.shape[1]) % 2 == 0, predicted, labels)}
        return predicted, batch["masked_lm_ids"], steps_lib.pretraining_loss(outputs, batch, 1.0, 1.0)[1]

    predicted, labels, metrics = jax.device_get(predictions_and_metrics(jax.random.key(0), batch))
    batch = {**batch, "masked_lm_ids": labels}
    weights = np.asarray(batch["masked_lm_weights"], np.float32)
    expected = np.sum(weights * (predicted == batch["masked_lm_ids"]))
    assert expected >= 2
    assert float(metrics["mlm_accuracy"]) == pytest.approx(expected, abs=1e-6)


def test_gradient_accumulation_equals_the_whole_batch():
    config = _one_layer(helpers.tiny_config((2, 1, 1)))
    batch = _batch(config)
    results, start = [], None
    for accum in (1, 4):
        config.optim.grad_accum_steps = accum
        state, run = _trainer(config, devices=2, state=start)
        start = state  # not donated: both steps start from the same state
        state, metrics = run(state, batch)
        results.append((jax.device_get(state.params), {k: float(v) for k, v in metrics.items()}))
    (params_1, metrics_1), (params_4, metrics_4) = results
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
        assert metrics_4[key] == pytest.approx(metrics_1[key], rel=1e-5), key
    for a, b in zip(jax.tree.leaves(params_4), jax.tree.leaves(params_1)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_weight_decay_skips_layer_norm_and_biases():
    config = helpers.tiny_config()
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    ids = np.zeros((1, 8), np.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, ids[:, :2]))["params"]
    params = sharding_lib.unbox(params)
    mask = {jax.tree_util.keystr(path): value
            for path, value in jax.tree_util.tree_leaves_with_path(optim.decay_mask(params))}
    assert mask["['layer_0']['attention']['query']['kernel']"]
    assert mask["['embeddings']['word_embeddings']['embedding']"]
    assert not mask["['layer_0']['attention']['query']['bias']"]
    assert not mask["['layer_0']['output_layer_norm']['scale']"]
    assert not mask["['embeddings']['LayerNorm']['bias']"]
    assert not mask["['mlm_output_bias']"]
    # Behaviour, not just the mask: with a zero gradient only decayed weights move.
    config.optim.max_grad_norm = 0.0
    tx, _ = optim.create_optimizer(config.optim, 10)
    ones = jax.tree.map(lambda p: np.ones(p.shape, np.float32), params)
    zeros = jax.tree.map(np.zeros_like, ones)
    state = tx.init(ones)
    update = jax.jit(tx.update)  # one compilation, not one per operation
    for _ in range(3):  # past step 0, where the warmup learning rate is 0
        updates, state = update(zeros, state, ones)
    moved = jax.tree.map(lambda u: bool(np.any(np.asarray(u) != 0)), updates)
    assert moved["layer_0"]["attention"]["query"]["kernel"]
    assert not moved["layer_0"]["attention"]["query"]["bias"]
    assert not moved["layer_0"]["output_layer_norm"]["scale"]


@pytest.mark.parametrize("decay, power, midpoint", [("linear", 1.0, 0.5e-3), ("polynomial", 2.0, 0.25e-3)])
def test_schedule_warms_up_then_decays(decay, power, midpoint):
    """Over train.num_steps (110), or over optim.schedule_steps (110) whatever train.num_steps (20) is."""
    config = helpers.tiny_config()
    config.optim.learning_rate, config.optim.warmup_steps = 1e-3, 10
    config.optim.decay, config.optim.decay_power = decay, power
    for schedule_steps, num_steps in ((0, 110), (110, 20)):
        config.optim.schedule_steps = schedule_steps
        schedule = optim.learning_rate_schedule(config.optim, num_steps)
        assert float(schedule(0)) == 0.0
        assert float(schedule(5)) == pytest.approx(0.5e-3)
        assert float(schedule(10)) == pytest.approx(1e-3)
        assert float(schedule(60)) == pytest.approx(midpoint)
        assert float(schedule(110)) == pytest.approx(0.0, abs=1e-12)


def test_optimizer_equals_the_optax_chain():
    """create_optimizer's AdamW + clipping takes the steps, and keeps the state, of optax's own chain."""
    config = helpers.tiny_config()
    config.optim.max_grad_norm, config.optim.warmup_steps = 1.0, 0
    tx, schedule = optim.create_optimizer(config.optim, 10)
    o = config.optim
    reference = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
        schedule, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=optim.decay_mask))
    rng = np.random.default_rng(1)
    params = {"kernel": rng.normal(size=(8, 4)).astype(np.float32), "bias": rng.normal(size=(4,)).astype(np.float32)}
    ours, theirs = (params, tx.init(params)), (params, reference.init(params))
    assert jax.tree.structure(ours[1]) == jax.tree.structure(theirs[1])
    for step in range(3):
        grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32) * 10.0 ** step, params)
        results = []
        for chain, (p, s) in ((tx, ours), (reference, theirs)):
            updates, s = jax.jit(chain.update)(grads, s, p)
            results.append((optax.apply_updates(p, updates), s))
        ours, theirs = results
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-6, atol=1e-7)
    assert not np.allclose(ours[0]["kernel"], params["kernel"])


def test_locked_config_refuses_misspelt_fields():
    config = helpers.tiny_config()
    config.lock()
    with pytest.raises(AttributeError, match="learning_rat"):
        config.optim.learning_rat = 1.0


def test_a_pretraining_step_with_onednns_dots_gives_eigens_losses(monkeypatch):
    """The tiny pretraining step (jit_train_step's), three steps on one device, with each kind of dots: the same
    losses to float32's rounding of differently ordered sums."""
    losses = {}
    for dots in ("eigen", "onednn"):
        monkeypatch.setenv(runtime.CPU_DOTS_VARIABLE, dots)
        config = helpers.tiny_config()
        losses[dots], _, _ = helpers.train_steps(config, jax.devices()[:1], 3)
    assert losses["eigen"][-1] < losses["eigen"][0]
    # 7e-8 apart on a 2-core AMD EPYC (AVX2)
    np.testing.assert_allclose(losses["onednn"], losses["eigen"], rtol=1e-6)


def test_a_state_from_given_parameters_takes_them_whole_and_initialises_only_the_rest():
    """Setup.create_state(rng, given), as a run from --config.init makes its first state: the given parameters as they
    are (donated, not copied), the others and the optimizer state as a fresh state from the same key has them."""
    config = helpers.tiny_config((2, 2, 2))
    mesh, rules, model, tx = helpers.state_on_mesh(config, (2, 2, 2))
    with jax.set_mesh(mesh):
        setup = train.Setup.build(model, tx, None, mesh, rules, train.init_inputs(config.data.max_seq_length,
                                                                                  config.data.max_predictions_per_seq))
        fresh = setup.create_state(jax.random.key(0))
        names = [name for name in setup.abstract.params if model_lib.is_encoder_parameter(name)]
        assert names and len(names) < len(setup.abstract.params)  # a head stays to initialise
        values = {name: jax.tree.map(lambda leaf: np.linspace(-1, 1, leaf.size, dtype=leaf.dtype).reshape(leaf.shape),
                                     setup.abstract.params[name]) for name in names}
        given = jax.device_put(values, {name: setup.shardings.params[name] for name in names})
        state = setup.create_state(jax.random.key(0), given)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(given))
    for name in setup.abstract.params:
        expected = values[name] if name in values else jax.device_get(fresh.params[name])
        for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(jax.device_get(state.params[name]))):
            np.testing.assert_array_equal(got, want)
    assert jax.tree.structure(state) == jax.tree.structure(fresh)
    for want, got in zip(jax.tree.leaves(fresh), jax.tree.leaves(state)):
        assert got.sharding == want.sharding
    for want, got in zip(jax.tree.leaves(fresh.opt_state), jax.tree.leaves(state.opt_state)):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
