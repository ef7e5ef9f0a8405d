"""--config.init takes the architecture (and the tokenizer) from the checkpoint it names: HuggingFace config.json,
original bert_config.json, a Flax export, a bert_jax run or fine-tuned directory; explicitly set fields must agree."""

import dataclasses
import json
import logging
import os
import shutil
import sys

import pytest

from bert_jax import arch
from bert_jax.interop import flax_files
from bert_jax import model as model_lib
from bert_jax.interop import init_architecture
from bert_jax.data import tokenization
from configs import finetune as finetune_configs
from configs import pretrain as pretrain_configs
from tests import helpers
from tests._session import small_records, trained_run  # noqa: F401  (session fixtures)

# all-MiniLM-L6-v2's config.json (the fields a BERT config.json has): 6 layers, hidden 384, 12 heads, exact gelu.
MINILM = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "hidden_size": 384, "initializer_range": 0.02, "intermediate_size": 1536,
          "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 12,
          "num_hidden_layers": 6, "pad_token_id": 0, "position_embedding_type": "absolute", "type_vocab_size": 2,
          "vocab_size": 30522}
MINILM_ARCHITECTURE = {"vocab_size": 30522, "hidden_size": 384, "num_layers": 6, "num_heads": 12,
                       "intermediate_size": 1536, "hidden_act": "gelu", "max_position_embeddings": 512,
                       "type_vocab_size": 2, "layer_norm_eps": 1e-12}


def _architecture(config):
    return {field: config.model[field] for field in arch.BERT.checkpoint_fields}


def _vocab(path, entries):
    """A WordPiece vocab.txt of `entries` lines (the special tokens, then filler words)."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"word{i}" for i in range(entries - 5)]
    path.write_text("".join(word + "\n" for word in words), encoding="utf-8")
    return str(path)


@pytest.fixture
def hf_dir(tmp_path):
    """A HuggingFace model directory as far as --config.init's architecture goes: config.json and vocab.txt."""
    directory = tmp_path / "minilm"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(MINILM))
    _vocab(directory / "vocab.txt", 30522)
    return directory


def test_pretraining_from_a_huggingface_config_takes_every_field_and_pads_the_vocab(hf_dir):
    config = pretrain_configs.get_config("size=tiny,data=synthetic")  # the tiny preset: 2 layers, hidden 128
    config.init = str(hf_dir)
    resolved = init_architecture.resolve_init_architecture(config)
    assert _architecture(resolved) == dict(MINILM_ARCHITECTURE, vocab_size=30592)  # padded to a multiple of 128
    assert resolved.data.vocab_file == str(hf_dir / "vocab.txt")  # its tokenizer, as none was set
    assert config.model.hidden_size == 128 and config.data.vocab_file == ""  # the config given is not changed
    assert resolved.model.dropout_rate == 0.1 and resolved.model.dtype == "float32"  # the run's own choices
    # Resolving the resolved config changes nothing (the driver resolves, then the job again).
    assert init_architecture.resolve_init_architecture(resolved).to_dict() == resolved.to_dict()
    # Fine-tuning keeps the checkpoint's rows.
    config = finetune_configs.get_config("size=base")
    config.init = str(hf_dir)
    assert _architecture(init_architecture.resolve_init_architecture(config)) == MINILM_ARCHITECTURE


