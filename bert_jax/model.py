"""BERT (Devlin et al., 2018) in Flax linen, as google-research/bert's `modeling.py`: word + position + segment
embeddings, post-LayerNorm encoder layers (self-attention, add & norm, GELU feed-forward, add & norm), a tanh pooler
on [CLS], a masked-LM head tied to the word embeddings and run at `masked_lm_positions` only, a 2-way NSP head.

Parameters carry logical axis names and activations are constrained at layer boundaries, so the same module runs
unsharded or over any mesh (bert_jax.sharding maps the names). Every model builds the encoder with one helper, hence
the same parameter names (`embeddings`, `layer_{i}` or `layers`, `pooler`). Attention back-ends: bert_jax.attention.
"""

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import attention as attention_lib
# Re-exported for callers of the model: bert_jax.aot traces for a TPU with model.compiling_for.
from bert_jax.attention import SegmentMask, compiling_for, target_platform  # noqa: F401  pylint: disable=unused-import

# Logical axis names. Parameters: "vocab", "embed", "heads", "mlp", "position", "segment", "classes", and "norm" for
# hidden-sized vectors (LayerNorm, biases added to the residual stream) that are never worth sharding.
# Activations: "batch", "length", "act_embed", "act_heads", "act_mlp".
HIDDEN = ("batch", "length", "act_embed")
HEADS = ("batch", "length", "act_heads", None)

