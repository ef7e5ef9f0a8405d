"""bert_jax.job_config: the config a job runs, resolved, prepared and checked once, with errors naming the flag."""

import re

import pytest

from bert_jax import job_config
from bert_jax import model as model_lib
from configs import pretrain
from tests import helpers


def test_prepare_returns_a_locked_copy_and_leaves_the_given_config_alone(tmp_path):
    config = helpers.tiny_config((-1, 1, 1))
    before = config.to_dict()
    prepared = job_config.prepare(config, str(tmp_path), "train")
    assert prepared is not config and prepared.to_dict() == before == config.to_dict()
    with pytest.raises(AttributeError):
        prepared.new_field = 1  # locked: a misspelt field is an error, never a new field


def test_prepare_makes_the_corpus_data_and_points_only_the_copy_at_it(tmp_path):
    config = pretrain.get_config("size=tiny,data=corpus")
    config.data.corpus, config.data.tokenizer_vocab_size = f"{helpers.FIXTURES}/sample_text.txt", 300
    config.data.eval_every_nth_document = 0
    before = config.to_dict()
    prepared = job_config.prepare(config, str(tmp_path), "train")
    assert (tmp_path / "data" / "READY.json").exists()
    assert prepared.data.source == "tfrecord" and prepared.data.input_files and prepared.data.vocab_file
    assert prepared.model.vocab_size % 128 == 0 and prepared.model.vocab_size <= 384
    assert config.to_dict() == before  # the caller's config is as it was


@pytest.mark.parametrize("mode, recipe", [("finetune", "pretrain"), ("train", "finetune")])
def test_the_other_recipe_is_named(tmp_path, mode, recipe):
    from configs import finetune  # pylint: disable=import-outside-toplevel
    config = (pretrain if recipe == "pretrain" else finetune).get_config("size=tiny")
    with pytest.raises(ValueError, match=r"--mode=finetune/features take configs/finetune.py, the other modes "
                                         r"configs/pretrain.py"):
        job_config.prepare(config, str(tmp_path), mode)
    with pytest.raises(ValueError, match=r"mode='pretrain': choose one of"):
        job_config.prepare(config, str(tmp_path), "pretrain")


@pytest.mark.parametrize("field, value, message", [
    ("train.batch_size", 12, "must be a positive multiple of the 8 data-parallel devices"),
    ("optim.grad_accum_steps", 3, "must divide the per-device batch"),
    ("data.max_seq_length", 128, "exceeds model.max_position_embeddings=64"),
    ("data.max_predictions_per_seq", 0, "--config.data.max_predictions_per_seq=0"),
    ("data.source", "tfrecord", "needs --config.data.input_files"),
    ("optim.optimizer", "sgd", "--config.optim.optimizer='sgd'"),
    ("optim.warmup_steps", -1, "--config.optim.warmup_steps=-1"),
    ("optim.schedule_steps", -5, "--config.optim.schedule_steps=-5: must be >= 0"),
    ("mesh.tensor", 3, "--config.mesh"),
    # The divergence detector's and the rewinds' settings.
    ("train.spike_factor", 0.5, "must be above 1"),
    ("train.spike_window", 0, "must be at least 1"),
    ("checkpoint.skip_batches", 3, "needs --config.checkpoint.restore_step=STEP"),
    ("checkpoint.max_rewinds", -1, "--config.checkpoint.max_rewinds=-1: must be >= 0"),
])
def test_bad_config_is_refused_naming_the_field(field, value, message):
    config = helpers.tiny_config((8, 1, 1))
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        job_config.validate(config, "train", 8)


@pytest.mark.parametrize("field, value, message", [
    ("num_heads", 5, "must divide hidden_size"),
    ("hidden_act", "relu", "choose one of"),
    ("dtype", "float16", "choose one of"),
    ("dropout_rate", 1.5, "must be in"),
])
def test_bad_model_config_names_the_field(field, value, message):
    config = pretrain.get_config("size=tiny")
    config.model[field] = value
    with pytest.raises(ValueError, match=f"^--config.model.{field}.*{message}"):
        job_config.model_config(config.model)
    with pytest.raises(ValueError, match=f"^{field}=.*{message}"):  # the model alone names its own field
        model_lib.BertConfig.from_config(config.model)


def test_unknown_model_config_fields_are_refused():
    values = pretrain.get_config("size=tiny").model.to_dict()
    with pytest.raises(ValueError, match=r"^--config.model: unknown fields \['matmul'\]"):
        job_config.model_config({**values, "matmul": "auto"})
