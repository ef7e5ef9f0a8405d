"""The BERT model: parameter names and counts, padding invariance, tied decoder, activations, mixed precision,
config validation, FLOPs formulas."""

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from configs import pretrain
from tests import helpers

# The comparisons with transformers compile at XLA's full optimisation, as users' runs do; the checks of our own
# model's forms against each other (padding, bfloat16, GELU variants) at -O0 here and at -O2 in .ci/run's AVX pass
# (tests/conftest.py).


def _preset(size):
    return model_lib.BertConfig.from_config(pretrain.get_config(f"size={size}").model)


def _abstract_params(config):
    model = model_lib.BertForPreTraining(config)
    ids = jnp.zeros((1, 8), jnp.int32)
    return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))


@pytest.mark.parametrize("size, expected", [("base", 110_106_428), ("large", 336_226_108)])
def test_parameter_count_equals_huggingface_bert_for_pretraining(size, expected):
    # The figures are those of transformers.BertForPreTraining with the same config (vocab 30522); eval_shape
    # allocates nothing.
    params = _abstract_params(_preset(size))
    assert sum(leaf.size for leaf in jax.tree.leaves(params)) == expected


_LAYER_PARAMETERS = {  # name: logical axes (export to HuggingFace and checkpoints read these names)
    "attention/query/kernel": ("embed", "heads"), "attention/query/bias": ("heads",),
    "attention/key/kernel": ("embed", "heads"), "attention/key/bias": ("heads",),
    "attention/value/kernel": ("embed", "heads"), "attention/value/bias": ("heads",),
    "attention/output/kernel": ("heads", "embed"), "attention/output/bias": ("norm",),
    "attention_layer_norm/scale": ("norm",), "attention_layer_norm/bias": ("norm",),
    "intermediate/kernel": ("embed", "mlp"), "intermediate/bias": ("mlp",),
    "output/kernel": ("mlp", "embed"), "output/bias": ("norm",),
    "output_layer_norm/scale": ("norm",), "output_layer_norm/bias": ("norm",),
}
_OTHER_PARAMETERS = {
    "embeddings/word_embeddings/embedding": ("vocab", "embed"),
    "embeddings/position_embeddings/embedding": ("position", "embed"),
    "embeddings/token_type_embeddings/embedding": ("segment", "embed"),
    "embeddings/LayerNorm/scale": ("norm",), "embeddings/LayerNorm/bias": ("norm",),
    "pooler/kernel": ("embed", None), "pooler/bias": (None,),
}
_PRETRAINING_HEADS = {
    "nsp_head/kernel": ("embed", "classes"), "nsp_head/bias": ("classes",),
    "mlm_transform/kernel": ("embed", None), "mlm_transform/bias": (None,),
    "mlm_layer_norm/scale": ("norm",), "mlm_layer_norm/bias": ("norm",), "mlm_output_bias": ("vocab",),
}


def _names(variables):
    boxes = jax.tree_util.tree_leaves_with_path(variables["params"],
                                                is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    return {"/".join(key.key for key in path): box.names for path, box in boxes}


@pytest.mark.parametrize("scan_layers", [False, True])
def test_parameter_names_and_logical_axes(scan_layers):
    config = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                                  max_position_embeddings=16, scan_layers=scan_layers)
    ids = jnp.zeros((1, 8), jnp.int32)
    if scan_layers:
        layers = {f"layers/{name}": ("layers", *axes) for name, axes in _LAYER_PARAMETERS.items()}
    else:
        layers = {f"layer_{i}/{name}": axes for i in range(2) for name, axes in _LAYER_PARAMETERS.items()}
    encoder = {**_OTHER_PARAMETERS, **layers}
    pretraining = jax.eval_shape(lambda: model_lib.BertForPreTraining(config).init(
        jax.random.key(0), ids, ids, ids, jnp.zeros((1, 2), jnp.int32)))
    assert _names(pretraining) == {**encoder, **_PRETRAINING_HEADS}
    features = jax.eval_shape(lambda: model_lib.BertModel(config).init(jax.random.key(0), ids, ids, ids))
    assert _names(features) == encoder
    classifier = jax.eval_shape(lambda: model_lib.BertForSequenceClassification(config, 3).init(
        jax.random.key(0), ids, ids, ids))
    assert _names(classifier) == {**encoder, "classifier/kernel": ("embed", "classes"), "classifier/bias": ("classes",)}
    assert all(model_lib.is_encoder_parameter(name.split("/")[0]) for name in encoder)
    assert not any(model_lib.is_encoder_parameter(name.split("/")[0]) for name in _PRETRAINING_HEADS)


