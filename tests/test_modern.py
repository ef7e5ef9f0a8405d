"""The modern encoder (bert_jax.modern): sliding-window attention on every back-end, and logits equal to
transformers' ModernBertForMaskedLM from the same weights."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import attention
from bert_jax import modern
from bert_jax.interop import layout
from bert_jax.interop import modern as interop
from tests import helpers
from tests.test_attention import _random_qkv, _segment_ids, _softmax_attention


def _band(length, window):
    rows = np.arange(length)
    return np.abs(rows[:, None] - rows[None, :]) <= window


def test_sliding_window_attention_is_softmax_attention_inside_the_band_on_every_backend():
    """reference, xla and the Pallas splash kernel (its LocalMask, in the Pallas interpreter), under a padding mask
    and packed rows, against float64 softmax attention over |query - key| <= window."""
    length, window = 128, 9
    query, key, value = _random_qkv(2, length, heads=2, head_dim=16, seed=5)
    padding = np.arange(length)[None, :] < np.array([[100], [128]])
    ids = _segment_ids(length, [[(0, 40), (40, 90), (90, 120)], [(0, 64), (64, 128)]])
    band = _band(length, window)[None]
    cases = ((jnp.asarray(padding), np.broadcast_to(padding[:, None, :], (2, length, length)) & band, padding),
             (attention.SegmentMask(jnp.asarray(ids)), (ids[:, :, None] == ids[:, None, :]) & band, ids > 0))
    splash = attention._splash_attention  # pylint: disable=protected-access
    for mask, allowed, real in cases:
        with np.errstate(invalid="ignore"):  # padding queries whose window holds only padding: never compared
            expected = _softmax_attention(query, key, value, allowed)
        unbanded = _softmax_attention(query, key, value, allowed | ~band)
        assert np.abs(unbanded - expected)[real].max() > 0.1  # the window changes the result
        for implementation in ("reference", "xla"):
            context = attention.dot_product_attention(implementation, query, key, value, mask, window=window)
            np.testing.assert_allclose(np.asarray(context)[real], expected[real], atol=2e-6, err_msg=implementation)
        context = splash(query, key, value, mask, interpret=True, window=window)
        np.testing.assert_allclose(np.asarray(context)[real], expected[real], atol=2e-5, err_msg="pallas")
    with pytest.raises(ValueError, match="window=-1: must be 0 or more"):
        attention.dot_product_attention("reference", query, key, value, jnp.asarray(padding), window=-1)


# A small ModernBERT: 4 layers (0 and 3 global, 1 and 2 local with a window of 8, i.e. 4 rows each side), so that
# sequences of 24 reach past the window.
SMALL = dict(vocab_size=300, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=96,
             max_position_embeddings=64, local_attention=8, global_attn_every_n_layers=3, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


@pytest.fixture(scope="module")
def small_modernbert():
    """A random ModernBertForMaskedLM, its norms and decoder bias moved off their initial 1 and 0."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return _random_modernbert(torch, transformers.ModernBertForMaskedLM, transformers.ModernBertConfig(**SMALL))


def _random_modernbert(torch, model_class, config):
    """`model_class(config)` from seed 0, its norms and biases moved off their initial 1 and 0."""
    torch.manual_seed(0)
    theirs = model_class(config).eval()
    with torch.no_grad():
        for name, parameter in theirs.named_parameters():
            if "norm" in name or "bias" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    return theirs


