"""Extractive question answering through the driver: the task=qa example of docs/finetuning.md (and the README)
learns the shipped QA task, writes the official predictions.json, and exports a model transformers'
AutoModelForQuestionAnswering loads."""

import json

import jax
import numpy as np
import pytest

from bert_jax import finetune
from bert_jax import job_config
from bert_jax import sharding as sharding_lib
from bert_jax import tasks
from bert_jax import model as model_lib
from bert_jax.data import squad
from bert_jax.interop import export
from bert_jax.interop import flax_files
from bert_jax.interop import init_architecture
from configs import finetune as finetune_configs
from tests import helpers
from tests.test_finetune import _documented_command, driver, vocab_of_pieces  # noqa: F401  (the driver fixture)

QA_TASK = f"{helpers.ROOT}/tests/fixtures/qa_task"
EXPORT_PAIRS = [("What will the function read return?", "The function read will return the list. The module json "
                 "will define the class decoder.")]


@pytest.mark.slow  # about 400 steps (0.09 CPU-seconds each at 128 vocabulary rows, 0.68 at 30522) and an export
@pytest.mark.xla_optimized  # it runs four times longer than it compiles
@pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")
def test_question_answering_learns_the_qa_task_through_the_driver(tmp_path, monkeypatch, driver):
    """docs/finetuning.md's task=qa command as written (the README's too), with the recipe's defaults (tiny, from
    scratch, the original uncased vocabulary's pieces of the task): exact match and F1 on the 160 held-out questions
    >= 0.8, predictions.json in the official format holding them, and the export's start and end logits in
    transformers equal to ours."""
    workdir = tmp_path / "qa"
    command = _documented_command("finetune", "configs/finetune.py:task=qa")
    assert command[:3] == ["python", "-m", "bert_jax.main"]
    assert not [arg for arg in command if arg.startswith(("--config.optim", "--config.train"))]
    monkeypatch.chdir(helpers.ROOT)  # the command names configs/ and tests/fixtures/ from the repository root
    vocab = "--config.data.vocab_file=tests/fixtures/google_bert/vocab_uncased.txt"
    assert vocab in command
    # The recipe's optimizer and steps as documented, over the uncased vocabulary's pieces that the task uses (the
    # same tokens): 128 embedding rows instead of 30522 make each of its ~400 steps several times cheaper.
    pieces, rows = vocab_of_pieces(_qa_texts() + [text for pair in EXPORT_PAIRS for text in pair], str(tmp_path))
    driver([arg.replace("/tmp/bert_jax_qa", str(workdir)) for arg in command[3:] if arg != vocab] +
           [f"--config.data.vocab_file={pieces}", f"--config.model.vocab_size={rows}"])
    final = json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["eval_exact_match"] >= 0.8 and final["eval_f1"] >= 0.8, final
    predictions = json.loads((workdir / tasks.qa.PREDICTIONS_FILE).read_text())
    examples = squad.read_squad(f"{QA_TASK}/dev.json", training=False)
    assert sorted(predictions) == sorted(example.qas_id for example in examples)
    assert all(isinstance(text, str) for text in predictions.values())
    assert squad.evaluate(examples, predictions)["exact_match"] == pytest.approx(final["eval_exact_match"])
    nbest = json.loads((workdir / "nbest_predictions.json").read_text())
    assert all(nbest[qas_id][0]["text"] == text for qas_id, text in predictions.items())

    _assert_the_export_loads_in_transformers(driver, workdir, EXPORT_PAIRS)


def _qa_texts():
    """Every passage and question of the shipped QA task."""
    texts = []
    for name in ("train.json", "dev.json"):
        for article in json.loads(open(f"{QA_TASK}/{name}", encoding="utf-8").read())["data"]:
            for paragraph in article["paragraphs"]:
                texts += [paragraph["context"], *(qa["question"] for qa in paragraph["qas"])]
    return texts


