"""A modern encoder beside BERT: ModernBERT's architecture (Warner et al., 2024) in Flax linen, as transformers'
ModernBertForMaskedLM computes it.

What differs from bert_jax.model's BERT: no position or segment embeddings (rotary embeddings on queries and keys
instead, with one base for global layers and another for local ones); LayerNorm without bias after the embeddings,
before attention and the MLP (pre-LN; the first layer's attention reads the normalised embeddings directly) and
after the last layer; no biases in attention and the MLP; a gated GELU MLP (GeGLU); attention that is local (each
token sees the tokens at most local_attention / 2 rows away) in every layer but every third, which is global; a head
of dense (no bias), GELU and LayerNorm before the decoder tied to the embeddings (with a bias); masked LM only.

Query, key and value (and the MLP's input and gate) are separate kernels here, each sharded over heads (mlp) by
tensor parallelism; transformers keeps each triple (pair) as one matrix, which bert_jax.interop.modern concatenates
and splits. Parameters carry the logical axis names of bert_jax.model, so the mesh rules are BERT's. Task heads
(ModernFor{Sequence,Token}Classification, ModernForQuestionAnswering) are transformers' ModernBert*For* classes.
"""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import attention as attention_lib
from bert_jax.model import (HEADS, HIDDEN, REMAT_POLICIES, SCANNED_LAYERS, EncoderShape,
                            check_compute_choices, check_sizes, classifier, config_fields, dense, gather_rows, gelu,
                            is_unrolled_layer, kernel_init, layer_norm, lookup)