def test_mlm_logits_equal_transformers_with_padding_and_sequences_longer_than_the_window(small_modernbert):
    import torch  # pylint: disable=import-outside-toplevel
    theirs = small_modernbert
    config = interop.config_from_transformers(theirs.config.to_dict())
    assert (config.num_layers, config.local_attention, config.window(0), config.window(1), config.window(3)) == (
        4, 8, None, 4, None)
    state = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    params = interop.params_from_transformers(state, config)

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 300, (3, 24))
    mask = np.ones((3, 24), np.int64)
    mask[1, 17:] = mask[2, 5:] = 0  # padded rows; row 2 shorter than the window
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    model = modern.ModernForMaskedLM(config)
    logits = np.asarray(model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))["mlm_logits"])
    real = mask.astype(bool)
    scale = np.abs(expected[real]).max()
    # Measured 3e-7 of the scale (float32 on both sides).
    assert np.abs(logits - expected)[real].max() <= 1e-5 * scale

    # At masked positions only (the pretraining head): those rows of the full logits.
    positions = np.array([[0, 23, 5], [16, 2, 2], [4, 0, 1]])
    at_positions = model.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask),
                               masked_lm_positions=jnp.asarray(positions))["mlm_logits"]
    np.testing.assert_allclose(at_positions, np.take_along_axis(logits, positions[..., None], axis=1), atol=1e-5)

    # Every layer global instead: no longer transformers' logits (the window is really applied).
    unwindowed = modern.ModernForMaskedLM(modern.modern_config(**{**config.__dict__, "global_attn_every_n_layers": 1}))
    global_logits = np.asarray(unwindowed.apply({"params": params}, jnp.asarray(ids), jnp.asarray(mask))["mlm_logits"])
    assert np.abs(global_logits - expected)[real].max() > 1e-3 * scale

    # And back: transformers' tensors exactly, the tied decoder included.
    tensors = interop.params_to_transformers(params, config)
    assert sorted(tensors) == sorted(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(tensors[name], tensor, err_msg=name)


@pytest.mark.parametrize("task,pooling", [("sequence", "cls"), ("sequence", "mean"), ("tokens", "cls"), ("qa", "cls")])
def test_task_heads_read_from_a_transformers_directory_give_its_logits_and_export_back_exactly(task, pooling,
                                                                                               tmp_path):
    """A random ModernBertFor{SequenceClassification (both poolings), TokenClassification, QuestionAnswering} saved
    by transformers: --config.init's reader takes its encoder and head (its classifier left to the task), the task's
    model with that classifier gives transformers' logits under padding past the window, and export_hf_task writes
    the directory back: the Auto class loads it as that class with transformers' tensors exactly."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax import tasks  # pylint: disable=import-outside-toplevel
    from bert_jax.interop import pretrained  # pylint: disable=import-outside-toplevel
    names = {"sequence": ["a", "b", "c"], "tokens": ["O", "B-X", "I-X", "B-Y", "I-Y"], "qa": []}[task]
    auto = {"sequence": "AutoModelForSequenceClassification", "tokens": "AutoModelForTokenClassification",
            "qa": "AutoModelForQuestionAnswering"}[task]
    model_class = getattr(transformers, interop.TASK_CLASSES[task])
    theirs = _random_modernbert(torch, model_class, transformers.ModernBertConfig(
        **SMALL, num_labels=len(names) or 2, classifier_pooling=pooling))
    saved = tmp_path / "theirs"
    theirs.save_pretrained(saved)
    vocab = _small_vocab(saved / "vocab.txt", 300)
    config, params, report = pretrained.load_pretrained(str(saved))
    assert config.classifier_pooling == pooling and report.vocab_file == vocab
    assert report.initialized == ["decoder.bias"] and report.ignored == ["classifier.bias", "classifier.weight"]
    state = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    ours = {name: value for name, value in params.items() if modern.is_pretrained_parameter(name)}
    ours["classifier"] = {"kernel": state["classifier.weight"].T, "bias": state["classifier.bias"]}

    rng = np.random.default_rng(0)
    ids = rng.integers(5, 300, (3, 24))
    mask = np.ones((3, 24), np.int64)
    mask[1, 17:] = mask[2, 5:] = 0  # padded rows; row 2 shorter than the window
    with torch.no_grad():
        output = theirs(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
    expected = (np.stack([output.start_logits.numpy(), output.end_logits.numpy()], -1) if task == "qa"
                else output.logits.numpy())
    logits = np.asarray(tasks.head_model(task, config, len(names)).apply(
        {"params": ours}, jnp.asarray(ids), jnp.asarray(mask))["logits"])
    if task == "qa":
        logits = np.swapaxes(logits, 1, 2)  # ours: [batch, 2, length]
    if task != "sequence":  # per row: the real rows only
        logits, expected = logits[mask.astype(bool)], expected[mask.astype(bool)]
    # Measured 2.8e-7 to 4.1e-7 of the scale (float32 on both sides).
    assert np.abs(logits - expected).max() <= 1e-5 * np.abs(expected).max()

    exported = interop.export_hf_task(ours, config, str(tmp_path / "export"), task, names, vocab)
    loaded = getattr(transformers, auto).from_pretrained(exported, local_files_only=True)
    assert type(loaded) is model_class and loaded.config.classifier_pooling == pooling
    assert list(loaded.config.id2label.values()) == (names or ["LABEL_0", "LABEL_1"])
    loaded_state = loaded.state_dict()
    assert sorted(loaded_state) == sorted(state)
    for name, tensor in state.items():
        np.testing.assert_array_equal(loaded_state[name].numpy(), tensor, err_msg=name)


def test_our_parameters_have_transformers_shapes_and_unsupported_configs_are_named():
    config = modern.modern_config(vocab_size=300, hidden_size=64, num_layers=4, num_heads=4, intermediate_size=96,
                                  local_attention=8)
    ids = jnp.zeros((1, 8), jnp.int32)
    params = helpers.random_params(modern.ModernForMaskedLM(config), ids, ids)
    tensors = interop.params_to_transformers(params, config)
    assert tensors["model.layers.1.attn.Wqkv.weight"].shape == (192, 64)
    assert tensors["model.layers.1.mlp.Wi.weight"].shape == (192, 64)
    assert "model.layers.0.attn_norm.weight" not in tensors  # layer 0 reads the normalised embeddings
    assert interop.config_from_transformers(interop.transformers_config(config)) == config
    with pytest.raises(ValueError, match="config.json: norm_bias=True is not supported"):
        interop.config_from_transformers({**interop.transformers_config(config), "norm_bias": True})
    with pytest.raises(ValueError, match="local_attention=7: must be even"):
        modern.modern_config(local_attention=7)
    with pytest.raises(ValueError, match="num_heads=3: must divide hidden_size=64"):
        modern.modern_config(hidden_size=64, num_heads=3)


def test_remat_and_bfloat16_keep_the_modern_encoders_loss_and_gradients():
    """remat recomputes each layer's forward with the same dropout masks: loss and gradients as without it; bfloat16
    compute (float32 parameters) stays near float32's loss."""
    from tests.test_sharding import _assert_trees_close  # pylint: disable=import-outside-toplevel
    base = modern.modern_config(vocab_size=300, hidden_size=64, num_layers=2, num_heads=4, intermediate_size=96,
                                local_attention=8, dropout_rate=0.1, attention_dropout_rate=0.1,
                                attention="reference")
    rng = np.random.default_rng(1)
    ids = jnp.asarray(rng.integers(5, 300, (2, 24)))
    mask = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [15]]))
    positions, labels = jnp.asarray([[1, 7, 20], [0, 3, 14]]), jnp.asarray(rng.integers(5, 300, (2, 3)))
    params = helpers.random_params(modern.ModernForMaskedLM(base), ids, mask)

    def loss_of(config):
        def loss_fn(p):
            logits = modern.ModernForMaskedLM(config).apply(
                {"params": p}, ids, mask, masked_lm_positions=positions, deterministic=False,
                rngs={"dropout": jax.random.key(2)})["mlm_logits"]
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1))
        return loss_fn

    loss, grads = jax.jit(jax.value_and_grad(loss_of(base)))(params)
    # "full", the policy that recomputes the most (test_layers.py covers the policies themselves on BERT).
    remat_loss, remat_grads = jax.jit(jax.value_and_grad(loss_of(dataclasses.replace(base, remat="full"))))(params)
    np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
    _assert_trees_close(remat_grads, grads, 1e-6, "gradients under remat=full")
    # bfloat16: only its loss's value is compared, so only the forward pass compiles; its gradients' dtypes are
    # those of the traced program (jax.eval_shape).
    bf16_loss_fn = loss_of(dataclasses.replace(base, dtype="bfloat16"))
    bf16_loss, bf16_grads = jax.jit(bf16_loss_fn)(params), jax.eval_shape(jax.grad(bf16_loss_fn), params)
    assert jax.tree.leaves(bf16_grads)[0].dtype == jnp.float32  # the parameters (and their gradients) stay float32
    np.testing.assert_allclose(bf16_loss, loss, rtol=2e-2)