def _assert_the_export_loads_in_transformers(driver, workdir, pairs):
    import torch  # pylint: disable=import-outside-toplevel
    import transformers  # pylint: disable=import-outside-toplevel
    driver(["--mode=export", "--config=configs/finetune.py:task=qa", f"--workdir={workdir}"])
    exported, saved = workdir / "export" / "hf", workdir / finetune.FINETUNED_SUBDIR
    theirs = transformers.AutoModelForQuestionAnswering.from_pretrained(str(exported), local_files_only=True).eval()
    assert type(theirs).__name__ == "BertForQuestionAnswering"
    inputs = transformers.AutoTokenizer.from_pretrained(str(exported), local_files_only=True)(
        [question for question, _ in pairs], [context for _, context in pairs], padding=True, return_tensors="pt")
    with torch.no_grad():
        output = theirs(**inputs)
    model = model_lib.BertForQuestionAnswering(flax_files.config_from_ours(str(saved /
                                                                            init_architecture.RUN_MODEL_CONFIG)))
    ids, mask = inputs["input_ids"].numpy(), inputs["attention_mask"].numpy()
    params = export.restore_model_params(str(saved), model, ids, ids, ids)
    ours = jax.jit(model.apply)({"params": params}, ids, mask, inputs["token_type_ids"].numpy())
    real = mask == 1
    for name in ("start_logits", "end_logits"):
        expected = getattr(output, name).numpy()
        np.testing.assert_allclose(np.asarray(ours[name])[real], expected[real], atol=1e-4 * np.abs(expected).max())


def _qa_config(tmp_path, train, dev=None, vocab=None):
    """Two steps of 16 rows of 64 pieces; `vocab`: (a vocabulary, its row count), else the whole uncased one. The
    jobs run below with squad_pieces' vocabulary compile the same train step (the compilation cache serves all but
    the first)."""
    config = finetune_configs.get_config("task=qa")
    config.data.vocab_file, config.data.max_seq_length = f"{helpers.FIXTURES}/vocab_uncased.txt", 64
    if vocab:
        config.data.vocab_file, config.model.vocab_size = vocab
    config.data.max_query_length = 16
    config.data.train_file = str(train)
    config.data.eval_file = str(dev) if dev else ""
    config.train.num_steps, config.train.batch_size = 2, 16
    return config


@pytest.fixture(scope="module")
def squad_pieces(tmp_path_factory):
    """The uncased vocabulary's pieces of the generated SQuAD data the jobs below train and score on (the same
    tokens; test_finetune.vocab_of_pieces): 128 embedding rows instead of 30522 make a step and a checkpoint cheap."""
    from tests.test_squad import squad_examples, squad_v2_examples  # pylint: disable=import-outside-toplevel
    texts = [text for data in (squad_examples(32, 0), squad_v2_examples(48, 0), squad_v2_examples(30, 1))
             for paragraph in data["data"][0]["paragraphs"]
             for text in (paragraph["context"], *(qa["question"] for qa in paragraph["qas"]))]
    return vocab_of_pieces(texts, str(tmp_path_factory.mktemp("squad_pieces")))


def _squad_file(path, context, answer, answer_start, version="1.1", impossible=False):
    qa = {"id": "q1", "question": "what is it?", "answers": [] if impossible else
          [{"text": answer, "answer_start": answer_start}]}
    if impossible:
        qa["is_impossible"] = True
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [qa]}]}]}))
    return path


