"""The downstream tasks' one name: the recipe's task=NAME, config.task, the registry, task.json and the benchmark's
--task agree for every registered task; the recipe's older spellings map onto them; and a fine-tuned directory of
an older run (task.json without "encoder", or no task.json at all) still exports with the right head."""

import json
import os

from etils import epath
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import finetune
from bert_jax import model as model_lib
from bert_jax import sharding as sharding_lib
from bert_jax import job_config
from bert_jax import tasks
from bert_jax.benchmarks import finetune as finetune_benchmark
from bert_jax.data import tokenization
from bert_jax.interop import init_architecture
from configs import finetune as finetune_configs

_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "value", "is", "good", "bad", "json", "read"]
# pylint: disable=protected-access  (what --mode=finetune writes and --mode=export reads back)
_write_model_files, _saved_head = finetune._write_model_files, finetune._saved_head
_HEADS = {"sequence": "BertForSequenceClassification", "tokens": "BertForTokenClassification",
          "qa": "BertForQuestionAnswering", "regression": "BertForSequenceClassification"}


def _tokenizer(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(_WORDS) + "\n")
    return tokenization.load_tokenizer(str(path), do_lower_case=True)


def _model_config():
    return model_lib.BertConfig(vocab_size=tokenization.padded_vocab_size(len(_WORDS)), hidden_size=16,
                                num_layers=1, num_heads=2, intermediate_size=32, max_position_embeddings=16)


def test_every_task_name_round_trips_through_the_recipe_the_registry_and_task_json(tmp_path):
    assert tasks.NAMES == ("sequence", "tokens", "qa", "regression")
    assert finetune_configs.TASKS == tasks.NAMES  # the recipe spells them without importing the tasks' code
    assert tuple(finetune_benchmark.TASKS) == tasks.NAMES  # --task=NAME
    # The file format the benchmark writes for a task is one that task reads (sequence: the default, auto).
    assert all(tasks.task_class(name).formats == (fmt,) for name, fmt in finetune_benchmark.FILE_FORMATS.items())
    tokenizer = _tokenizer(tmp_path)
    for name in tasks.NAMES:
        config = finetune_configs.get_config(f"task={name}")
        task_class = tasks.task_class(config.task)
        assert (config.task, task_class.name) == (name, name)
        assert config.data.format in task_class.formats
        directory = str(tmp_path / name)
        _write_model_files(directory, task_class(["a", "b"], {}, np.zeros(0)), "tuned", _model_config(), tokenizer)
        assert json.loads(open(os.path.join(directory, finetune.TASK_FILE), encoding="utf-8").read()) == \
            {"task": name, "encoder": "tuned"}
        assert _saved_head(directory) == (name, "tuned")
        assert type(tasks.head_model(name, _model_config(), 2)).__name__ == _HEADS[name]
    with pytest.raises(ValueError, match=r"config.task: unknown task 'ner'; choose one of \['sequence', 'tokens'"):
        tasks.task_class("ner")


def test_older_recipe_spellings_are_the_new_names():
    for old, new in (("csv", "sequence"), ("conll", "tokens"), ("squad", "qa")):
        for size in ("tiny", "base"):
            assert finetune_configs.get_config(f"size={size},task={old}").to_dict() == \
                finetune_configs.get_config(f"size={size},task={new}").to_dict(), (old, size)
    for name in finetune_configs.GLUE_TASKS:
        old = finetune_configs.get_config(f"size=base,task={name}")
        assert old.to_dict() == finetune_configs.get_config(f"size=base,glue={name}").to_dict()
        assert (old.task, old.data.train_file) == ("sequence", f"tfds:{finetune_configs.GLUE_TASKS[name][0]}:train")
    with pytest.raises(ValueError, match=r"glue=sst2 is a dataset of the sequence task, not of task=tokens"):
        finetune_configs.get_config("task=tokens,glue=sst2")
    with pytest.raises(ValueError, match=r"unknown GLUE dataset glue='squad'"):
        finetune_configs.get_config("glue=squad")


def test_a_file_format_of_another_task_names_that_task(tmp_path):
    config = finetune_configs.get_config("size=tiny")
    config.data.vocab_file, config.data.train_file = str(tmp_path / "vocab.txt"), str(tmp_path / "train.txt")
    config.data.format = "conll"
    with pytest.raises(ValueError, match=r"--config.data.format='conll': task=sequence reads .* a format of "
                                         r"task=tokens. Fix: configs/finetune.py:task=tokens"):
        job_config.validate(config, "finetune", 8, 1)
    config.data.format, config.task = "csv", "ner"
    with pytest.raises(ValueError, match=r"--config.task='ner': choose one of "
                                         r"\('sequence', 'tokens', 'qa', 'regression'\)"):
        job_config.validate(config, "finetune", 8, 1)


def _fine_tuned_directory(tmp_path, name: str, labels: list[str]) -> str:
    """WORKDIR/finetuned as --mode=finetune writes it, with task `name`'s freshly initialised parameters."""
    directory = str(tmp_path / "work" / finetune.FINETUNED_SUBDIR)
    task = tasks.task_class(name)(labels, {}, np.zeros(0))
    _write_model_files(directory, task, "tuned", _model_config(), _tokenizer(tmp_path))
    ids = np.zeros((1, 8), np.int32)
    params = sharding_lib.unbox(task.model(_model_config()).init(jax.random.key(0), ids, ids, ids)["params"])
    with ocp.StandardCheckpointer() as saver:
        saver.save(epath.Path(directory) / checkpoint_lib.STATE_ITEM, {"train_state": {"params": params}})
    return directory


@pytest.mark.parametrize("name,old_task_json", [
    ("sequence", {"task": "sequence"}),  # before task.json had "encoder"
    ("tokens", {"task": "tokens"}),
    ("qa", {"task": "qa"}),
    ("sequence", None),  # before task.json: a pooler, so a sequence classifier
    ("tokens", None),  # no pooler: a token classifier
])
def test_an_older_fine_tuned_directory_exports_with_its_head(tmp_path, name, old_task_json):
    labels = [] if name == "qa" else ["negative", "positive"]
    directory = _fine_tuned_directory(tmp_path, name, labels)
    task_json = os.path.join(directory, finetune.TASK_FILE)
    if old_task_json is None:
        os.remove(task_json)
    else:
        with open(task_json, "w", encoding="utf-8") as file:
            json.dump(old_task_json, file)
    assert _saved_head(directory) == (name, "tuned")
    output = finetune.export_finetuned(str(tmp_path / "work"))
    hf_config = json.loads(open(os.path.join(output, "config.json"), encoding="utf-8").read())
    assert hf_config["architectures"] == [_HEADS[name]]
    assert hf_config.get("id2label", {}) == {str(index): label for index, label in enumerate(labels)}
    assert os.path.exists(os.path.join(directory, init_architecture.RUN_MODEL_CONFIG))