@dataclasses.dataclass(frozen=True)
class ModernConfig(EncoderShape):
    """Architecture hyper-parameters (ModernBERT-base's by default); transformers' ModernBertConfig names in the
    comments where they differ."""

    vocab_size: int = 50368
    hidden_size: int = 768
    num_layers: int = 22  # num_hidden_layers
    num_heads: int = 12  # num_attention_heads
    intermediate_size: int = 1152  # the GeGLU's width: its input kernel is [hidden, 2 * intermediate_size]
    max_position_embeddings: int = 8192  # the longest sequence: rotary embeddings have no table, this is a check
    local_attention: int = 128  # a local layer's window: each token sees the rows at most half of it away
    global_attn_every_n_layers: int = 3  # layers 0, n, 2n, ... attend globally
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dropout_rate: float = 0.0  # embedding_dropout and mlp_dropout
    attention_dropout_rate: float = 0.0  # attention_dropout
    initializer_range: float = 0.02
    dtype: str = "float32"
    attention: str = "auto"  # one of bert_jax.attention.ATTENTION_IMPLEMENTATIONS
    remat: str = "none"  # one of bert_jax.model.REMAT_POLICIES
    classifier_pooling: str = "cls"  # a sequence classifier's input: the [CLS] row ("cls") or the rows' mean ("mean")
    # Layer 0, then the layers in groups of global_attn_every_n_layers (local ones, then a global one: one nn.scan body
    # however deep, so TPU compiles do not grow with depth), then the rest unrolled (see encode).
    scan_layers: bool = False

    @classmethod
    def from_config(cls, model_config) -> "ModernConfig":
        """From `config.model` (a ConfigDict with arch="modern", or any mapping)."""
        return cls(**config_fields(cls, model_config, ignored=("arch",))).validate()

    def validate(self) -> "ModernConfig":
        """Raises ValueError("FIELD=VALUE: problem") for the first bad field."""
        def fail(field, problem):
            raise ValueError(f"{field}={getattr(self, field)!r}: {problem}")

        check_sizes(self, ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                           "max_position_embeddings", "local_attention", "global_attn_every_n_layers"), fail)
        if (self.hidden_size // self.num_heads) % 2:
            fail("num_heads", f"rotary embeddings need an even head dim, not {self.hidden_size // self.num_heads}")
        if self.local_attention % 2:
            fail("local_attention", "must be even (the window is half of it on each side)")
        for field in ("global_rope_theta", "local_rope_theta", "norm_eps"):
            if getattr(self, field) <= 0:
                fail(field, "must be positive")
        check_compute_choices(self, fail)
        if self.classifier_pooling not in ("cls", "mean"):
            fail("classifier_pooling", "choose 'cls' or 'mean'")
        return self

    def is_global(self, layer: int) -> bool:
        return layer % self.global_attn_every_n_layers == 0

    def window(self, layer: int) -> int | None:
        """Layer `layer`'s attention window (rows each side; None: global)."""
        return None if self.is_global(layer) else self.local_attention // 2

    @property
    def scanned_groups(self) -> int:
        """How many groups of global_attn_every_n_layers layers (1..n, n+1..2n, ...) scan_layers stacks."""
        return (self.num_layers - 1) // self.global_attn_every_n_layers if self.scan_layers else 0


def _dense(config: ModernConfig, features: int, names, name: str) -> nn.Dense:
    return dense(config, features, names, name, use_bias=False)  # no biases in attention and the MLP


def _layer_norm(config: ModernConfig, name: str) -> nn.LayerNorm:
    return layer_norm(config, name, config.norm_eps, use_bias=False)


def rotation(position_ids, theta: float, head_dim: int):
    """(cos, sin) of the rotary embedding at `position_ids` ([batch, length]), [batch, length, 1, head_dim] float32:
    pair (i, i + head_dim / 2) turns by position * theta^(-2i / head_dim). Made once per rotary base for all the
    layers that use it, as transformers does."""
    half = head_dim // 2
    inverse_frequencies = 1.0 / (theta ** (jnp.arange(0, half, dtype=jnp.float32) * 2 / head_dim))
    angles = position_ids.astype(jnp.float32)[..., None] * inverse_frequencies  # [batch, length, half]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    return jnp.cos(angles), jnp.sin(angles)


def rotary(x, cos_sin):
    """x ([batch, length, heads, head_dim]) rotated by `cos_sin` (rotation's), in float32 (as transformers)."""
    cos, sin = cos_sin
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


class ModernAttention(nn.Module):
    """Self-attention with rotary queries and keys (`cos_sin`: rotation's), global or local (`window` rows each side),
    no biases."""

    config: ModernConfig
    window: int | None

    @nn.compact
    def __call__(self, x, attention_mask, cos_sin, deterministic: bool):
        config = self.config

        def split_heads(name):  # [batch, length, hidden] -> [batch, length, heads, head_dim]
            projected = _dense(config, config.hidden_size, ("embed", "heads"), name)(x)
            projected = projected.reshape(*x.shape[:2], config.num_heads, config.head_dim)
            return nn.with_logical_constraint(projected, HEADS)

        query, key = rotary(split_heads("query"), cos_sin), rotary(split_heads("key"), cos_sin)
        value = split_heads("value")
        implementation = attention_lib.attention_implementation(
            config.attention, query, key, attention_mask, training=not deterministic,
            dropout_rate=config.attention_dropout_rate)
        dropout = nn.Dropout(config.attention_dropout_rate)
        context = attention_lib.dot_product_attention(
            implementation, query, key, value, attention_mask,
            lambda probs: dropout(probs, deterministic=deterministic), window=self.window)
        context = nn.with_logical_constraint(context, HEADS).reshape(*x.shape[:2], config.hidden_size)
        output = _dense(config, config.hidden_size, ("heads", "embed"), "output")(context)
        return nn.Dropout(config.attention_dropout_rate)(output, deterministic=deterministic)


class ModernLayer(nn.Module):
    """Pre-LN: x + attention(norm(x)), then x + GeGLU(norm(x)). Layer 0 has no attention norm (the embeddings were
    just normalised), as in ModernBERT. `cos_sin`: the rotation of this layer's rotary base."""

    config: ModernConfig
    index: int

    @nn.compact
    def __call__(self, x, attention_mask, cos_sin, deterministic: bool):
        config = self.config
        normed = x if self.index == 0 else _layer_norm(config, "attention_norm")(x)
        x = x + ModernAttention(config, config.window(self.index), name="attention")(
            normed, attention_mask, cos_sin, deterministic)
        x = nn.with_logical_constraint(x, HIDDEN)
        normed = _layer_norm(config, "mlp_norm")(x)
        # GeGLU: gelu(input) * gate, two kernels so that tensor parallelism splits both the same way over "mlp".
        hidden = (gelu(_dense(config, config.intermediate_size, ("embed", "mlp"), "mlp_input")(normed))
                  * _dense(config, config.intermediate_size, ("embed", "mlp"), "mlp_gate")(normed))
        hidden = nn.with_logical_constraint(hidden, ("batch", "length", "act_mlp"))
        hidden = nn.Dropout(config.dropout_rate)(hidden, deterministic=deterministic)
        x = x + _dense(config, config.hidden_size, ("mlp", "embed"), "mlp_output")(hidden)
        return nn.with_logical_constraint(x, HIDDEN)


def encode(config: ModernConfig, input_ids, input_mask, deterministic: bool, position_ids=None,
           attention_mask=None):
    """Embeddings, every layer and the final norm, created as `embeddings`, `embeddings_norm`, `layer_{i}` (with
    scan_layers, the grouped layers as one nn.scan named `layers`: see ModernConfig.scan_layers) and `final_norm` in
    the CALLING compact module. Returns (sequence_output, the word-embedding module).
    Packed rows give `position_ids` (default 0..length-1) and `attention_mask` (a SegmentMask; default: input_mask
    as a padding mask)."""
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
                         f"{config.max_position_embeddings}")
    if position_ids is None:
        position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)
    if attention_mask is None:
        attention_mask = input_mask.astype(bool)
    embeddings = nn.Embed(config.vocab_size, config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                          embedding_init=kernel_init(config, ("vocab", "embed")), name="embeddings")
    x = lookup(embeddings, input_ids, ("vocab", None))
    x = nn.Dropout(config.dropout_rate)(_layer_norm(config, "embeddings_norm")(x), deterministic=deterministic)
    rotations = (rotation(position_ids, config.global_rope_theta, config.head_dim),
                 rotation(position_ids, config.local_rope_theta, config.head_dim))
    layer_class = _remat(config, ModernLayer)
    groups, every = config.scanned_groups, config.global_attn_every_n_layers
    for index in range(config.num_layers):
        if index == 1 and groups:
            scan = nn.scan(_remat(config, _ScannedGroup, prevent_cse=False), variable_axes={"params": 0},
                           split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,) * 3,
                           length=groups, metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS})
            x, _ = scan(config, name=SCANNED_LAYERS)(x, attention_mask, rotations, deterministic)
        if 1 <= index <= groups * every:
            continue  # in the scanned groups
        x = layer_class(config, index, name=f"layer_{index}")(
            x, attention_mask, rotations[not config.is_global(index)], deterministic)
    return _layer_norm(config, "final_norm")(x), embeddings