HIDDEN_ACTIVATIONS = ("gelu_tanh", "gelu")
COMPUTE_DTYPES = ("float32", "bfloat16")
ATTENTION_IMPLEMENTATIONS = attention_lib.ATTENTION_IMPLEMENTATIONS
# What a rematerialised layer keeps for the backward pass: "matmuls" the outputs of the weight matmuls (no batch
# dimensions), recomputing the rest, [batch, heads, length, length] scores included; "full" only the layer's input.
REMAT_POLICIES = {"none": None, "matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "full": jax.checkpoint_policies.nothing_saveable}
# BertForTokenClassification.encoder (config.train.encoder): fine-tuned, or frozen with its last four layers as
# features.
TOKEN_ENCODERS = ("tuned", "frozen_last4")
SCANNED_LAYERS = "layers"  # parameter name (and logical axis name of the leading axis) of scanned layers


class EncoderShape:
    """What every architecture's config derives from its fields (hidden_size, num_heads, dtype)."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def compute_dtype(self):
        return jnp.dtype(self.dtype)


@dataclasses.dataclass(frozen=True)
class BertConfig(EncoderShape):
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
    attention: str = "auto"  # one of ATTENTION_IMPLEMENTATIONS; see attention.attention_implementation
    remat: str = "none"  # one of REMAT_POLICIES: activation rematerialisation of each encoder layer
    scan_layers: bool = False  # one nn.scan over the layers: parameters under "layers" with a leading layer axis

    @classmethod
    def from_config(cls, model_config) -> "BertConfig":
        """Builds a BertConfig from the `config.model` ConfigDict (or any mapping)."""
        return cls(**config_fields(cls, model_config)).validate()

    def validate(self) -> "BertConfig":
        """Raises ValueError("FIELD=VALUE: problem") for the first bad field (bert_jax.job_config names the flag)."""
        def fail(field, problem):
            raise ValueError(f"{field}={getattr(self, field)!r}: {problem}")

        check_sizes(self, ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                           "max_position_embeddings", "type_vocab_size"), fail)
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            fail("hidden_act", f"choose one of {HIDDEN_ACTIVATIONS}")
        check_compute_choices(self, fail)
        if not isinstance(self.scan_layers, bool):
            fail("scan_layers", "must be True or False")
        return self



def config_fields(config_class, model_config, ignored=()) -> dict:
    """`config.model` (a ConfigDict or mapping) as `config_class`'s keyword arguments, less the `ignored` keys; a
    field the class does not have is an error."""
    values = model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)
    values = {key: value for key, value in values.items() if key not in ignored}
    unknown = set(values) - {field.name for field in dataclasses.fields(config_class)}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    return values


def check_sizes(config, fields, fail) -> None:
    """Every one of `fields` a positive integer, and num_heads dividing hidden_size; `fail(field, problem)` raises."""
    for field in fields:
        if getattr(config, field) <= 0:
            fail(field, "must be a positive integer")
    if config.hidden_size % config.num_heads:
        fail("num_heads", f"must divide hidden_size={config.hidden_size}")


def check_compute_choices(config, fail) -> None:
    """The fields every architecture shares beside its sizes: dtype, dropout rates, attention back-end (and whether
    it has dropout) and remat policy; `fail(field, problem)` raises."""
    if config.dtype not in COMPUTE_DTYPES:
        fail("dtype", f"choose one of {COMPUTE_DTYPES}")
    for field in ("dropout_rate", "attention_dropout_rate"):
        if not 0.0 <= getattr(config, field) < 1.0:
            fail(field, "must be in [0, 1)")
    if config.attention not in ATTENTION_IMPLEMENTATIONS:
        fail("attention", f"choose one of {ATTENTION_IMPLEMENTATIONS}")
    if config.attention in attention_lib.FUSED_IMPLEMENTATIONS and config.attention_dropout_rate > 0:
        fail("attention", f"the fused kernels have no attention dropout, but attention_dropout_rate="
                          f"{config.attention_dropout_rate}. Fix: set attention_dropout_rate=0.0 (fused kernels "
                          "in training too), or attention=auto (fused kernels where dropout is off, the "
                          "reference path with dropout in training)")
    if config.remat not in REMAT_POLICIES:
        fail("remat", f"choose one of {tuple(REMAT_POLICIES)}")


def kernel_init(config, names):
    """The truncated-normal initialiser of every architecture's kernels and embeddings, with its logical axes."""
    return nn.with_logical_partitioning(nn.initializers.truncated_normal(config.initializer_range), names)


def _zeros(names):
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def dense(config, features: int, names, name: str, bias_names=None, dtype=None, use_bias: bool = True) -> nn.Dense:
    """A Dense layer of any architecture: float32 parameters, config's compute dtype (or `dtype`), kernel axes
    `names`, bias axes `bias_names` (default: the last kernel axis)."""
    # Dense + reshape rather than DenseGeneral: DenseGeneral with multi-dimensional features and logical
    # partitioning fails under jax.set_mesh on this stack.
    return nn.Dense(features, use_bias=use_bias, dtype=dtype or config.compute_dtype, param_dtype=jnp.float32,
                    kernel_init=kernel_init(config, names), bias_init=_zeros(bias_names or names[-1:]), name=name)


def layer_norm(config, name: str, epsilon: float, use_bias: bool = True) -> nn.LayerNorm:
    """A LayerNorm of any architecture: float32 parameters over the "norm" axis, config's compute dtype."""
    # Flax computes the statistics in float32 even for bfloat16 inputs.
    return nn.LayerNorm(epsilon=epsilon, use_bias=use_bias, dtype=config.compute_dtype, param_dtype=jnp.float32,
                        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
                        bias_init=_zeros(("norm",)), name=name)


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    return layer_norm(config, name, config.layer_norm_eps)


def _dropout(config: BertConfig, x, deterministic: bool):
    return nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)


def gelu(x, approximate: bool = False):
    """GELU: the tanh approximation (hidden_act "gelu_tanh", the original BERT code's and transformers' "gelu_new"),
    or the exact x * 0.5 * (1 + erf(x / sqrt(2))) (hidden_act "gelu", transformers' "gelu").

    The exact form is written with erf, as transformers writes it: jax.nn.gelu's erfc form costs about three times
    as much on XLA:CPU.
    """
    if approximate:
        return jax.nn.gelu(x, approximate=True)
    x = jnp.asarray(x)
    return x * (0.5 * (1.0 + jax.lax.erf(x * np.sqrt(0.5).astype(x.dtype))))