def test_explicit_fields_must_agree_and_every_disagreement_is_named_at_once(hf_dir, tmp_path):
    config = pretrain_configs.get_config("size=tiny,data=synthetic")
    config.init = str(hf_dir)
    # Set to the checkpoint's values: agreed, no error. A larger padded vocabulary is fine for pretraining.
    config.model.update(hidden_size=384, num_heads=12, vocab_size=30720)
    resolved = init_architecture.resolve_init_architecture(config)
    assert resolved.model.vocab_size == 30720 and resolved.model.num_layers == 6
    # Different from the preset and from the checkpoint: all three named in one error.
    config.model.update(hidden_size=256, num_layers=4, intermediate_size=1024)
    with pytest.raises(ValueError) as error:
        init_architecture.resolve_init_architecture(config)
    message = str(error.value)
    assert message.startswith(f"--config.init={hf_dir} ({hf_dir / 'config.json'}) has hidden_size=384 but "
                              "--config.model.hidden_size=256; has num_layers=6 but --config.model.num_layers=4; "
                              "has intermediate_size=1536 but --config.model.intermediate_size=1024. Fix: "), message
    # A field given on the command line counts as set even where it equals the preset's value (tiny: 2 layers).
    config = pretrain_configs.get_config("size=tiny,data=synthetic")
    config.init = str(hf_dir)
    with pytest.raises(ValueError, match=r"has num_layers=6 but --config\.model\.num_layers=2\. Fix"):
        init_architecture.resolve_init_architecture(config, command_line=["model.num_layers", "train.seed"])
    # Fewer rows than the checkpoint's cannot be padded to.
    config.model.vocab_size = 30000
    with pytest.raises(ValueError, match=r"has vocab_size=30522 but --config\.model\.vocab_size=30000 \(rows are "
                                         r"added on import, never dropped: at least 30522\)"):
        init_architecture.resolve_init_architecture(config)


@pytest.mark.filterwarnings(r"ignore:the load_module\(\) method is deprecated:DeprecationWarning")
def test_command_line_overrides_count_as_explicit(hf_dir, monkeypatch):
    """What the driver passes: ml_collections' record of the --config.* overrides of the command line."""
    from absl import flags
    from ml_collections import config_flags
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=flag_values, lock_config=True)
    argv = ["bert_jax", f"--config={helpers.ROOT}/configs/finetune.py:size=tiny", f"--config.init={hf_dir}",
            "--config.model.num_heads=2", "--config.model.hidden_size=384"]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags reads the overrides from sys.argv
    flag_values(argv)
    overrides = config_flags.get_override_values(flag_values["config"])
    assert sorted(overrides) == ["init", "model.hidden_size", "model.num_heads"]
    with pytest.raises(ValueError, match=r"has num_heads=12 but --config\.model\.num_heads=2\. Fix"):
        init_architecture.resolve_init_architecture(flag_values.config, overrides)


def test_original_tf_and_flax_export_configs(tmp_path):
    # An original checkpoint: bert_config.json beside bert_model.ckpt.*, "gelu" meaning the tanh form.
    original = tmp_path / "uncased_L-4_H-256_A-4"
    original.mkdir()
    (original / "bert_model.ckpt.index").write_bytes(b"")
    (original / "bert_config.json").write_text(json.dumps({
        "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "hidden_size": 256,
        "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 512,
        "num_attention_heads": 4, "num_hidden_layers": 4, "type_vocab_size": 2, "vocab_size": 30522}))
    config = finetune_configs.get_config("size=tiny")
    config.init = str(original / "bert_model.ckpt")
    source = init_architecture.read_architecture(config.init)
    assert source.format == "tf_checkpoint" and source.where == str(original / "bert_config.json")
    assert source.vocab_file is None  # no vocab.txt beside it
    resolved = init_architecture.resolve_init_architecture(config)
    assert (resolved.model.num_layers, resolved.model.hidden_size, resolved.model.num_heads,
            resolved.model.intermediate_size, resolved.model.hidden_act) == (4, 256, 4, 1024, "gelu_tanh")

    # A Flax export: bert_jax_config.json, and its saved tokenizer (130 entries for 256 rows: padded).
    flax_dir = tmp_path / "flax"
    flax_dir.mkdir()
    bert = model_lib.BertConfig(vocab_size=256, hidden_size=64, num_layers=3, num_heads=4, intermediate_size=96,
                                hidden_act="gelu", max_position_embeddings=40, layer_norm_eps=1e-6)
    (flax_dir / flax_files.FLAX_CONFIG).write_text(json.dumps(dataclasses.asdict(bert)))
    tokenization.load_tokenizer(_vocab(tmp_path / "vocab.txt", 130)).save(str(flax_dir))
    config = pretrain_configs.get_config("size=mini,data=tfrecord")
    config.init = str(flax_dir)
    resolved = init_architecture.resolve_init_architecture(config)
    assert _architecture(resolved) == {field: getattr(bert, field) for field in arch.BERT.checkpoint_fields}
    assert resolved.data.vocab_file == str(flax_dir)
    # A vocabulary that is not the checkpoint's is refused, naming both sizes.
    config.data.vocab_file = _vocab(tmp_path / "other.txt", 300)
    with pytest.raises(ValueError, match=r"vocab_file=.*other\.txt has 300 entries but the checkpoint \(.*"
                                         r"bert_jax_config\.json\) has 256 word-embedding rows: not the vocabulary"):
        init_architecture.resolve_init_architecture(config)


