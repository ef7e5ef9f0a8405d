"""A third encoder architecture, written and registered by this test alone: the pretraining job, a fine-tuning
task from its checkpoint and the fine-tuned parameters read back all run on it through bert_jax.arch's interface,
with no library module changed."""

import dataclasses
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bert_jax import arch
from bert_jax import model as model_lib
from bert_jax import tasks
from bert_jax.arch.base import Architecture, encoder_flops
from bert_jax.data import tokenization
from bert_jax.data import vocabulary
from bert_jax.interop import export
from bert_jax.interop import init_architecture
from configs import finetune as finetune_configs
from tests import helpers

KEYWORD_TASK = os.path.join(helpers.ROOT, "tests", "fixtures", "keyword_task")


@dataclasses.dataclass(frozen=True)
class ToyConfig(model_lib.EncoderShape):
    """An encoder of token and position embeddings and residual MLP blocks: no attention at all."""
    vocab_size: int = 256
    hidden_size: int = 32
    num_layers: int = 1
    num_heads: int = 1  # EncoderShape's head_dim; the toy has no attention
    intermediate_size: int = 64
    max_position_embeddings: int = 64
    dropout_rate: float = 0.0
    initializer_range: float = 0.02
    dtype: str = "float32"

    @classmethod
    def from_config(cls, values):
        return cls(**model_lib.config_fields(cls, values))


def _param(names):
    return nn.with_logical_partitioning(nn.initializers.normal(0.02), names)


def _encode(config: ToyConfig, input_ids):
    embeddings = nn.Embed(config.vocab_size, config.hidden_size, embedding_init=_param(("vocab", "embed")),
                          name="embeddings")
    positions = nn.Embed(config.max_position_embeddings, config.hidden_size, embedding_init=_param((None, "embed")),
                         name="positions")
    x = embeddings(input_ids) + positions(jnp.arange(input_ids.shape[1]))[None]
    for index in range(config.num_layers):
        hidden = nn.Dense(config.intermediate_size, kernel_init=_param(("embed", "mlp")), name=f"layer_{index}_in")(
            nn.LayerNorm(name=f"layer_{index}_norm")(x))
        x = x + nn.Dense(config.hidden_size, kernel_init=_param(("mlp", "embed")), name=f"layer_{index}_out")(
            nn.gelu(hidden))
    return nn.LayerNorm(name="final_norm")(x), embeddings


class ToyForMaskedLM(nn.Module):
    config: ToyConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, masked_lm_positions=None, deterministic=True,
                 position_ids=None, instance_ids=None, nsp_positions=None, sequence_output=True):
        del input_mask, segment_ids, deterministic, position_ids, instance_ids, nsp_positions, sequence_output
        x, embeddings = _encode(self.config, input_ids)
        rows = model_lib.gather_rows(x, masked_lm_positions)
        bias = self.param("mlm_output_bias", nn.initializers.zeros_init(), (self.config.vocab_size,))
        return {"mlm_logits": embeddings.attend(rows) + bias}


class ToyForSequenceClassification(nn.Module):
    config: ToyConfig
    num_classes: int

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, deterministic=True):
        del segment_ids, deterministic
        x, _ = _encode(self.config, input_ids)
        weights = input_mask.astype(jnp.float32)[..., None]
        pooled = (x * weights).sum(1) / weights.sum(1)
        return {"logits": nn.Dense(self.num_classes, name="classifier")(pooled)}