def test_question_answering_input_errors_name_the_file_and_the_fix(tmp_path):
    good = _squad_file(tmp_path / "good.json", "the value is a list of names", "list", 15)
    bad = _squad_file(tmp_path / "bad.json", "the value is a list of names", "list", 12)
    with pytest.raises(ValueError, match=r"bad.json.*'list' is not at answer_start=12"):
        helpers.run_finetune(_qa_config(tmp_path, good, bad), str(tmp_path / "work"))
    v2 = _squad_file(tmp_path / "v2.json", "the value is a list of names", "", 0, version="v2.0", impossible=True)
    with pytest.raises(ValueError, match=r"--config.data.train_file=.*v2.json has 1 questions without an answer "
                                         r"\(SQuAD v2.0\)\. Fix: --config.data.version_2_with_negative=True"):
        helpers.run_finetune(_qa_config(tmp_path, v2), str(tmp_path / "work"))
    long_passage = _squad_file(tmp_path / "long.json", " ".join(["names"] * 200), "names", 0)
    config = _qa_config(tmp_path, long_passage)
    config.data.doc_stride = 60
    with pytest.raises(ValueError, match=r"--config.data.doc_stride=60 exceeds the \d+ passage pieces a window of "
                                         r"data.max_seq_length=64 holds"):
        helpers.run_finetune(config, str(tmp_path / "work"))
    config = _qa_config(tmp_path, good)
    config.data.max_query_length = 61
    with pytest.raises(ValueError, match=r"--config.data.max_query_length=61: leaves no room for the passage"):
        helpers.run_finetune(config, str(tmp_path / "work"))


@pytest.mark.parametrize("threshold, answered", [(-1e9, False), (1e9, True)])
def test_squad_v2_predicts_no_answer_by_the_null_threshold(tmp_path, threshold, answered, squad_pieces):
    """SQuAD v2.0 through the job: null_odds.json holds every held-out question; a threshold below any score gap
    answers "" everywhere (exact match = the share of unanswerable questions, 1 in 3), one above it never does."""
    from tests.test_squad import squad_v2_examples  # pylint: disable=import-outside-toplevel
    train, dev = tmp_path / "train.json", tmp_path / "dev.json"
    train.write_text(json.dumps(squad_v2_examples(48, 0)))
    dev.write_text(json.dumps(squad_v2_examples(30, 1)))
    config = _qa_config(tmp_path, train, dev, squad_pieces)
    config.data.version_2_with_negative, config.data.null_score_diff_threshold = True, threshold
    metrics = helpers.run_finetune(config, str(tmp_path / "work"))
    predictions = json.loads((tmp_path / "work" / tasks.qa.PREDICTIONS_FILE).read_text())
    null_odds = json.loads((tmp_path / "work" / "null_odds.json").read_text())
    assert sorted(predictions) == sorted(null_odds) and len(predictions) == 30
    assert all((text != "") == answered for text in predictions.values()), predictions
    if not answered:
        assert metrics["eval_exact_match"] == pytest.approx(10 / 30)


def test_a_question_answerer_initialises_a_sentence_classifier_with_a_fresh_pooler(tmp_path, squad_pieces):
    """--config.init of a fine-tuned directory without a pooler (question answering) reads its encoder exactly; the
    sentence classifier's pooler starts fresh instead of the run stopping."""
    from tests.test_squad import squad_examples  # pylint: disable=import-outside-toplevel
    train = tmp_path / "train.json"
    train.write_text(json.dumps(squad_examples(32, 0)))
    config = _qa_config(tmp_path, train, vocab=squad_pieces)
    helpers.run_finetune(config, str(tmp_path / "qa"))
    classifier = finetune_configs.get_config()
    classifier.init = str(tmp_path / "qa" / finetune.FINETUNED_SUBDIR)
    classifier.data.train_file = f"{helpers.ROOT}/tests/fixtures/keyword_task/train.csv"
    classifier.data.max_seq_length, classifier.train.num_steps = 32, 1
    prepared = job_config.prepare(classifier, str(tmp_path / "cls"), "finetune")
    source = finetune.model_source(prepared)
    model = model_lib.BertForSequenceClassification(source.model_config, 2)
    mesh = sharding_lib.create_mesh(prepared.mesh)
    with jax.set_mesh(mesh):
        params, _ = finetune.load_params(prepared, model, source, mesh, sharding_lib.logical_rules(prepared.mesh),
                                         jax.random.key(0))
    ids = np.zeros((1, 8), np.int32)
    saved = export.restore_model_params(str(tmp_path / "qa" / finetune.FINETUNED_SUBDIR),
                                        model_lib.BertForQuestionAnswering(source.model_config), ids, ids, ids)
    for name in ("embeddings", "layer_0", "layer_1"):
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(params[name]), jax.device_get(saved[name]))
    assert "pooler" in params