def test_an_inconsistent_config_file_is_named_not_a_flag(hf_dir, tmp_path):
    values = dict(MINILM, hidden_size=256)  # 12 heads cannot split 256
    (hf_dir / "config.json").write_text(json.dumps(values))
    config = pretrain_configs.get_config("size=tiny,data=synthetic")
    config.init = str(hf_dir)
    message = rf"{hf_dir / 'config.json'} is not a consistent BERT config: num_attention_heads=12 does not divide " \
              r"hidden_size=256\. Fix: correct that file"
    with pytest.raises(ValueError, match=message) as error:
        init_architecture.resolve_init_architecture(config)
    assert "--config" not in str(error.value)
    (hf_dir / "config.json").write_text(json.dumps(dict(MINILM, num_hidden_layers=0, intermediate_size="big")))
    with pytest.raises(ValueError, match=r"config\.json is not a consistent BERT config: num_hidden_layers=0 is not "
                                         r"a positive integer; intermediate_size='big' is not a positive integer"):
        init_architecture.resolve_init_architecture(config)
    (tmp_path / "flax").mkdir()
    (tmp_path / "flax" / flax_files.FLAX_CONFIG).write_text(json.dumps({"hidden_size": 100, "num_heads": 3}))
    config.init = str(tmp_path / "flax")
    with pytest.raises(ValueError, match=r"bert_jax_config\.json is not a consistent BERT config: num_heads=3 does not "
                                         r"divide hidden_size=100"):
        init_architecture.resolve_init_architecture(config)


def test_a_missing_path_is_named(tmp_path):
    config = finetune_configs.get_config("size=tiny")
    config.init = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=rf"--config.init={tmp_path / 'nowhere'} does not exist\. Fix: "):
        init_architecture.resolve_init_architecture(config)


def test_a_corpus_run_needs_the_checkpoints_tokenizer(hf_dir):
    os.remove(hf_dir / "vocab.txt")
    config = pretrain_configs.get_config("size=tiny")  # data.source=corpus: would train a new tokenizer
    config.init = str(hf_dir)
    with pytest.raises(ValueError, match=r"has no tokenizer beside it and --config\.data\.vocab_file is empty.*"
                                         r"Fix: set --config\.data\.vocab_file"):
        init_architecture.resolve_init_architecture(config)