def _remat(config: ModernConfig, module_class, **kwargs):
    # deterministic (argument 4, counting self) is a Python bool that selects the dropout code: static.
    if config.remat == "none":
        return module_class
    return nn.remat(module_class, policy=REMAT_POLICIES[config.remat], static_argnums=(4,), **kwargs)


class _ScannedGroup(nn.Module):
    """Layers 1..n of a group of n = global_attn_every_n_layers (n - 1 local layers, then a global one) as an
    nn.scan body: every group has the same windows and rotary bases, so one body serves them all. Its members are
    `member_{j}`; `rotations`: (global, local) rotation()s."""

    config: ModernConfig

    @nn.compact
    def __call__(self, x, attention_mask, rotations, deterministic: bool):
        config = self.config
        for member in range(config.global_attn_every_n_layers):
            index = member + 1  # the window and rotary base of layer k * n + member + 1, whatever k
            x = ModernLayer(config, index, name=f"member_{member}")(
                x, attention_mask, rotations[not config.is_global(index)], deterministic)
        return x, None


def scanned_layer_names(config: ModernConfig) -> dict[int, tuple[int, str]]:
    """Layer index -> (group, member name) of the layers scan_layers stacks under SCANNED_LAYERS."""
    every = config.global_attn_every_n_layers
    return {1 + group * every + member: (group, f"member_{member}")
            for group in range(config.scanned_groups) for member in range(every)}


def unstack_layers(params: dict, config: ModernConfig) -> dict:
    """Scanned parameters (layer_0, SCANNED_LAYERS, the rest) as unrolled ones (layer_0 .. layer_{L-1})."""
    if SCANNED_LAYERS not in params:
        return params
    stacked = params[SCANNED_LAYERS]
    layers = {f"layer_{index}": jax.tree.map(lambda leaf, group=group: leaf[group], stacked[member])
              for index, (group, member) in scanned_layer_names(config).items()}
    return {**{name: value for name, value in params.items() if name != SCANNED_LAYERS}, **layers}


def stack_layers(params: dict, config: ModernConfig) -> dict:
    """Unrolled parameters in scan_layers' layout (unstack_layers' inverse); as they are without scan_layers."""
    names = scanned_layer_names(config)
    if not names:
        return params
    every = config.global_attn_every_n_layers
    stacked = {f"member_{member}": jax.tree.map(
        lambda *leaves: jnp.stack(leaves) if isinstance(leaves[0], jax.Array) else np.stack(leaves),
        *[params[f"layer_{1 + group * every + member}"] for group in range(config.scanned_groups)])
        for member in range(every)}
    rest = {name: value for name, value in params.items() if not (is_unrolled_layer(name) and int(name[6:]) in names)}
    return {**rest, SCANNED_LAYERS: stacked}


def prediction_head(config: ModernConfig, x):
    """transformers' ModernBertPredictionHead: dense (no bias), GELU, LayerNorm, created as `mlm_transform` and
    `mlm_layer_norm` in the calling compact module. The masked LM and every task model have it under these names, so
    fine-tuning starts it from the pretrained one, as transformers' ModernBert*For* classes do."""
    x = _dense(config, config.hidden_size, ("embed", None), "mlm_transform")(x)
    return _layer_norm(config, "mlm_layer_norm")(gelu(x))