def test_scanned_layers_equal_unrolled_ones_and_export_alike():
    """scan_layers: layer 0, one nn.scan over groups of global_attn_every_n_layers (local, local, global), and the
    remaining layer unrolled (5 layers: 0 | 1 2 3 | 4): the unrolled weights stacked give the same loss and
    gradients, the stacked layout is the model's own (leading "layers" axis), and transformers' tensors are the same."""
    from tests.test_sharding import _assert_trees_close  # pylint: disable=import-outside-toplevel
    unrolled = modern.modern_config(vocab_size=300, hidden_size=64, num_layers=5, num_heads=4, intermediate_size=96,
                                    local_attention=8, attention="reference")
    scanned = dataclasses.replace(unrolled, scan_layers=True)
    assert scanned.scanned_groups == 1 and sorted(modern.scanned_layer_names(scanned)) == [1, 2, 3]
    rng = np.random.default_rng(2)
    ids = jnp.asarray(rng.integers(5, 300, (2, 24)))
    mask = jnp.asarray(np.arange(24)[None, :] < np.array([[24], [11]]))
    params = helpers.random_params(modern.ModernForMaskedLM(unrolled), ids, mask)
    stacked = modern.stack_layers(params, scanned)
    boxed = jax.eval_shape(lambda: modern.ModernForMaskedLM(scanned).init(jax.random.key(0), ids, mask))["params"]
    assert sorted(boxed) == sorted(stacked) == ["embeddings", "embeddings_norm", "final_norm", "layer_0", "layer_4",
                                                "layers", "mlm_layer_norm", "mlm_output_bias", "mlm_transform"]
    assert boxed["layers"]["member_2"]["attention"]["query"]["kernel"].names == ("layers", "embed", "heads")
    assert jax.tree.map(lambda leaf: leaf.shape, nn.meta.unbox(boxed)) == jax.tree.map(lambda leaf: leaf.shape,
                                                                                        stacked)
    _assert_trees_close(modern.unstack_layers(stacked, scanned), params, 0, "unstacked parameters")

    def loss_and_grads(config, p):
        def loss_fn(p):
            logits = modern.ModernForMaskedLM(config).apply({"params": p}, ids, mask)["mlm_logits"]
            return jnp.mean(jax.nn.logsumexp(logits, -1) * mask)
        return jax.jit(jax.value_and_grad(loss_fn))(p)

    loss, grads = loss_and_grads(unrolled, params)
    scanned_loss, scanned_grads = loss_and_grads(scanned, stacked)
    np.testing.assert_allclose(scanned_loss, loss, rtol=1e-6)
    _assert_trees_close(modern.unstack_layers(scanned_grads, scanned), grads, 1e-5, "scanned gradients")
    tensors, scanned_tensors = (interop.params_to_transformers(params, unrolled),
                                interop.params_to_transformers(stacked, scanned))
    assert sorted(scanned_tensors) == sorted(tensors)
    for name, tensor in tensors.items():
        np.testing.assert_array_equal(scanned_tensors[name], tensor, err_msg=name)