def test_every_parameter_has_logical_axis_names():
    params = _abstract_params(_preset("tiny"))["params"]
    boxes = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert boxes and all(isinstance(box, nn.LogicallyPartitioned) for box in boxes)
    for box in boxes:
        assert len(box.names) == box.value.ndim


@functools.lru_cache(maxsize=None)
def _jit_apply(model):
    """`model.apply` jitted: run op by op, each of the model's operations is compiled as a program of its own (and
    a gradient's too), which costs far more than compiling the whole forward pass once. One per model (modules of
    equal configs are equal) for the module: tests applying the same model to the same shapes trace it once."""
    return jax.jit(model.apply, static_argnames=("output_hidden_states",))


def _small_config(**overrides):
    return model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                                max_position_embeddings=40, **overrides)


def _small_inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 97, size=(3, 12)).astype(np.int32)
    segments = np.concatenate([np.zeros((3, 6)), np.ones((3, 6))], axis=1).astype(np.int32)
    positions = np.array([[1, 4, 7], [2, 3, 9], [5, 6, 8]], np.int32)
    return ids, segments, positions


def _small_model(**overrides):
    config = _small_config(**overrides)
    return (config, model_lib.BertForPreTraining(config), _small_params(), *_small_inputs())


@functools.lru_cache(maxsize=None)
def _small_params():
    """The small model's initial weights, initialised once for the module: the settings the tests vary (activation,
    compute dtype) change no parameter (float32 whatever the compute dtype: the bfloat16 test checks its model's own
    init), and compiling the init in each test took about as long as the test's own programs."""
    ids, segments, positions = _small_inputs()
    model = model_lib.BertForPreTraining(_small_config())
    return nn.meta.unbox(jax.jit(model.init)(jax.random.key(1), ids, np.ones_like(ids), segments, positions))


