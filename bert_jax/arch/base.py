"""What every encoder architecture is: the one face the rest of bert_jax asks, so that no other module tests which
encoder it has. bert_jax.arch registers the architectures; each lives in its own module of this package.

An architecture is a stateless object (one instance, registered under `name`, the value of config.model.arch). It
owns its config class and presets, its pretraining and task models, which parameters a pretrained checkpoint gives a
task model, stacking for scanned layers, its vocabulary rows, its FLOPs for MFU, and its transformers converter.
"""

import dataclasses
from typing import Any, ClassVar

import flax.linen as nn
import ml_collections


class Architecture:
    """One encoder architecture. A subclass sets the class attributes and implements the methods that raise
    NotImplementedError; the defaults suit an MLM-only encoder without scanned layers or transformers files."""

    name: ClassVar[str]  # config.model.arch; a run's model_config.json records it
    config_class: ClassVar[type]  # its frozen dataclass (bert_jax.model.EncoderShape's subclass) with from_config
    description: ClassVar[str]  # for log lines and messages
    presets: ClassVar[dict[str, tuple]] = {}  # size -> the shape its preset() builds
    # The config.model fields a checkpoint fixes; the others (dtype, dropout rates, attention, remat, scan_layers)
    # are the new run's choice (bert_jax.interop.init_architecture).
    checkpoint_fields: ClassVar[tuple[str, ...]] = ()
    # The flattened names ("a/b/c") of the parameters with one row per vocabulary entry: the word embeddings and the
    # MLM bias. Vocabulary padding adds rows to both; exports drop them.
    vocab_rows: ClassVar[tuple[str, str]] = ()
    # Pretrained parameters a task model may start fresh when a checkpoint lacks them (BERT's pooler, which a token
    # classifier's or question answerer's checkpoint has not).
    optional_pretrained_parameters: ClassVar[tuple[str, ...]] = ()
    has_nsp: ClassVar[bool] = False  # a next-sentence head: pretraining batches' NSP labels are scored
    token_encoders: ClassVar[tuple[str, ...]] = ("tuned",)  # train.encoder values its token classifier takes
    export_formats: ClassVar[tuple[str, ...]] = ("hf",)  # --export_format values of its pretraining checkpoints
    transformers_model_types: ClassVar[tuple[str, ...]] = ()  # config.json model_type values it imports
    transformers_pretraining_class: ClassVar[str] = ""  # transformers' class of its pretraining model
    # Whether the pretraining step computes only the rows the heads read in the last layer (see
    # step_matmul_flops_per_sequence); else every row of every layer.
    gathers_head_rows: ClassVar[bool] = False

    # Config and presets.

    def preset(self, size: str) -> ml_collections.ConfigDict:
        """config.model of preset `size` (one of `presets`), as a job's config starts it."""
        raise NotImplementedError

    def pretraining_recipe(self, config) -> None:
        """Changes the pretraining job's `config` (bert_jax.presets.pretraining_config's) where this architecture's
        published recipe differs from BERT's; nothing by default."""
        del config

    def config(self, model_config):
        """The config_class instance of `config.model` (a ConfigDict or mapping; its `arch` field is ignored), or
        `model_config` itself when it is one; ValueError "FIELD=VALUE: problem" for a bad field."""
        if isinstance(model_config, self.config_class):
            return model_config
        values = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
        values.pop("arch", None)
        return self.config_class.from_config(values)

    def config_from_record(self, values: dict, where: str):
        """The config a run wrote (model_config.json, less its `arch`); errors name `where`."""
        try:
            return self.config(values)
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def record(self, config) -> dict:
        """What model_config.json holds for `config`: its fields and `arch`."""
        return {"arch": self.name, **dataclasses.asdict(config)}

    # Models.

    def pretraining_model(self, config) -> nn.Module:
        """The pretraining model: its outputs are bert_jax.train's loss inputs (mlm_logits, and nsp_logits where
        has_nsp)."""
        raise NotImplementedError

    def sequence_model(self, config, num_labels: int) -> nn.Module:
        """A sequence classifier (num_labels=1: a regressor) returning `logits` [batch, num_labels]."""
        raise NotImplementedError

    def token_model(self, config, num_labels: int, encoder: str = "tuned") -> nn.Module:
        """A token classifier returning `logits` [batch, length, num_labels]; `encoder`: one of token_encoders."""
        raise NotImplementedError

    def qa_model(self, config) -> nn.Module:
        """An extractive question answerer returning `logits` [batch, 2, length] (start, end)."""
        raise NotImplementedError

    def features_model(self, config) -> nn.Module | None:
        """The encoder alone for --mode=features (sequence_output, pooled_output, hidden_states), or None where the
        architecture has none."""
        del config
        return None

    def is_pretrained_parameter(self, name: str) -> bool:
        """Whether top-level parameter `name` of a task model comes from a pretrained checkpoint (the encoder and
        whatever else the pretraining model shares with task models); the task's own head does not."""
        raise NotImplementedError

    # Scanned layers: checkpoint files and imports hold the unrolled layout.

    def stack_layers(self, params: dict, config) -> dict:
        """Unrolled parameters in `config`'s layout (scanned where it scans); as they are otherwise."""
        del config
        return params

    def unstack_layers(self, params: dict, config) -> dict:
        """stack_layers' inverse."""
        del config
        return params

    # FLOPs for MFU.

    def flops_per_sequence(self, config, seq_length: int, max_predictions: int) -> float:
        """Training FLOPs (forward + backward = 3x forward) of one sequence, matmuls only, every row of every
        layer."""
        raise NotImplementedError

    def step_matmul_flops_per_sequence(self, config, seq_length: int, max_predictions: int,
                                       cls_rows: int = 1) -> float:
        """The matmul FLOPs the pretraining step executes for one row; flops_per_sequence unless the step skips
        rows (gathers_head_rows)."""
        del cls_rows
        return self.flops_per_sequence(config, seq_length, max_predictions)

    # transformers.

    def checkpoint_shapes(self, params: dict) -> dict | None:
        """The checkpoint_fields that a bert_jax checkpoint's parameter tree (its metadata: leaves with .shape)
        determines, or None when the tree is not this architecture's."""
        del params
        return None

    def config_from_transformers(self, values: dict, where: str):
        """Its config from a transformers config.json's `values` (`where` names the file in errors)."""
        raise NotImplementedError(f"{self.name}: no transformers import")

    def transformers_config(self, config) -> dict:
        """The transformers config.json fields of its pretraining model for `config`."""
        raise NotImplementedError(f"{self.name}: no transformers export")

    def import_transformers(self, path: str, *, seed: int = 0, check_vocab: bool = True) -> tuple[Any, dict, Any]:
        """(config, host params in the unrolled layout, bert_jax.interop.layout.ImportReport) of a transformers
        directory or weights file; heads it lacks are initialised with `seed` and reported."""
        raise NotImplementedError(f"{self.name}: no transformers import")

    def export(self, params, config, output_dir: str, *, tokenizer=None, export_format: str = "hf",
               task: str | None = None, label_names=()) -> str:
        """Writes the pretraining model's parameters (task=None) or a fine-tuned task model's (task: one of
        bert_jax.tasks' names, with its label names) as `export_format` files; returns output_dir."""
        raise NotImplementedError(f"{self.name}: no export")



def encoder_flops(config, mlp_matrices: int, seq_length: int, max_predictions: int) -> int:
    """Training FLOPs (forward + backward = 3x forward) of one sequence through the encoder and the MLM head,
    matmuls only: 6 * N * T for the encoder's matmul parameters N (attention's four h x h, and `mlp_matrices` of
    h x intermediate_size), 12 * L * d * T^2 for attention scores and context, and the MLM head (transform and tied
    decoder) at the masked positions only, since that is all the model computes. Local attention is counted in
    full: the reference path computes every score and masks."""
    h, layers = config.hidden_size, config.num_layers
    encoder_matmul_params = layers * (4 * h * h + mlp_matrices * h * config.intermediate_size)
    encoder = 6 * encoder_matmul_params * seq_length + 12 * layers * h * seq_length * seq_length
    return encoder + 6 * max_predictions * (h * h + h * config.vocab_size)