def test_modern_pretraining_steps_shard_like_one_device_and_the_masked_lm_loss_falls():
    """The shared train step (masked LM only: no NSP terms) over a 2x2x2 mesh (FSDP and tensor parallelism, BERT's
    mesh rules) gives one device's losses and parameters; on a repeated batch the loss falls."""
    import jax  # pylint: disable=import-outside-toplevel,reimported
    from tests import helpers  # pylint: disable=import-outside-toplevel
    from tests.test_sharding import _assert_trees_close  # pylint: disable=import-outside-toplevel
    steps = 6
    expected, expected_state, _ = helpers.train_steps(helpers.tiny_modern_config((1, 1, 1)), jax.devices()[:1], steps)
    got, state, _ = helpers.train_steps(helpers.tiny_modern_config((2, 2, 2)), jax.devices(), steps)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert expected[-1] < 0.8 * expected[0], expected  # measured 6.33 -> 4.88
    _assert_trees_close(jax.device_get(state.params), expected_state.params, 1e-5, f"parameter after {steps} steps")
    # The tensor-parallel axis splits the new kernels too: the GeGLU's gate as the MLP's input, over "mlp".
    gate = state.params["layer_0"]["mlp_gate"]["kernel"]
    assert gate.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), gate.sharding


def test_the_recipe_and_its_refusals_name_the_flag():
    from bert_jax import job_config  # pylint: disable=import-outside-toplevel
    from configs import pretrain  # pylint: disable=import-outside-toplevel
    config = pretrain.get_config("size=base,data=synthetic,arch=modern")
    assert modern.ModernConfig.from_config(config.model) == modern.ModernConfig()  # ModernBERT-base's shapes
    assert (config.data.masked_lm_prob, config.data.max_predictions_per_seq) == (0.3, 40)
    assert not hasattr(pretrain.get_config("size=base").model, "arch")  # BERT's config is as it was
    job_config.validate(config, "train", 8)
    job_config.validate(config, "export", 8)
    config.model.arch = "modren"
    with pytest.raises(ValueError, match=r"--config.model.arch='modren': choose 'bert' or 'modern'"):
        job_config.validate(config, "train", 8)
    config.model.arch, config.model.scan_layers = "modern", True
    job_config.validate(config, "train", 8)
    config.model.classifier_pooling = "max"
    with pytest.raises(ValueError, match="--config.model.classifier_pooling='max': choose 'cls' or 'mean'"):
        job_config.validate(config, "train", 8)
    with pytest.raises(ValueError, match="unknown arch 'gpt'"):
        pretrain.get_config("arch=gpt")