def test_padding_does_not_change_outputs_at_real_positions():
    config, model, params, ids, segments, positions = _small_model()
    lengths = np.array([12, 9, 5])
    mask = (np.arange(12)[None, :] < lengths[:, None]).astype(np.int32)
    ids = ids * mask
    apply = _jit_apply(model)
    short = apply(params, ids, mask, segments, positions % 5, output_hidden_states=True)
    # Append 20 more padding positions filled with junk ids: outputs at real positions must not move.
    pad = 20
    junk = np.full((3, pad), 42, np.int32)
    long = apply(params, np.concatenate([ids, junk], 1), np.pad(mask, ((0, 0), (0, pad))),
                       np.pad(segments, ((0, 0), (0, pad))), positions % 5, output_hidden_states=True)
    for layer, (a, b) in enumerate(zip(short["hidden_states"], long["hidden_states"])):
        for row, length in enumerate(lengths):
            np.testing.assert_allclose(b[row, :length], a[row, :length], rtol=1e-5, atol=1e-5,
                                       err_msg=f"hidden state {layer}, row {row}")
    np.testing.assert_allclose(long["mlm_logits"], short["mlm_logits"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(long["nsp_logits"], short["nsp_logits"], rtol=1e-5, atol=1e-5)


def test_padding_mask_is_used():
    # Changing a padded token's id must not matter; changing a real token must.
    config, model, params, ids, segments, positions = _small_model()
    mask = np.ones_like(ids)
    mask[:, 10:] = 0
    apply = _jit_apply(model)
    base = apply(params, ids, mask, segments, positions)["nsp_logits"]
    padded_changed = ids.copy()
    padded_changed[:, 11] = 3
    real_changed = ids.copy()
    real_changed[:, 2] = 3 if ids[0, 2] != 3 else 4
    np.testing.assert_allclose(apply(params, padded_changed, mask, segments, positions)["nsp_logits"], base,
                               rtol=1e-6, atol=1e-6)
    assert not np.allclose(apply(params, real_changed, mask, segments, positions)["nsp_logits"], base)


def test_mlm_decoder_is_tied_to_word_embeddings():
    config, model, params, ids, segments, positions = _small_model()
    flat = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    vocab_sized = [name for name, leaf in flat.items() if config.vocab_size in leaf.shape]
    # The only vocab-sized tensors: the word embeddings and the MLM output bias (no separate decoder matrix).
    assert sorted(vocab_sized) == sorted(["['params']['embeddings']['word_embeddings']['embedding']",
                                          "['params']['mlm_output_bias']"])
    # The logits are the transformed hidden states times the embedding matrix, plus the bias, computed by hand.
    p = params["params"]
    outputs = _jit_apply(model)(params, ids, np.ones_like(ids), segments, positions)
    hidden = np.take_along_axis(np.asarray(outputs["sequence_output"]), positions[..., None], axis=1)
    transform = hidden @ p["mlm_transform"]["kernel"] + p["mlm_transform"]["bias"]
    transform = np.asarray(jax.nn.gelu(transform, approximate=True))
    mean, var = transform.mean(-1, keepdims=True), transform.var(-1, keepdims=True)
    normed = (transform - mean) / np.sqrt(var + 1e-12) * p["mlm_layer_norm"]["scale"] + p["mlm_layer_norm"]["bias"]
    expected = normed @ np.asarray(p["embeddings"]["word_embeddings"]["embedding"]).T + p["mlm_output_bias"]
    np.testing.assert_allclose(outputs["mlm_logits"], expected, rtol=1e-4, atol=1e-5)


def test_embedding_gradient_includes_the_decoder_path():
    config, model, params, ids, segments, positions = _small_model()
    # A token that appears nowhere in the input still gets a gradient on its embedding row through the decoder.
    unused = next(t for t in range(1, config.vocab_size) if t not in ids)

    def loss(p):
        return model.apply(p, ids, np.ones_like(ids), segments, positions)["mlm_logits"][..., unused].sum()

    grads = jax.jit(jax.grad(loss))(params)["params"]["embeddings"]["word_embeddings"]["embedding"]
    assert np.any(np.asarray(grads[unused]) != 0)


def test_gelu_variants_differ_and_are_selectable():
    _, model_tanh, params, ids, segments, positions = _small_model(hidden_act="gelu_tanh")
    _, model_erf, _, _, _, _ = _small_model(hidden_act="gelu")
    a = _jit_apply(model_tanh)(params, ids, np.ones_like(ids), segments, positions)["mlm_logits"]
    b = _jit_apply(model_erf)(params, ids, np.ones_like(ids), segments, positions)["mlm_logits"]
    assert 0 < np.max(np.abs(np.asarray(a) - np.asarray(b))) < 1e-2


def test_initialisation_is_truncated_normal_with_stddev_002():
    config = model_lib.BertConfig(vocab_size=4096, hidden_size=256, num_layers=1, num_heads=4,
                                  intermediate_size=1024)
    model = model_lib.BertForPreTraining(config)
    ids = jnp.zeros((1, 8), jnp.int32)
    variables = jax.jit(model.init)(jax.random.key(3), ids, ids, ids, jnp.zeros((1, 2), jnp.int32))
    params = nn.meta.unbox(variables)["params"]
    table = np.asarray(params["embeddings"]["word_embeddings"]["embedding"])
    assert np.max(np.abs(table)) <= 2 * 0.02 + 1e-6  # truncated at two standard deviations, as TF's initialiser
    assert 0.015 < table.std() < 0.02  # a normal truncated at 2 sigma has std 0.88 sigma
    np.testing.assert_array_equal(params["layer_0"]["output_layer_norm"]["scale"], 1.0)
    np.testing.assert_array_equal(params["layer_0"]["intermediate"]["bias"], 0.0)


def test_bfloat16_training_tracks_float32():
    losses = {}
    for dtype in ("float32", "bfloat16"):
        config = helpers.tiny_config()
        config.model.dtype = dtype
        config.model.num_layers = 1  # bfloat16 rounds in every layer alike: a second one adds only compile time
        losses[dtype], state, _ = helpers.train_steps(config, jax.devices()[:1], 6)
        assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(state.params))
    # Six AdamW steps of the one-layer tiny preset on one batch: the loss falls by more than 1; bfloat16 compute stays
    # within 0.01 of float32 at every step.
    assert losses["float32"][-1] < losses["float32"][0] - 1.0, losses
    np.testing.assert_allclose(losses["bfloat16"], losses["float32"], atol=0.01)


def test_bfloat16_layer_norm_statistics_are_float32():
    config = model_lib.BertConfig(dtype="bfloat16")
    layer_norm = model_lib._layer_norm(config, "norm")  # pylint: disable=protected-access
    x = jnp.asarray(np.random.default_rng(0).normal(3.0, 2.0, (4, 1024)), jnp.bfloat16)
    ln_params = layer_norm.init(jax.random.key(0), x)
    jaxpr = jax.make_jaxpr(lambda x: layer_norm.apply(ln_params, x))(x)
    reductions = [eqn for eqn in jaxpr.jaxpr.eqns if eqn.primitive.name == "reduce_sum"]
    assert reductions and all(eqn.outvars[0].aval.dtype == jnp.float32 for eqn in reductions)
    exact = np.asarray(x, np.float64)
    exact = (exact - exact.mean(-1, keepdims=True)) / np.sqrt(exact.var(-1, keepdims=True) + config.layer_norm_eps)
    np.testing.assert_allclose(np.asarray(layer_norm.apply(ln_params, x), np.float64), exact, rtol=2 ** -7,
                               atol=2 ** -7)


def test_bfloat16_compute_keeps_float32_parameters():
    config, model, params, ids, segments, positions = _small_model(dtype="bfloat16")
    # The parameters the bfloat16 model's own init makes (their shapes and dtypes: nothing compiled).
    abstract = jax.eval_shape(model.init, jax.random.key(1), ids, np.ones_like(ids), segments, positions)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(abstract))
    outputs = _jit_apply(model)(params, ids, np.ones_like(ids), segments, positions)
    assert outputs["sequence_output"].dtype == jnp.bfloat16
    assert outputs["mlm_logits"].dtype == jnp.float32
    _, model32, _, _, _, _ = _small_model()
    reference = _jit_apply(model32)(params, ids, np.ones_like(ids), segments, positions)["mlm_logits"]
    np.testing.assert_allclose(outputs["mlm_logits"], reference, atol=0.1)