class Toy(Architecture):
    name = "toy"
    config_class = ToyConfig
    description = "a toy encoder"
    presets = {"tiny": (1, 32)}
    checkpoint_fields = ("vocab_size", "hidden_size", "num_layers", "intermediate_size", "max_position_embeddings")
    vocab_rows = ("embeddings/embedding", "mlm_output_bias")

    def preset(self, size):
        layers, hidden = self.presets[size]
        return ml_collections.ConfigDict({"arch": self.name, **dataclasses.asdict(ToyConfig(
            num_layers=layers, hidden_size=hidden))})

    def pretraining_model(self, config):
        return ToyForMaskedLM(config)

    def sequence_model(self, config, num_labels):
        return ToyForSequenceClassification(config, num_labels)

    def is_pretrained_parameter(self, name):
        return name != "classifier"

    def flops_per_sequence(self, config, seq_length, max_predictions):
        return float(encoder_flops(config, 2, seq_length, max_predictions))

    def checkpoint_shapes(self, params):
        if "positions" not in params:
            return None
        vocab_size, hidden_size = params["embeddings"]["embedding"].shape
        return {"vocab_size": int(vocab_size), "hidden_size": int(hidden_size),
                "num_layers": sum(1 for name in params if name.endswith("_in")),
                "intermediate_size": int(params["layer_0_in"]["kernel"].shape[-1]),
                "max_position_embeddings": int(params["positions"]["embedding"].shape[0])}


@pytest.fixture
def toy():
    architecture = arch.register(Toy())
    yield architecture
    arch.unregister(architecture.name)


def test_a_registered_architecture_pretrains_fine_tunes_and_reads_back(toy, tmp_path):
    texts = [line.split(",", 1)[0] for line in open(os.path.join(KEYWORD_TASK, "train.csv"), encoding="utf-8")]
    vocab = vocabulary.train_wordpiece(texts[1:], vocab_size=200, output_dir=str(tmp_path / "vocab"),
                                         min_frequency=1)
    rows = tokenization.padded_vocab_size(vocab.vocab_size)

    # Pretraining: the job, its checkpoints and its recorded architecture, on the toy encoder.
    config = helpers.tiny_config((-1, 1, 1))
    with config.unlocked():
        config.model = toy.preset("tiny")
    config.model.vocab_size = rows
    pretrained = str(tmp_path / "pretrained")
    result = helpers.run_pretraining(config, pretrained)
    assert result.metrics["step"] == 10 and np.isfinite(result.metrics["loss"]), result.metrics
    assert "nsp_loss" not in result.metrics  # no NSP head: the loss is the masked LM's alone
    source = init_architecture.read_architecture(os.path.join(pretrained, "checkpoints"))
    assert (source.arch, source.values) == ("toy", {field: getattr(ToyConfig(vocab_size=rows), field)
                                                    for field in toy.checkpoint_fields})

    # Fine-tuning from it with the BERT recipe: the model becomes the checkpoint's architecture, its encoder read.
    tune = finetune_configs.get_config("size=tiny")
    tune.init = os.path.join(pretrained, "checkpoints")
    tune.data.train_file = os.path.join(KEYWORD_TASK, "train.csv")
    tune.data.eval_file = os.path.join(KEYWORD_TASK, "dev.csv")
    tune.data.text_columns, tune.data.label_column = "sentence", "label"
    tune.data.vocab_file, tune.data.max_seq_length = str(tmp_path / "vocab"), 16
    tune.train.batch_size, tune.train.num_steps, tune.optim.learning_rate = 32, 100, 1e-2
    workdir = str(tmp_path / "tuned")
    final = helpers.run_finetune(tune, workdir)
    assert final["step"] == 100 and final["eval_accuracy"] >= 0.9, final  # chance: 0.53 on 160 held-out rows

    # The fine-tuned parameters read back (the export's restore) give the run's held-out accuracy.
    tuned = os.path.join(workdir, "finetuned")
    model_config = init_architecture.recorded_config(os.path.join(tuned, init_architecture.RUN_MODEL_CONFIG))
    assert model_config == ToyConfig(vocab_size=rows)
    model = tasks.head_model("sequence", model_config, 2)
    ids = np.zeros((1, 16), np.int32)
    params = export.restore_model_params(tuned, model, ids, ids, ids)
    task = tasks.read_task(tune, tokenization.load_tokenizer(tune.data.vocab_file))
    encoded = task.eval_encoded
    logits = jax.jit(model.apply)({"params": params}, encoded["input_ids"], encoded["input_mask"])["logits"]
    accuracy = float(np.mean(np.argmax(np.asarray(logits), -1) == task.eval_labels))
    assert abs(accuracy - final["eval_accuracy"]) <= 1 / len(task.eval_labels), (accuracy, final)