def test_warmup_stable_decay_holds_the_peak_then_cools_down_as_one_minus_sqrt():
    from bert_jax import optim  # pylint: disable=import-outside-toplevel
    from configs import pretrain  # pylint: disable=import-outside-toplevel
    config = pretrain.get_config("size=tiny,data=synthetic,arch=modern").optim
    assert config.decay == "wsd"
    config.learning_rate, config.warmup_steps, config.decay_fraction, config.end_learning_rate = 1e-3, 10, 0.2, 1e-4
    optim.validate(config, 100)
    schedule = optim.learning_rate_schedule(config, 100)
    rates = np.array([float(schedule(step)) for step in range(101)])
    np.testing.assert_allclose(rates[:11], np.linspace(0, 1e-3, 11), rtol=1e-6, atol=1e-12)  # warmup
    np.testing.assert_allclose(rates[10:81], 1e-3, rtol=1e-6)  # stable until the last 20 steps
    expected = 1e-4 + (1e-3 - 1e-4) * (1 - np.sqrt(np.arange(21) / 20))
    np.testing.assert_allclose(rates[80:], expected, rtol=1e-5)  # 1 - sqrt(t) down to end_learning_rate
    config.decay_fraction = 0.95
    with pytest.raises(ValueError, match="warmup_steps=10 and --config.optim.decay_fraction=0.95 overlap"):
        optim.validate(config, 100)
    config.decay_fraction = 0.0
    with pytest.raises(ValueError, match=r"--config.optim.decay_fraction=0.0: must be in \(0, 1\]"):
        optim.validate(config, 100)


def _small_vocab(path, size):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "dog", "."]
    words += [f"w{index}" for index in range(size - len(words))]
    path.write_text("".join(word + "\n" for word in words))
    return str(path)