def gather_rows(x, positions):
    """x[b, positions[b, i]]: [batch, length, ...] -> [batch, rows, ...]."""
    index = positions.astype(jnp.int32).reshape(*positions.shape, *(1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def lookup(embed: nn.Embed, ids, table_names=(None, None)):
    """nn.Embed's lookup, from a table gathered over `embed` first (the word table stays split over `vocab`):
    XLA's SPMD partitioner crashes on a gather from a table split over its columns inside the per-slice shard_map
    of train.across_slices (Check failed in ExpandDeviceGroupsWithIota, jaxlib 0.10.2)."""
    table = nn.with_logical_constraint(embed.embedding.astype(embed.dtype), table_names)
    return nn.with_logical_constraint(jnp.take(table, ids, axis=0), HIDDEN)


class BertEmbeddings(nn.Module):
    """Word + segment + learned position embeddings, then LayerNorm and dropout."""

    config: BertConfig

    def setup(self):
        config = self.config

        def embed(rows, names, name):
            return nn.Embed(rows, config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                            embedding_init=kernel_init(config, names), name=name)

        self.word_embeddings = embed(config.vocab_size, ("vocab", "embed"), "word_embeddings")
        self.position_embeddings = embed(config.max_position_embeddings, ("position", "embed"), "position_embeddings")
        self.token_type_embeddings = embed(config.type_vocab_size, ("segment", "embed"), "token_type_embeddings")
        self.layer_norm = _layer_norm(config, "LayerNorm")
        self.dropout = nn.Dropout(config.dropout_rate)

    def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
        x = (lookup(self.word_embeddings, input_ids, ("vocab", None))
             + lookup(self.position_embeddings, position_ids)
             + lookup(self.token_type_embeddings, segment_ids))
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x, HIDDEN)


    def attend(self, hidden):
        """Logits over the vocabulary with the word-embedding matrix as the (tied) decoder."""
        return self.word_embeddings.attend(hidden)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention, then the output projection. `attention_mask`: a padding mask ([batch, length],
    true for real tokens) or a SegmentMask (packed rows)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool, query_positions=None):
        """`query_positions` ([batch, queries] int): attend from those rows of x only (keys and values are still
        every row); the output [batch, queries, hidden] is then those rows of the full output."""
        config = self.config
        queries = x if query_positions is None else gather_rows(x, query_positions)

        def split_heads(name, inputs):  # [batch, length, hidden] -> [batch, length, heads, head_dim]
            projected = dense(config, config.hidden_size, ("embed", "heads"), name)(inputs)
            projected = projected.reshape(*inputs.shape[:2], config.num_heads, config.head_dim)
            return nn.with_logical_constraint(projected, HEADS)

        query, key, value = split_heads("query", queries), split_heads("key", x), split_heads("value", x)
        if query_positions is not None:
            attention_mask = attention_lib.at_queries(attention_mask, query_positions)
        implementation = attention_lib.attention_implementation(
            config.attention, query, key, attention_mask, training=not deterministic,
            dropout_rate=config.attention_dropout_rate)
        dropout = functools.partial(nn.Dropout(config.attention_dropout_rate), deterministic=deterministic)
        context = attention_lib.dot_product_attention(implementation, query, key, value, attention_mask, dropout)
        context = nn.with_logical_constraint(context, HEADS).reshape(*queries.shape[:2], config.hidden_size)
        return dense(config, config.hidden_size, ("heads", "embed"), "output", bias_names=("norm",))(context)


def _feed_forward(config: BertConfig, x, deterministic: bool):
    """dropout(dense(gelu(dense(x)))), created as `intermediate` and `output` in the calling (layer) module."""
    hidden = dense(config, config.intermediate_size, ("embed", "mlp"), "intermediate")(x)
    hidden = gelu(hidden, approximate=config.hidden_act == "gelu_tanh")
    hidden = nn.with_logical_constraint(hidden, ("batch", "length", "act_mlp"))
    hidden = dense(config, config.hidden_size, ("mlp", "embed"), "output", bias_names=("norm",))(hidden)
    return _dropout(config, hidden, deterministic)