def test_a_bert_jax_run_gives_its_recorded_architecture_or_its_shapes(trained_run, tmp_path, caplog):
    """tests/_session.py's run: 2 layers, hidden 128, vocab 512, 64 positions; it wrote WORKDIR/model_config.json."""
    workdir = trained_run["workdir"]
    recorded = json.loads(open(os.path.join(workdir, init_architecture.RUN_MODEL_CONFIG), encoding="utf-8").read())
    assert (recorded["vocab_size"], recorded["max_position_embeddings"], recorded["num_heads"]) == (512, 64, 2)
    run = {"vocab_size": 512, "hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 512,
           "hidden_act": "gelu_tanh", "max_position_embeddings": 64, "type_vocab_size": 2, "layer_norm_eps": 1e-12}
    for init in (os.path.join(workdir, "checkpoints"), os.path.join(workdir, "checkpoints", "4")):
        source = init_architecture.read_architecture(init)
        assert source.values == run and source.where == os.path.join(workdir, init_architecture.RUN_MODEL_CONFIG)
    # The base preset's architecture gives way to the run's: vocab 512 rows kept as they are.
    config = pretrain_configs.get_config("size=base,data=synthetic")
    config.init = os.path.join(workdir, "checkpoints")
    with caplog.at_level(logging.WARNING):
        assert _architecture(init_architecture.resolve_init_architecture(config)) == run
    # The recipe's learning rate and steps are base's: said, with the preset that has this size.
    assert "is not the base preset (it has 2 layers, hidden 128, 2 heads)" in caplog.text
    assert "size=tiny has the ones for its size" in caplog.text

    # Without the record (a run of an earlier version): what the array shapes say; the heads stay the config's.
    copy = tmp_path / "copy"
    shutil.copytree(os.path.join(workdir, "checkpoints"), copy / "checkpoints")
    source = init_architecture.read_architecture(str(copy / "checkpoints"))
    assert source.values == {field: run[field] for field in ("vocab_size", "hidden_size", "num_layers",
                                                              "intermediate_size", "max_position_embeddings",
                                                              "type_vocab_size")}
    # A record that contradicts the arrays is named.
    (copy / init_architecture.RUN_MODEL_CONFIG).write_text(json.dumps(dict(recorded, hidden_size=256, num_heads=4)))
    with pytest.raises(ValueError, match=r"model_config\.json does not describe the checkpoint .*checkpoints/4: "
                                         r"hidden_size=256 there but 128 in the arrays"):
        init_architecture.read_architecture(str(copy / "checkpoints"))


def test_pretraining_continues_from_a_run_with_the_presets_defaults(trained_run, small_records, tmp_path, caplog):
    """The session run's 64 positions and 512-word vocabulary come from its checkpoint, not from the config."""
    config = helpers.small_tfrecord_config(small_records, num_steps=1)
    config.data.eval_input_files = ""
    preset = pretrain_configs.model_config("tiny")
    config.model.update(vocab_size=preset.vocab_size, max_position_embeddings=preset.max_position_embeddings)
    config.init = os.path.join(trained_run["workdir"], "checkpoints")
    with caplog.at_level(logging.INFO):
        helpers.run_pretraining(config, str(tmp_path))
    assert "vocab_size=512" in caplog.text and "max_position_embeddings=64" in caplog.text
    written = json.loads((tmp_path / init_architecture.RUN_MODEL_CONFIG).read_text())
    assert (written["vocab_size"], written["max_position_embeddings"]) == (512, 64)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]


def test_a_corpus_runs_tokenizer_is_found_through_its_data_step(trained_run, tmp_path):
    """A run that made its data (data.source=corpus) names its tokenizer in WORKDIR/data/READY.json."""
    workdir = tmp_path / "run"
    shutil.copytree(os.path.join(trained_run["workdir"], "checkpoints"), workdir / "checkpoints")
    shutil.copy(os.path.join(trained_run["workdir"], init_architecture.RUN_MODEL_CONFIG), workdir)
    tokenizer_dir = str(workdir / "data" / "tokenizer")
    tokenization.load_tokenizer(_vocab(tmp_path / "vocab.txt", 500)).save(tokenizer_dir)  # 500 entries, 512 rows
    (workdir / "data" / "READY.json").write_text(json.dumps({"tokenizer_dir": tokenizer_dir}))
    config = finetune_configs.get_config("size=tiny")
    config.init = str(workdir / "checkpoints" / "4")
    assert init_architecture.resolve_init_architecture(config).data.vocab_file == tokenizer_dir