def test_a_modern_run_exports_a_directory_transformers_loads_as_modernbert(tmp_path):
    """Pretrain the tiny modern encoder a few steps (synthetic data, a 500-word vocabulary in a 512-row model), then
    --mode=export's function: AutoModelForMaskedLM loads ModernBertForMaskedLM with our logits (the vocabulary's
    padding rows dropped), the task Auto classes load it with their heads fresh, and AutoTokenizer (tokenizer.json)
    gives our ids."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax import job_config, pretraining  # pylint: disable=import-outside-toplevel
    from bert_jax.data import tokenization  # pylint: disable=import-outside-toplevel
    from bert_jax.interop import export  # pylint: disable=import-outside-toplevel
    from tests import helpers  # pylint: disable=import-outside-toplevel
    config = helpers.tiny_modern_config((2, 2, 2), num_steps=3)
    config.data.vocab_file = _small_vocab(tmp_path / "vocab.txt", 500)
    workdir = str(tmp_path / "run")
    helpers.run_pretraining(config, workdir)
    exported = pretraining.export_checkpoint(job_config.prepare(config, workdir, "export"), workdir)
    # --config.init: the run's checkpoints and the export continue pretraining with their architecture (the
    # export's 500 rows padded to 512 again); BERT's recipe refuses them, naming the option.
    for init, vocab in ((os.path.join(workdir, "checkpoints"), ""), (exported, os.path.join(exported, "vocab.txt"))):
        again = helpers.tiny_modern_config((2, 2, 2), num_steps=3)
        again.init, again.data.vocab_file = init, ""
        resolved = job_config.prepare(again, str(tmp_path / "again"), "train")
        assert modern.ModernConfig.from_config(resolved.model) == modern.ModernConfig.from_config(config.model)
        assert resolved.data.vocab_file == vocab  # the export's tokenizer (the run's data named none)
        again.model.hidden_size = 64
        with pytest.raises(ValueError, match="has hidden_size=128 but --config.model.hidden_size=64"):
            job_config.prepare(again, str(tmp_path / "again"), "train")
        bert = helpers.tiny_config((2, 2, 2))
        bert.init = init
        with pytest.raises(ValueError, match="is a checkpoint of arch='modern' but the recipe trains arch=bert. Fix: "
                                             "configs/pretrain.py:arch=modern"):
            job_config.prepare(bert, str(tmp_path / "bert"), "train")
    assert sorted(os.listdir(exported)) == ["config.json", "model.safetensors", "special_tokens_map.json",
                                            "tokenizer.json", "tokenizer_config.json", "vocab.txt"]

    theirs = transformers.AutoModelForMaskedLM.from_pretrained(exported, local_files_only=True).eval()
    assert type(theirs).__name__ == "ModernBertForMaskedLM" and theirs.config.vocab_size == 500
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    texts = ["The cats sat on the mat.", "the dog"]
    ours = tokenization.load_tokenizer(config.data.vocab_file)
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    assert inputs["input_ids"][0].tolist() == [ours.cls_id, *ours.encode_batch([texts[0]])[0], ours.sep_id]
    with torch.no_grad():
        expected = theirs(**inputs).logits.numpy()

    model_config = modern.ModernConfig.from_config(config.model)
    params = export.restore_model_params(os.path.join(workdir, "checkpoints"), modern.ModernForMaskedLM(model_config),
                                         *layout.dummy_inputs())
    # Jitted: one program instead of a compile per operation of the model run eagerly.
    logits = np.asarray(jax.jit(modern.ModernForMaskedLM(model_config).apply)(
        {"params": params}, jnp.asarray(inputs["input_ids"].numpy()),
        jnp.asarray(inputs["attention_mask"].numpy()))["mlm_logits"])[..., :500]
    real = inputs["attention_mask"].numpy().astype(bool)
    assert np.abs(logits - expected)[real].max() <= 1e-5 * np.abs(expected[real]).max()
    for auto in ("AutoModelForSequenceClassification", "AutoModelForTokenClassification",
                 "AutoModelForQuestionAnswering"):
        loaded = getattr(transformers, auto).from_pretrained(exported, local_files_only=True)
        assert type(loaded).__name__.startswith("ModernBertFor"), auto
        np.testing.assert_array_equal(loaded.model.embeddings.tok_embeddings.weight.detach().numpy(),
                                      theirs.model.embeddings.tok_embeddings.weight.detach().numpy())