class BertLayer(nn.Module):
    """One post-LN encoder layer: self-attention, add & norm, feed-forward, add & norm."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool, query_positions=None):
        """`query_positions` ([batch, rows] int): compute the output at those rows only (attending over every row):
        [batch, rows, hidden], those rows of the full output when dropout is off."""
        config = self.config
        attended = BertSelfAttention(config, name="attention")(x, attention_mask, deterministic, query_positions)
        residual = x if query_positions is None else gather_rows(x, query_positions)
        x = _layer_norm(config, "attention_layer_norm")(residual + _dropout(config, attended, deterministic))
        x = nn.with_logical_constraint(x, HIDDEN)
        x = _layer_norm(config, "output_layer_norm")(x + _feed_forward(config, x, deterministic))
        return nn.with_logical_constraint(x, HIDDEN)


class _ScannedLayer(BertLayer):
    """BertLayer as an nn.scan body: the output is the carry and, stacked over layers, the hidden states."""

    def __call__(self, x, attention_mask, deterministic: bool):  # pylint: disable=arguments-differ
        x = super().__call__(x, attention_mask, deterministic)
        return x, x


def _run_layers(config: BertConfig, x, attention_mask, deterministic: bool, head_positions=None):
    """Every encoder layer, created in the CALLING compact module; returns (output, [each layer's output]).

    Unrolled: modules `layer_{i}`. Scanned: one nn.scan named `layers` whose parameters carry a leading layer axis
    (logical name "layers"), so the layer is traced and compiled once whatever the depth. `head_positions` ([batch,
    rows] int): the output is the last layer's at those rows only."""
    def remat(layer_class, **kwargs):
        if config.remat == "none":
            return layer_class
        # deterministic (argument 3, counting self) is a Python bool that selects the dropout code: static.
        return nn.remat(layer_class, policy=REMAT_POLICIES[config.remat], static_argnums=(3,), **kwargs)

    if not config.scan_layers:
        layer_class, outputs = remat(BertLayer), []
        for index in range(config.num_layers):
            last = index == config.num_layers - 1
            # The last layer computes the rows the heads read only: at seq 128 with 20 head rows, 84% fewer rows.
            x = layer_class(config, name=f"layer_{index}")(x, attention_mask, deterministic,
                                                           head_positions if last else None)
            outputs.append(x)
        return x, outputs
    # prevent_cse=False: the scan already keeps XLA from merging the recomputation with the forward pass.
    layers = nn.scan(remat(_ScannedLayer, prevent_cse=False), variable_axes={"params": 0},
                     split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast, nn.broadcast),
                     length=config.num_layers, metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS})
    x, stacked = layers(config, name=SCANNED_LAYERS)(x, attention_mask, deterministic)
    if head_positions is not None:
        # One scan body for every layer: the last layer computes every row, and the heads' rows are gathered after
        # it (step_matmul_flops_per_sequence counts it so). A last layer at the head rows would need a second
        # mechanism beside nn.scan to apply the stacked parameters.
        x = gather_rows(x, head_positions)
    return x, [stacked[index] for index in range(config.num_layers)]


def is_unrolled_layer(name: str) -> bool:
    """True for `layer_{i}`, an unrolled (scan_layers=False) encoder layer's parameter name."""
    return name.startswith("layer_") and name[6:].isdigit()


def is_encoder_parameter(name: str) -> bool:
    """True for a top-level parameter name every model shares (embeddings, layers, pooler): BertForPreTraining's
    parameters minus the heads are BertModel's, and BertForSequenceClassification's minus `classifier`."""
    return name in ("embeddings", "pooler", SCANNED_LAYERS) or is_unrolled_layer(name)


def _encode(config: BertConfig, input_ids, input_mask, segment_ids, deterministic: bool, position_ids=None,
            attention_mask=None, head_positions=None):
    """Embeddings and every encoder layer, created as `embeddings` and `layer_{i}` (or `layers`) in the CALLING
    compact module, so that every model owns the same top-level names. Returns (sequence_output, hidden_states (the
    embeddings output and each layer's), the embeddings module). Packed rows give `position_ids` (default
    0..length-1) and `attention_mask` (a SegmentMask; default: input_mask as a padding mask)."""
    if position_ids is None:
        position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    if attention_mask is None:
        attention_mask = input_mask.astype(bool)
    embeddings = BertEmbeddings(config, name="embeddings")
    embedded = embeddings(input_ids, segment_ids, position_ids, deterministic)
    x, layer_outputs = _run_layers(config, embedded, attention_mask, deterministic, head_positions)
    return x, (embedded, *layer_outputs), embeddings


