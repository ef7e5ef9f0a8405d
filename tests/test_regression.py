"""The regression task (STS-B's): one output trained with the squared error learns a score, and exports to what
transformers loads as *ForSequenceClassification with num_labels=1 and problem_type="regression", logits equal."""

import csv
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bert_jax import arch
from bert_jax import finetune
from bert_jax import modern
from bert_jax import tasks
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from bert_jax.interop import export
from bert_jax.interop import init_architecture
from bert_jax.tasks import regression
from configs import finetune as finetune_configs
from tests import helpers
from tests.test_modern import SMALL, _random_modernbert, _small_vocab

FILLER = "the a cat dog sat on mat film plot was is and but this that with".split()


def _pairs(count, seed):
    """Sentence pairs scored 0 to 5 by how many times the word "same" appears in them (0 to 4 times), as STS-B's
    scores run from 0 (unrelated) to 5 (equivalent)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        texts = []
        marks = rng.integers(0, 3, size=2)
        for mark in marks:
            words = list(rng.choice(FILLER, size=int(rng.integers(3, 7))))
            for _ in range(mark):
                words.insert(int(rng.integers(len(words) + 1)), "same")
            texts.append(" ".join(words))
        rows.append((*texts, f"{1.25 * marks.sum():.2f}"))
    return rows


def _write(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(("sentence1", "sentence2", "score"))
        writer.writerows(rows)
    return str(path)


def test_the_regression_head_learns_a_score_and_exports_to_transformers_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    train, dev = _pairs(320, 0), _pairs(96, 1)
    vocab = vocabulary.train_wordpiece([text for row in train + dev for text in row[:2]], vocab_size=60,
                                       output_dir=str(tmp_path / "vocab"), min_frequency=1)
    config = finetune_configs.get_config("task=regression")
    config.model.vocab_size = tokenization.padded_vocab_size(vocab.vocab_size)
    config.model.max_position_embeddings = 32
    config.model.dropout_rate = config.model.attention_dropout_rate = 0.0
    config.data.train_file, config.data.eval_file = _write(tmp_path / "train.csv", train), _write(
        tmp_path / "dev.csv", dev)
    config.data.text_columns, config.data.label_column = "sentence1,sentence2", "score"
    config.data.vocab_file, config.data.max_seq_length = str(tmp_path / "vocab"), 24
    config.train.batch_size, config.train.num_steps, config.train.log_every = 32, 150, 50
    config.optim.learning_rate = 1e-3
    workdir = str(tmp_path / "work")
    final = helpers.run_finetune(config, workdir)
    assert final["step"] == 150 and "eval_accuracy" not in final, final
    # Held out: the predicted scores rank and track the gold ones (chance: 0); the squared error falls well below the
    # gold scores' variance (what predicting their mean gives).
    gold = np.asarray([float(row[2]) for row in dev])
    assert final["eval_spearman"] >= 0.9 and final["eval_pearson"] >= 0.9, final
    assert final["eval_mse"] <= 0.25 * gold.var(), (final, gold.var())
    lines = helpers.metrics_by_step(workdir)
    assert lines[150]["loss"] < 0.2 * lines[50]["loss"], lines

    # The export: a BertForSequenceClassification of one output for regression, giving our logits.
    exported = finetune.export_finetuned(workdir)
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(exported, local_files_only=True).eval()
    assert type(loaded).__name__ == "BertForSequenceClassification"
    assert (loaded.config.num_labels, loaded.config.problem_type) == (1, "regression")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(exported, local_files_only=True)
    inputs = hf_tokenizer([row[0] for row in dev[:6]], [row[1] for row in dev[:6]], padding=True,
                          return_tensors="pt")
    with torch.no_grad():
        expected = loaded(**inputs).logits.numpy()
    saved = os.path.join(workdir, finetune.FINETUNED_SUBDIR)
    model = tasks.head_model("regression", init_architecture.recorded_config(
        os.path.join(saved, init_architecture.RUN_MODEL_CONFIG)), 1)
    params = export.restore_model_params(saved, model, *[np.zeros((1, 8), np.int32)] * 3)
    logits = np.asarray(jax.jit(model.apply)({"params": params}, inputs["input_ids"].numpy(),
                                             inputs["attention_mask"].numpy(), inputs["token_type_ids"].numpy())[
                                                 "logits"])
    assert logits.shape == (6, 1)
    np.testing.assert_allclose(logits, expected, atol=1e-5 * np.abs(expected).max())


def test_a_modern_regression_head_exports_to_transformers_regression_class(tmp_path):
    """The modern encoder's regression model (the sequence classifier of one output) as transformers saves it: read,
    run to transformers' logits, and written back as a ModernBertForSequenceClassification for regression."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from bert_jax.interop import pretrained  # pylint: disable=import-outside-toplevel
    theirs = _random_modernbert(torch, transformers.ModernBertForSequenceClassification, transformers.ModernBertConfig(
        **SMALL, num_labels=1, problem_type="regression"))
    saved = tmp_path / "theirs"
    theirs.save_pretrained(saved)
    vocab = _small_vocab(saved / "vocab.txt", 300)
    config, params, _ = pretrained.load_pretrained(str(saved))
    state = {name: tensor.numpy() for name, tensor in theirs.state_dict().items()}
    ours = {name: value for name, value in params.items() if modern.is_pretrained_parameter(name)}
    ours["classifier"] = {"kernel": state["classifier.weight"].T, "bias": state["classifier.bias"]}
    rng = np.random.default_rng(0)
    ids, mask = rng.integers(5, 300, (3, 20)), np.ones((3, 20), np.int64)
    mask[1, 12:] = 0
    with torch.no_grad():
        expected = theirs(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    logits = np.asarray(tasks.head_model("regression", config, 1).apply(
        {"params": ours}, jnp.asarray(ids), jnp.asarray(mask))["logits"])
    assert logits.shape == expected.shape == (3, 1)
    assert np.abs(logits - expected).max() <= 1e-5 * np.abs(expected).max()

    exported = arch.of(config).export(ours, config, str(tmp_path / "export"), tokenizer=vocab, task="regression",
                                      label_names=[regression.SCORE])
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(exported, local_files_only=True).eval()
    assert type(loaded).__name__ == "ModernBertForSequenceClassification"
    assert (loaded.config.num_labels, loaded.config.problem_type) == (1, "regression")
    loaded_state = loaded.state_dict()
    assert sorted(loaded_state) == sorted(state)
    for name, tensor in state.items():  # transformers' tensors exactly
        np.testing.assert_array_equal(loaded_state[name].numpy(), tensor, err_msg=name)


def test_correlations_are_scipys_and_a_constant_side_scores_zero():
    predicted, gold = np.asarray([0.5, 1.0, 3.0, 2.0]), np.asarray([1.0, 2.0, 4.0, 2.5])
    scores = regression.correlations(predicted, gold)
    assert scores["eval_pearson"] == pytest.approx(stats.pearsonr(predicted, gold)[0], abs=1e-12)
    assert scores["eval_spearman"] == pytest.approx(1.0)  # the same order
    assert scores["eval_mse"] == pytest.approx((0.25 + 1.0 + 1.0 + 0.25) / 4)
    constant = regression.correlations(np.full(4, 2.0), gold)
    assert (constant["eval_pearson"], constant["eval_spearman"]) == (0.0, 0.0)
