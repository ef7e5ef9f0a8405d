"""The BERT encoder with masked-LM and next-sentence-prediction heads (Flax linen), and its downstream forms.

The architecture follows the original google-research/bert `modeling.py`: post-LayerNorm encoder layers, learned
position embeddings, a tanh pooler on [CLS], an MLM head whose decoder is tied to the word embeddings and that is
evaluated only at `masked_lm_positions`, and a 2-way NSP head. Every parameter carries logical axis names, and
activations are constrained at layer boundaries, so the same module runs unsharded or over any
data/FSDP/tensor mesh (the logical-to-mesh rules live in the config, see `bert_jax.sharding`).

BertModel (features) and BertForSequenceClassification (fine-tuning) build the encoder with the same helper and
hence the same parameter names (`embeddings`, `layer_{i}`, `pooler`), so pretrained parameters load unchanged.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# Logical axis names used below. Parameters: "vocab", "embed", "heads", "mlp", "position", "segment", "classes";
# "norm" marks small hidden-sized vectors (LayerNorm, biases on the residual stream) that are never worth sharding.
# Activations: "batch", "length", "act_embed", "act_heads", "act_mlp".

HIDDEN_ACTIVATIONS = ("gelu_tanh", "gelu")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture hyper-parameters; the field names match `config.model` in configs/pretrain.py."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu_tanh"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dtype: str = "float32"

    @classmethod
    def from_config(cls, model_config) -> "BertConfig":
        """Builds a BertConfig from the `config.model` ConfigDict (or any mapping)."""
        values = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
        unknown = set(values) - {field.name for field in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"config.model has unknown fields {sorted(unknown)}")
        return cls(**values).validate()

    def validate(self) -> "BertConfig":
        def fail(field, problem):
            raise ValueError(f"--config.model.{field}={getattr(self, field)!r}: {problem}")

        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                      "max_position_embeddings", "type_vocab_size"):
            if getattr(self, field) <= 0:
                fail(field, "must be a positive integer")
        if self.hidden_size % self.num_heads:
            fail("num_heads", f"must divide model.hidden_size={self.hidden_size}")
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            fail("hidden_act", f"choose one of {HIDDEN_ACTIVATIONS}")
        if self.dtype not in COMPUTE_DTYPES:
            fail("dtype", f"choose one of {COMPUTE_DTYPES}")
        for field in ("dropout_rate", "attention_dropout_rate"):
            if not 0.0 <= getattr(self, field) < 1.0:
                fail(field, "must be in [0, 1)")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


def model_flops_per_sequence(config: BertConfig, seq_length: int, max_predictions: int) -> float:
    """Training FLOPs (forward + backward = 3x forward) for one sequence, counting matmuls only.

    6 * N * T for the encoder's matmul parameters N, 12 * L * d * T^2 for attention scores and context, and the MLM
    head (transform and tied decoder) at the masked positions only, since that is all the model computes.
    """
    h, layers = config.hidden_size, config.num_layers
    encoder_matmul_params = layers * (4 * h * h + 2 * h * config.intermediate_size)
    encoder = 6 * encoder_matmul_params * seq_length + 12 * layers * h * seq_length * seq_length
    mlm_head = 6 * max_predictions * (h * h + h * config.vocab_size)
    pooler_and_nsp = 6 * (h * h + 2 * h)
    return float(encoder + mlm_head + pooler_and_nsp)


def _kernel_init(config: BertConfig, names):
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def _zeros(names):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
    return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _dense(config: BertConfig, features: int, names, name: str) -> nn.Dense:
    # Dense + reshape rather than DenseGeneral: DenseGeneral with multi-dimensional features and logical partitioning
    # fails under jax.set_mesh on this stack.
    return nn.Dense(features, dtype=config.compute_dtype, param_dtype=jnp.float32,
                    kernel_init=_kernel_init(config, names), bias_init=_zeros(names[-1:]), name=name)


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    # Flax computes the statistics in float32 even for bfloat16 inputs.
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
                        scale_init=_ones(("norm",)), bias_init=_zeros(("norm",)), name=name)


def _activation(config: BertConfig, x):
    return jax.nn.gelu(x, approximate=config.hidden_act == "gelu_tanh")


def _constrain(x, names):
    return nn.with_logical_constraint(x, names)


class BertEmbeddings(nn.Module):
    """Word + segment + learned position embeddings, then LayerNorm and dropout."""

    config: BertConfig

    def setup(self):
        config = self.config

        def embed(rows, names, name):
            return nn.Embed(rows, config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                            embedding_init=_kernel_init(config, names), name=name)

        self.word_embeddings = embed(config.vocab_size, ("vocab", "embed"), "word_embeddings")
        self.position_embeddings = embed(config.max_position_embeddings, ("position", "embed"),
                                         "position_embeddings")
        self.token_type_embeddings = embed(config.type_vocab_size, ("segment", "embed"), "token_type_embeddings")
        self.layer_norm = _layer_norm(config, "LayerNorm")
        self.dropout = nn.Dropout(config.dropout_rate)

    def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(segment_ids))
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        return _constrain(x, ("batch", "length", "act_embed"))

    def attend(self, hidden):
        """Logits over the vocabulary with the word-embedding matrix as the (tied) decoder."""
        return self.word_embeddings.attend(hidden)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with the padding mask, followed by the output projection."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool):
        config = self.config
        batch, length, _ = x.shape

        def project(name):
            y = _dense(config, config.hidden_size, ("embed", "heads"), name)(x)
            y = y.reshape(batch, length, config.num_heads, config.head_dim)
            return _constrain(y, ("batch", "length", "act_heads", None))

        query, key, value = project("query"), project("key"), project("value")
        scores = jnp.einsum("bqhd,bkhd->bhqk", query, key) / jnp.sqrt(config.head_dim).astype(query.dtype)
        # Softmax in float32 whatever the compute dtype; padded keys get exactly zero probability.
        scores = scores.astype(jnp.float32)
        scores = jnp.where(attention_mask[:, None, None, :], scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(config.compute_dtype)
        probs = nn.Dropout(config.attention_dropout_rate)(probs, deterministic=deterministic)
        context = jnp.einsum("bhqk,bkhd->bqhd", probs, value)
        context = _constrain(context, ("batch", "length", "act_heads", None))
        context = context.reshape(batch, length, config.hidden_size)
        return nn.Dense(config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                        kernel_init=_kernel_init(config, ("heads", "embed")), bias_init=_zeros(("norm",)),
                        name="output")(context)


class BertLayer(nn.Module):
    """One post-LN encoder layer: attention, add & norm, GELU feed-forward, add & norm."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool):
        config = self.config
        attention = BertSelfAttention(config, name="attention")(x, attention_mask, deterministic)
        attention = nn.Dropout(config.dropout_rate)(attention, deterministic=deterministic)
        x = _layer_norm(config, "attention_layer_norm")(x + attention)
        x = _constrain(x, ("batch", "length", "act_embed"))

        hidden = _dense(config, config.intermediate_size, ("embed", "mlp"), "intermediate")(x)
        hidden = _constrain(_activation(config, hidden), ("batch", "length", "act_mlp"))
        hidden = nn.Dense(config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                          kernel_init=_kernel_init(config, ("mlp", "embed")), bias_init=_zeros(("norm",)),
                          name="output")(hidden)
        hidden = nn.Dropout(config.dropout_rate)(hidden, deterministic=deterministic)
        x = _layer_norm(config, "output_layer_norm")(x + hidden)
        return _constrain(x, ("batch", "length", "act_embed"))