class ModernForMaskedLM(nn.Module):
    """The encoder and the masked-LM head: dense (no bias), GELU, LayerNorm, then the decoder tied to the word
    embeddings plus `mlm_output_bias`, at `masked_lm_positions` ([batch, predictions]) or, without them, at every
    row. Returns `mlm_logits` (float32) and `sequence_output`. `segment_ids` is accepted and ignored (no segment
    embeddings), and so are `nsp_positions` (no NSP head): pretraining batches feed it as they are.
    `sequence_output=False` (the train and eval steps) leaves `sequence_output` out."""

    config: ModernConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, masked_lm_positions=None, deterministic: bool = True,
                 position_ids=None, instance_ids=None, nsp_positions=None,
                 sequence_output: bool = True) -> dict[str, Any]:
        del segment_ids, nsp_positions
        config = self.config
        attention_mask = None if instance_ids is None else attention_lib.SegmentMask(instance_ids.astype(jnp.int32))
        x, embeddings = encode(config, input_ids, input_mask, deterministic, position_ids, attention_mask)
        rows = prediction_head(config, x if masked_lm_positions is None else gather_rows(x, masked_lm_positions))
        bias = self.param("mlm_output_bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), ("vocab",)),
                          (config.vocab_size,), jnp.float32)
        logits = embeddings.attend(rows).astype(jnp.float32) + bias
        return {"mlm_logits": logits, "sequence_output": x} if sequence_output else {"mlm_logits": logits}


def _classifier(config: ModernConfig, features: int, x, deterministic: bool):
    """Dropout (dropout_rate), then a linear `classifier` with a bias, in float32: transformers' drop and classifier."""
    x = nn.Dropout(config.dropout_rate)(x, deterministic=deterministic)
    return classifier(config, features, "classifier")(x)


class ModernForSequenceClassification(nn.Module):
    """transformers' ModernBertForSequenceClassification: the [CLS] row (classifier_pooling="cls") or the mean of
    the real rows ("mean"), the prediction head, dropout and `classifier`. Returns `logits` ([batch, num_classes],
    float32) and `pooled_output` (the head's output). `segment_ids` is accepted and ignored."""

    config: ModernConfig
    num_classes: int

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, deterministic: bool = True) -> dict[str, Any]:
        del segment_ids
        config = self.config
        x, _ = encode(config, input_ids, input_mask, deterministic)
        if config.classifier_pooling == "mean":
            weights = input_mask.astype(jnp.float32)[..., None]
            pooled = ((x.astype(jnp.float32) * weights).sum(1) / weights.sum(1)).astype(x.dtype)
        else:
            pooled = x[:, 0]
        pooled = prediction_head(config, pooled)
        return {"logits": _classifier(config, self.num_classes, pooled, deterministic), "pooled_output": pooled}


class ModernForTokenClassification(nn.Module):
    """transformers' ModernBertForTokenClassification: the prediction head, dropout and `classifier` at every row.
    Returns `logits` ([batch, length, num_labels], float32)."""

    config: ModernConfig
    num_labels: int

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, deterministic: bool = True) -> dict[str, Any]:
        del segment_ids
        x, _ = encode(self.config, input_ids, input_mask, deterministic)
        return {"logits": _classifier(self.config, self.num_labels, prediction_head(self.config, x), deterministic)}


class ModernForQuestionAnswering(nn.Module):
    """transformers' ModernBertForQuestionAnswering: the prediction head, dropout and a 2-wide `classifier` (start,
    end) at every row. Returns `logits` ([batch, 2, length], float32, as bert_jax.model.BertForQuestionAnswering's),
    `start_logits` and `end_logits`."""

    config: ModernConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids=None, deterministic: bool = True) -> dict[str, Any]:
        del segment_ids
        x, _ = encode(self.config, input_ids, input_mask, deterministic)
        scores = _classifier(self.config, 2, prediction_head(self.config, x), deterministic)
        return {"logits": jnp.swapaxes(scores, 1, 2), "start_logits": scores[..., 0], "end_logits": scores[..., 1]}


# The top-level parameters a task model takes from a pretrained one: all but the task's `classifier` (and the masked
# LM's decoder bias, which task models do not have).
PRETRAINED_PARAMETERS = ("embeddings", "embeddings_norm", "final_norm", "mlm_transform", "mlm_layer_norm")


def is_pretrained_parameter(name: str) -> bool:
    """bert_jax.model.is_encoder_parameter's counterpart: True for the parameters fine-tuning reads from
    --config.init."""
    return name in PRETRAINED_PARAMETERS or name == SCANNED_LAYERS or is_unrolled_layer(name)


def modern_config(**fields) -> ModernConfig:
    return ModernConfig(**fields).validate()