def test_model_flops_formula_for_base():
    config = _preset("base")
    flops = metrics_lib.model_flops_per_sequence(config, 128, 20)
    # 6 * 85M encoder matmul parameters * 128 tokens dominates; attention adds 12*L*d*T^2.
    encoder = 6 * 12 * (4 * 768 * 768 + 2 * 768 * 3072) * 128 + 12 * 12 * 768 * 128 * 128
    head = 6 * 20 * (768 * 768 + 768 * 30522)
    assert flops == pytest.approx(encoder + head + 6 * (768 * 768 + 2 * 768))


@pytest.mark.xla_optimized
def test_step_matmul_flops_count_the_last_layer_at_the_head_rows_unless_scanned():
    config = _preset("base")
    full = metrics_lib.model_flops_per_sequence(config, 128, 20)
    # Unrolled: 128 - 1 [CLS] - 20 masked rows of the last layer skip their projections, feed-forward and attention.
    skipped = (128 - 1 - 20) * 12 * 768 * (768 + 3072 + 128)
    assert metrics_lib.step_matmul_flops_per_sequence(config, 128, 20) == full - skipped
    assert metrics_lib.step_matmul_flops_per_sequence(config, 128, 20, cls_rows=3) == full - skipped + 2 * (
        12 * 768 * (768 + 3072 + 128))
    scanned = dataclasses.replace(config, scan_layers=True)
    assert metrics_lib.step_matmul_flops_per_sequence(scanned, 128, 20) == full