def is_encoder_parameter(name: str) -> bool:
    """True for a top-level parameter name the pretraining and downstream models share (embeddings, layers, pooler).

    BertForPreTraining's parameters minus the heads (nsp_head, mlm_*) are exactly those of BertModel, and those of
    BertForSequenceClassification minus `classifier`, so pretrained parameters load by name with no renaming.
    """
    return name == "embeddings" or name == "pooler" or (name.startswith("layer_") and name[6:].isdigit())


def _encode(config: BertConfig, input_ids, input_mask, segment_ids, deterministic: bool):
    """Embeddings and every encoder layer, created as `embeddings` and `layer_{i}` in the CALLING compact module.

    A function rather than a submodule so that the callers (pretraining, classification, features) all own the
    same top-level names. Returns (sequence_output, hidden_states, embeddings module); hidden_states holds the
    embeddings output and every layer's output.
    """
    _, length = input_ids.shape
    position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], input_ids.shape)
    attention_mask = input_mask.astype(bool)

    embeddings = BertEmbeddings(config, name="embeddings")
    x = embeddings(input_ids, segment_ids, position_ids, deterministic)
    hidden_states = [x]
    for index in range(config.num_layers):
        x = BertLayer(config, name=f"layer_{index}")(x, attention_mask, deterministic)
        hidden_states.append(x)
    return x, tuple(hidden_states), embeddings