def _pooler(config: BertConfig, cls):
    """tanh(dense([CLS] hidden state)), created as `pooler` in the calling compact module."""
    return nn.tanh(dense(config, config.hidden_size, ("embed", None), "pooler")(cls))


def classifier(config, features: int, name: str) -> nn.Dense:
    """A task head's linear layer of any architecture: `features` outputs with a bias, in float32."""
    return dense(config, features, ("embed", "classes"), name, dtype=jnp.float32)


class BertForPreTraining(nn.Module):
    """Encoder plus pooler, MLM head (tied decoder + output bias) and NSP head.

    Inputs as the original TFRecords: `input_ids`, `input_mask` (1 for real tokens), `segment_ids` ([batch, length])
    and `masked_lm_positions` ([batch, predictions]). Returns `mlm_logits` ([batch, predictions, vocab], float32),
    `nsp_logits` ([batch, 2], float32), `pooled_output`, `sequence_output`, and (when asked) `hidden_states`.
    Packed rows (bert_jax.data.packing) add `position_ids`, `instance_ids` (1..k per instance, 0 for padding:
    attention stays inside an instance) and `nsp_positions` ([batch, k], each instance's [CLS]), which make
    `pooled_output` [batch, k, hidden] and `nsp_logits` [batch, k, 2]. `sequence_output=False` (the train and eval
    steps) returns the heads' outputs only, so unrolled layers compute the last layer at the heads' rows only.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, deterministic: bool = True,
                 output_hidden_states: bool = False, position_ids=None, instance_ids=None,
                 nsp_positions=None, sequence_output: bool = True) -> dict[str, Any]:
        config = self.config
        attention_mask = None if instance_ids is None else SegmentMask(instance_ids.astype(jnp.int32))
        masked_lm_positions = masked_lm_positions.astype(jnp.int32)
        cls_positions = (jnp.zeros((input_ids.shape[0], 1), jnp.int32) if nsp_positions is None
                         else nsp_positions.astype(jnp.int32))
        head_positions = None
        if not sequence_output:
            if output_hidden_states:
                raise ValueError("BertForPreTraining: output_hidden_states=True needs sequence_output=True (with "
                                 "sequence_output=False the last layer computes only the rows the heads read)")
            head_positions = jnp.concatenate([cls_positions, masked_lm_positions], axis=1)
        x, hidden_states, embeddings = _encode(config, input_ids, input_mask, segment_ids, deterministic,
                                               position_ids, attention_mask, head_positions)
        if head_positions is None:
            cls, masked = gather_rows(x, cls_positions), gather_rows(x, masked_lm_positions)
        else:
            cls, masked = x[:, :cls_positions.shape[1]], x[:, cls_positions.shape[1]:]
        pooled = _pooler(config, cls[:, 0] if nsp_positions is None else cls)
        nsp_logits = classifier(config, 2, "nsp_head")(pooled)

        # The transform and the vocab-sized decoder run at the masked positions only.
        masked = dense(config, config.hidden_size, ("embed", None), "mlm_transform")(masked)
        masked = _layer_norm(config, "mlm_layer_norm")(gelu(masked, approximate=config.hidden_act == "gelu_tanh"))
        mlm_bias = self.param("mlm_output_bias", _zeros(("vocab",)), (config.vocab_size,), jnp.float32)
        mlm_logits = embeddings.attend(masked).astype(jnp.float32) + mlm_bias

        outputs = {"mlm_logits": mlm_logits, "nsp_logits": nsp_logits, "pooled_output": pooled}
        if sequence_output:
            outputs["sequence_output"] = x
        if output_hidden_states:
            outputs["hidden_states"] = hidden_states
        return outputs


class BertModel(nn.Module):
    """The encoder and pooler alone, for features: BertForPreTraining's parameters minus its heads.

    Returns `sequence_output` ([batch, length, hidden]), `pooled_output` ([batch, hidden]) and `hidden_states`
    (the embeddings output and each layer's; unused ones cost nothing under jit).
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        x, hidden_states, _ = _encode(self.config, input_ids, input_mask, segment_ids, deterministic)
        return {"sequence_output": x, "pooled_output": _pooler(self.config, x[:, 0]), "hidden_states": hidden_states}


class BertForSequenceClassification(nn.Module):
    """Encoder, pooler, dropout and a linear `classifier` on the pooled [CLS] vector, as in the BERT paper.

    Its parameters are BertModel's plus `classifier` (kernel [hidden, num_classes], initialised as the original
    run_classifier.py: truncated normal, zero bias). Returns `logits` ([batch, num_classes], float32) and
    `pooled_output`.
    """

    config: BertConfig
    num_classes: int

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        config = self.config
        # Only [CLS] is read: the last layer computes that row alone (6 layers at seq 64: 13% of the
        # encoder's matmuls).
        cls_positions = jnp.zeros((input_ids.shape[0], 1), jnp.int32)
        x, _, _ = _encode(config, input_ids, input_mask, segment_ids, deterministic, head_positions=cls_positions)
        pooled = _pooler(config, x[:, 0])
        logits = classifier(config, self.num_classes, "classifier")(_dropout(config, pooled, deterministic))
        return {"logits": logits, "pooled_output": pooled}


class BertForTokenClassification(nn.Module):
    """Encoder, dropout and a linear `classifier` on every token's vector: the BERT paper's tagging setup (NER).

    Its parameters are BertModel's without the pooler, plus `classifier` (kernel [hidden, num_labels]), as
    transformers' BertForTokenClassification. Returns `logits` ([batch, length, num_labels], float32).
    `encoder` (TOKEN_ENCODERS): "tuned", the above; "frozen_last4", the paper's feature-based approach (section 5.3):
    the encoder runs without dropout as a fixed feature extractor, each token's vector is its last four layers'
    hidden states concatenated (last layer first, 4 * hidden wide; the model needs >= 4 layers) behind a
    stop_gradient, and `classifier` (kernel [4 * hidden, num_labels]) is the only part that learns.
    """

    config: BertConfig
    num_labels: int
    encoder: str = "tuned"

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        config = self.config
        frozen = self.encoder == "frozen_last4"
        x, hidden_states, _ = _encode(config, input_ids, input_mask, segment_ids, deterministic or frozen)
        if frozen:
            # stop_gradient: the backward pass ends at the head, never entering the encoder (the speed win); the
            # optimizer keeps the encoder fixed too (bert_jax.optim, frozen=).
            x = jax.lax.stop_gradient(jnp.concatenate([hidden_states[-k] for k in range(1, 5)], -1))
        return {"logits": classifier(config, self.num_labels, "classifier")(_dropout(config, x, deterministic))}


class BertForQuestionAnswering(nn.Module):
    """Encoder and a linear `qa_outputs` layer giving each token a start and an end score: the BERT paper's SQuAD
    setup (no dropout on the scores, as the original run_squad.py and transformers' BertForQuestionAnswering).

    Its parameters are BertModel's without the pooler, plus `qa_outputs` (kernel [hidden, 2]: start, end).
    Returns `logits` ([batch, 2, length], float32: the start scores, then the end scores, so that a cross-entropy
    over the last axis against [batch, 2] positions is the paper's loss), `start_logits` and `end_logits`.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, deterministic: bool = True) -> dict[str, Any]:
        x, _, _ = _encode(self.config, input_ids, input_mask, segment_ids, deterministic)
        scores = classifier(self.config, 2, "qa_outputs")(x)
        return {"logits": jnp.swapaxes(scores, 1, 2), "start_logits": scores[..., 0], "end_logits": scores[..., 1]}