def _transformers_twin(tmp_path, architecture: str, head: str, **hf_overrides):
    """(transformers' model of `architecture` in eval mode, our BertConfig, our parameters): a small random one
    saved, its encoder imported with huggingface.import_hf (which must ignore only `head`) and `head` copied."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    from bert_jax.interop import huggingface  # pylint: disable=import-outside-toplevel
    torch.manual_seed(0)
    hf_config = transformers.BertConfig(vocab_size=300, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                        intermediate_size=128, max_position_embeddings=64, hidden_act="gelu",
                                        **hf_overrides)
    theirs = getattr(transformers, architecture)(hf_config).eval()
    theirs.save_pretrained(str(tmp_path))
    config, imported, report = huggingface.import_hf(str(tmp_path))
    assert report.ignored == [f"{head}.bias", f"{head}.weight"]
    state = theirs.state_dict()
    params = {name: value for name, value in imported.items() if model_lib.is_encoder_parameter(name)
              and name != "pooler"}
    params[head] = {"kernel": state[f"{head}.weight"].numpy().T, "bias": state[f"{head}.bias"].numpy()}
    return theirs, config, params


@pytest.mark.xla_optimized
def test_token_classification_logits_and_gradients_equal_transformers(tmp_path):
    """From the same weights (transformers' BertForTokenClassification saved, its encoder imported, its classifier
    copied), dropout off: the logits at every real position, and the fine-tuning train step's loss (the mean
    cross-entropy over the labelled positions, -100 ignored, as both sides do) and gradients, equal transformers'
    within 1e-4 of their scale; that one fine-tuning step moves the parameters as transformers' with torch's AdamW."""
    import torch  # pylint: disable=import-outside-toplevel
    from bert_jax.data import conll  # pylint: disable=import-outside-toplevel
    theirs, config, params = _transformers_twin(tmp_path, "BertForTokenClassification", "classifier", num_labels=5)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, (3, 20)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 12:], mask[2, 5:] = 0, 0
    labels = np.where(mask == 1, rng.integers(0, 5, ids.shape), conll.IGNORE).astype(np.int32)
    labels[:, 0] = conll.IGNORE
    segments = np.zeros_like(ids)

    def their_loss():
        return theirs(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                      token_type_ids=torch.tensor(segments, dtype=torch.long),
                      labels=torch.tensor(labels, dtype=torch.long))

    output = their_loss()
    output.loss.backward()
    # Copied: the step below computes torch's gradients again (and clips them in place).
    named = {name: parameter.grad.numpy().copy() for name, parameter in theirs.named_parameters()}
    no_dropout = dataclasses.replace(config, dropout_rate=0.0, attention_dropout_rate=0.0)  # theirs is in eval()
    model = model_lib.BertForTokenClassification(no_dropout, 5)
    batch = {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "label_ids": labels,
             "weights": np.ones(3, np.float32)}
    metrics, grads, logits = _one_finetuning_step_equals_torch(
        model, jax.tree.map(jnp.asarray, params), batch, theirs, lambda: their_loss().loss,
        [("classifier/kernel", "classifier.weight", True),
         ("layer_1/output/kernel", "bert.encoder.layer.1.output.dense.weight", True),
         ("layer_0/attention/query/kernel", "bert.encoder.layer.0.attention.self.query.weight", True),
         ("embeddings/word_embeddings/embedding", "bert.embeddings.word_embeddings.weight", False)],
        forward=lambda params, batch: model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                                                  batch["segment_ids"])["logits"])
    real = mask == 1
    their_logits = output.logits.detach().numpy()
    np.testing.assert_allclose(np.asarray(logits)[real], their_logits[real], atol=1e-4 * np.abs(their_logits).max())
    assert float(metrics["loss"]) == pytest.approx(float(output.loss), rel=1e-5)
    pairs = [(grads["classifier"]["kernel"], named["classifier.weight"].T),
             (grads["layer_1"]["output"]["kernel"], named["bert.encoder.layer.1.output.dense.weight"].T),
             (grads["layer_0"]["attention"]["query"]["kernel"],
              named["bert.encoder.layer.0.attention.self.query.weight"].T),
             (grads["embeddings"]["word_embeddings"]["embedding"], named["bert.embeddings.word_embeddings.weight"])]
    for ours, expected in pairs:
        np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4 * np.abs(expected).max())


def _one_finetuning_step_equals_torch(model, params, batch, theirs, their_loss, pairs, learning_rate=1e-3,
                                      forward=None):
    """One step of bert_jax's fine-tuning train step (the recipe's AdamW: weight decay on matrices only, clipping
    at global norm 1) moves the parameters as torch's AdamW with the same groups and clipping moves transformers'.

    Returns the step's metrics, its gradient (read back from AdamW's first moment) and `forward(params, batch)` of
    the parameters before the step, computed in the step's program (one compile at full optimisation, not two)."""
    import torch  # pylint: disable=import-outside-toplevel
    from bert_jax import optim, train  # pylint: disable=import-outside-toplevel
    from bert_jax import steps as steps_lib  # pylint: disable=import-outside-toplevel
    from configs import finetune as finetune_recipe  # pylint: disable=import-outside-toplevel
    optim_config = finetune_recipe.get_config().optim
    optim_config.learning_rate, optim_config.warmup_steps = learning_rate, 0
    tx, schedule = optim.create_optimizer(optim_config, 10)
    state = train.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params))
    train_step = steps_lib.make_classification_train_step(model, tx, schedule, ())
    step = jax.jit(lambda state, batch, rng: (*train_step(state, batch, rng),
                                              forward(state.params, batch) if forward else None))
    state, metrics, forwarded = step(state, batch, jax.random.key(0))
    grads = helpers.first_step_gradients(jax.device_get(state.opt_state), float(metrics["grad_norm"]), optim_config)
    named = dict(theirs.named_parameters())
    before = {name: value.detach().numpy().copy() for name, value in named.items()}
    groups = [{"params": [p for p in named.values() if p.ndim > 1], "weight_decay": optim_config.weight_decay},
              {"params": [p for p in named.values() if p.ndim <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=learning_rate, betas=(optim_config.b1, optim_config.b2),
                                  eps=optim_config.eps)
    theirs.zero_grad()
    their_loss().backward()
    torch.nn.utils.clip_grad_norm_(theirs.parameters(), optim_config.max_grad_norm)
    optimizer.step()
    for path, name, transpose in pairs:
        ours = np.asarray(functools.reduce(lambda tree, key: tree[key], path.split("/"), state.params))
        expected = named[name].detach().numpy()
        ours_moved = ours - (before[name].T if transpose else before[name])
        their_moved = (expected - before[name]).T if transpose else expected - before[name]
        assert np.abs(their_moved).max() > 0.5 * learning_rate, name  # Adam's first step moves by about lr
        np.testing.assert_allclose(ours_moved, their_moved, atol=1e-2 * learning_rate, err_msg=name)
    return metrics, grads, forwarded


@pytest.mark.xla_optimized
def test_question_answering_logits_loss_and_one_training_step_equal_transformers(tmp_path):
    """From the same weights (transformers' BertForQuestionAnswering saved, its encoder imported, qa_outputs
    copied), dropout off: start and end logits at every real position, the loss ((start + end cross-entropy) / 2),
    and one fine-tuning step of each side's AdamW equal transformers'."""
    import torch  # pylint: disable=import-outside-toplevel
    theirs, config, params = _transformers_twin(tmp_path, "BertForQuestionAnswering", "qa_outputs",
                                                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    params = jax.tree.map(jnp.asarray, params)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, (3, 20)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 12:], mask[2, 5:] = 0, 0
    segments = (np.arange(20) >= 6).astype(np.int32)[None].repeat(3, 0) * mask
    positions = np.array([[7, 9], [0, 0], [3, 4]], np.int32)  # the second row's answer is [CLS]: no answer
    model = model_lib.BertForQuestionAnswering(config)
    batch = {"input_ids": ids, "input_mask": mask, "segment_ids": segments, "label_ids": positions,
             "weights": np.ones(3, np.float32)}
    from bert_jax import steps as steps_lib  # pylint: disable=import-outside-toplevel
    eval_step = steps_lib.make_classification_eval_step(model, ())

    def their_loss():
        return theirs(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                      token_type_ids=torch.tensor(segments, dtype=torch.long),
                      start_positions=torch.tensor(positions[:, 0], dtype=torch.long),
                      end_positions=torch.tensor(positions[:, 1], dtype=torch.long))

    with torch.no_grad():
        output = their_loss()  # before the step below moves transformers' parameters
    # The logits and the eval step's sums computed in the train step's program: one compile at full optimisation.
    _, _, (outputs, sums) = _one_finetuning_step_equals_torch(
        model, params, batch, theirs, lambda: their_loss().loss, [
            # qa_outputs.bias is left out: a shift of every start (end) score leaves the softmax unchanged, so its
            # gradient is zero up to rounding, and Adam's first step turns that rounding into +-1e-5 either way.
            ("qa_outputs/kernel", "qa_outputs.weight", True),
            ("layer_1/output/kernel", "bert.encoder.layer.1.output.dense.weight", True),
            ("layer_0/attention/query/kernel", "bert.encoder.layer.0.attention.self.query.weight", True),
            ("embeddings/word_embeddings/embedding", "bert.embeddings.word_embeddings.weight", False)],
        forward=lambda params, batch: (
            model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"]),
            eval_step(params, batch)))
    real = mask == 1
    for ours, expected in ((outputs["start_logits"], output.start_logits), (outputs["end_logits"], output.end_logits)):
        expected = expected.numpy()
        np.testing.assert_allclose(np.asarray(ours)[real], expected[real], atol=1e-4 * np.abs(expected).max())
    np.testing.assert_array_equal(outputs["logits"][:, 0], outputs["start_logits"])
    assert float(sums["loss_sum"] / sums["count"]) == pytest.approx(float(output.loss), rel=1e-5)