def _pool(config: BertConfig, sequence_output):
    """The BERT pooler, created as `pooler` in the calling compact module: tanh(dense([CLS] hidden state))."""
    return nn.tanh(_dense(config, config.hidden_size, ("embed", None), "pooler")(sequence_output[:, 0]))


class BertForPreTraining(nn.Module):
    """Encoder plus pooler, MLM head (tied decoder + output bias) and NSP head.

    Inputs follow the original TFRecord layout: `input_ids`, `input_mask` (1 for real tokens), `segment_ids`
    ([batch, length]) and `masked_lm_positions` ([batch, predictions]). Returns a dict with `mlm_logits`
    ([batch, predictions, vocab], float32), `nsp_logits` ([batch, 2], float32), `sequence_output` and
    `pooled_output`, plus `hidden_states` (embeddings output and every layer's output) when asked for.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, deterministic: bool = True,
                 output_hidden_states: bool = False) -> dict[str, Any]:
        config = self.config
        x, hidden_states, embeddings = _encode(config, input_ids, input_mask, segment_ids, deterministic)
        pooled = _pool(config, x)
        nsp_logits = nn.Dense(2, dtype=jnp.float32, param_dtype=jnp.float32,
                              kernel_init=_kernel_init(config, ("embed", "classes")), bias_init=_zeros(("classes",)),
                              name="nsp_head")(pooled)

        # Gather before the head: the transform and the vocab-sized decoder run on masked positions only.
        masked = jnp.take_along_axis(x, masked_lm_positions[..., None].astype(jnp.int32), axis=1)
        masked = _activation(config, _dense(config, config.hidden_size, ("embed", None), "mlm_transform")(masked))
        masked = _layer_norm(config, "mlm_layer_norm")(masked)
        mlm_bias = self.param("mlm_output_bias", _zeros(("vocab",)), (config.vocab_size,), jnp.float32)
        mlm_logits = embeddings.attend(masked).astype(jnp.float32) + mlm_bias

        outputs = {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits, "sequence_output": x,
                   "pooled_output": pooled}
        if output_hidden_states:
            outputs["hidden_states"] = hidden_states
        return outputs


class BertModel(nn.Module):
    """The encoder and pooler alone, for features: BertForPreTraining's parameters minus its heads.

    Returns `sequence_output` ([batch, length, hidden]), `pooled_output` ([batch, hidden]) and `hidden_states`
    (the embeddings output and every layer's output; unused ones cost nothing under jit).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        x, hidden_states, _ = _encode(self.config, input_ids, input_mask, segment_ids, deterministic)
        return {"sequence_output": x, "pooled_output": _pool(self.config, x), "hidden_states": hidden_states}


class BertForSequenceClassification(nn.Module):
    """Encoder, pooler, dropout and a linear `classifier` on the pooled [CLS] vector, as in the BERT paper.

    Its parameters are BertModel's plus `classifier` (kernel [hidden, num_classes], logical axes
    ("embed", "classes"), initialised like the original run_classifier.py: truncated normal, zero bias). Returns
    `logits` ([batch, num_classes], float32) and `pooled_output`.
    """

    config: BertConfig
    num_classes: int

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        config = self.config
        x, _, _ = _encode(config, input_ids, input_mask, segment_ids, deterministic)
        pooled = _pool(config, x)
        dropped = nn.Dropout(config.dropout_rate)(pooled, deterministic=deterministic)
        logits = nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32,
                          kernel_init=_kernel_init(config, ("embed", "classes")), bias_init=_zeros(("classes",)),
                          name="classifier")(dropped)
        return {"logits": logits, "pooled_output": pooled}
