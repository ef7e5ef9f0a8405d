"""The BERT encoder with masked-LM and next-sentence-prediction heads (Flax linen), and its downstream forms.

The architecture follows the original google-research/bert `modeling.py`: post-LayerNorm encoder layers, learned
position embeddings, a tanh pooler on [CLS], an MLM head whose decoder is tied to the word embeddings and that is
evaluated only at `masked_lm_positions`, and a 2-way NSP head. Every parameter carries logical axis names, and
activations are constrained at layer boundaries, so the same module runs unsharded or over any
data/FSDP/tensor mesh (the logical-to-mesh rules live in the config, see `bert_jax.sharding`).

BertModel (features) and BertForSequenceClassification (fine-tuning) build the encoder with the same helper and
hence the same parameter names (`embeddings`, `layer_{i}`, `pooler`), so pretrained parameters load unchanged.
"""

import contextlib
import dataclasses
from typing import Any

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import cpu_gemm

# Logical axis names used below. Parameters: "vocab", "embed", "heads", "mlp", "position", "segment", "classes";
# "norm" marks small hidden-sized vectors (LayerNorm, biases on the residual stream) that are never worth sharding.
# Activations: "batch", "length", "act_embed", "act_heads", "act_mlp".

HIDDEN_ACTIVATIONS = ("gelu_tanh", "gelu")
COMPUTE_DTYPES = ("float32", "bfloat16")
# "auto": the platform's fused kernel (cuDNN on GPU, Pallas splash on TPU), except in training with attention dropout,
# which only "reference" implements; on CPU the plain einsum/softmax "reference" path, which XLA:CPU runs fastest.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "reference")
# Matmuls: "xla" (XLA's dots), "blas" (bert_jax.cpu_gemm, a BLAS sgemm custom call: XLA:CPU, float32, one device)
# or "auto" (blas wherever it can run, except the encoder's matmuls under remat="matmuls"; XLA's dots elsewhere).
MATMUL_IMPLEMENTATIONS = ("auto", "xla", "blas")
# What a rematerialised layer keeps for the backward pass: "matmuls" keeps the outputs of the weight matmuls
# (no batch dimensions) and recomputes the rest, including the [batch, heads, length, length] attention scores;
# "full" keeps only the layer's input.
REMAT_POLICIES = {"none": None, "matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "full": jax.checkpoint_policies.nothing_saveable}
SCANNED_LAYERS = "layers"  # parameter name (and logical axis name of the leading axis) of scanned layers


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
    # "auto" | "xla" | "cudnn" | "pallas" | "reference". No fused kernel implements attention dropout: "auto" uses
    # one only where attention dropout is off (attention_dropout_rate=0, or deterministic evaluation/inference) and
    # the exact reference path otherwise; naming a fused kernel needs attention_dropout_rate=0. An unsupported
    # kernel (wrong platform, dtype or shape) falls back to "xla" with the reason logged.
    attention: str = "auto"
    remat: str = "none"  # "none" | "matmuls" | "full": activation rematerialisation of each encoder layer
    scan_layers: bool = False  # one nn.scan over the layers: parameters under "layers" with a leading layer axis
    matmul: str = "auto"  # one of MATMUL_IMPLEMENTATIONS; see matmul_implementation

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
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            fail("attention", f"choose one of {ATTENTION_IMPLEMENTATIONS}")
        if self.attention in ("xla", "cudnn", "pallas") and self.attention_dropout_rate > 0:
            fail("attention", f"the fused kernels have no attention dropout, but model.attention_dropout_rate="
                              f"{self.attention_dropout_rate}. Fix: set --config.model.attention_dropout_rate=0.0 "
                              "(fused kernels in training too), or --config.model.attention=auto (fused kernels "
                              "where dropout is off, the reference path with dropout in training)")
        if self.remat not in REMAT_POLICIES:
            fail("remat", f"choose one of {tuple(REMAT_POLICIES)}")
        if not isinstance(self.scan_layers, bool):
            fail("scan_layers", "must be True or False")
        if self.matmul not in MATMUL_IMPLEMENTATIONS:
            fail("matmul", f"choose one of {MATMUL_IMPLEMENTATIONS}")
        if self.matmul == "blas" and self.remat == "matmuls":
            fail("matmul", "the remat policy 'matmuls' saves XLA dots, which 'blas' replaces (it would save "
                           "nothing). Fix: --config.model.matmul=auto (XLA's dots under this policy) or "
                           "--config.model.remat=full")
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


def head_cls_rows(nsp_positions) -> int:
    """[CLS] rows per row of the batch that the NSP head reads: 1, or (packed rows) nsp_positions' width."""
    return 1 if nsp_positions is None else nsp_positions.shape[1]


def step_matmul_flops_per_sequence(config: BertConfig, seq_length: int, max_predictions: int,
                                   cls_rows: int = 1) -> float:
    """The matmul FLOPs the pretraining train step executes for one row of `seq_length` tokens.

    model_flops_per_sequence counts every token through every layer, the standard model-FLOPs figure. The train
    step asks for the heads only (BertForPreTraining with sequence_output=False), so the last layer (unrolled or
    scanned) computes just the rows the heads read, the `cls_rows` [CLS] positions (head_cls_rows) and
    the masked positions: each other row skips, forward and backward, its query and output projections,
    feed-forward and attention over seq_length keys.
    """
    flops = model_flops_per_sequence(config, seq_length, max_predictions)
    h = config.hidden_size
    skipped_rows = max(seq_length - cls_rows - max_predictions, 0)
    return flops - skipped_rows * 12 * h * (h + config.intermediate_size + seq_length)


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
                    kernel_init=_kernel_init(config, names), bias_init=_zeros(names[-1:]),
                    dot_general=_dot_general(config), name=name)


def _layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
    # Flax computes the statistics in float32 even for bfloat16 inputs.
    return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=config.compute_dtype, param_dtype=jnp.float32,
                        scale_init=_ones(("norm",)), bias_init=_zeros(("norm",)), name=name)


def gelu(x, approximate: bool = False):
    """GELU: the tanh approximation (hidden_act "gelu_tanh", the original BERT code's), or the exact one (hidden_act
    "gelu": transformers' "gelu", which most HuggingFace BERT checkpoints name) as x * 0.5 * (1 + erf(x / sqrt(2))).

    For the exact one, `jax.nn.gelu` computes 0.5 * x * erfc(-x / sqrt(2)), which XLA:CPU evaluates at about three
    times the cost of erf: on [8, 128, 3072] float32 (one BERT-base layer's FFN at batch 8), forward 3.3 ms against
    1.2 ms, forward and gradient 7.6 ms against 4.1 ms. Both forms agree with transformers' gelu to 1e-6 on [-12, 12],
    values and gradients (tests/test_export.py); erfc is more accurate only where the output is below 1e-7.
    """
    if approximate:
        return jax.nn.gelu(x, approximate=True)
    x = jnp.asarray(x)
    sqrt_half = np.sqrt(0.5).astype(x.dtype)
    return x * (0.5 * (1.0 + jax.lax.erf(x * sqrt_half)))


def _activation(config: BertConfig, x):
    return gelu(x, approximate=config.hidden_act == "gelu_tanh")


def _constrain(x, names):
    return nn.with_logical_constraint(x, names)


DROPOUT_BITS = 16  # random bits per dropout decision: four decisions per threefry2x32 call (two 32-bit words)
_THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def threefry2x32(key0, key1, x0, x1):
    """Threefry-2x32 (20 rounds), the hash behind jax.random's default keys, written out with jnp uint32 operations.

    Equal to `jax.extend.random.threefry_2x32` (tests/test_model_perf.py checks it); written out because JAX lowers that
    primitive on CPU as a rolled loop, which XLA cannot fuse with its consumers, so every round materialised whole
    mask-sized arrays. Unrolled, the hash and the comparison that makes the dropout mask are one elementwise kernel.
    """
    def rotate_left(value, distance):
        return (value << jnp.uint32(distance)) | (value >> jnp.uint32(32 - distance))

    keys = (key0, key1, key0 ^ key1 ^ jnp.uint32(0x1BD11BDA))
    x0, x1 = x0 + keys[0], x1 + keys[1]
    for block in range(5):
        for distance in _THREEFRY_ROTATIONS[block % 2]:
            x0 = x0 + x1
            x1 = rotate_left(x1, distance) ^ x0
        x0 = x0 + keys[(block + 1) % 3]
        x1 = x1 + keys[(block + 2) % 3] + jnp.uint32(block + 1)
    return x0, x1


def _dropout_halves(rng, shape, rows=None):
    """Uniform uint16 values of `shape` (last axis a multiple of 4): one threefry call per four of them.

    Element [..., 4j + i] takes 16-bit half i of the two words threefry(key, (0, c)) returns for counter c, the
    row-major index of [..., j]. Counters come from iotas in the mask's own shape (no flat array), so under a mesh
    each device hashes only its shard, and the values do not depend on the sharding. `rows`: see dropout_keep_mask.
    """
    key0, key1 = (word.astype(jnp.uint32) for word in jax.random.key_data(rng).reshape(-1)[:2])
    quarter = (*shape[:-1], shape[-1] // 4)
    counter = jnp.zeros(quarter, jnp.uint32)
    stride = 1
    for axis in reversed(range(len(quarter))):
        if rows is not None and axis == rows[0]:
            index, size = _row_index(rows, len(quarter)).astype(jnp.uint32), rows[2]
        else:
            index, size = jax.lax.broadcasted_iota(jnp.uint32, quarter, axis), quarter[axis]
        counter = counter + index * jnp.uint32(stride)
        stride *= size
    words = threefry2x32(key0, key1, jnp.zeros(quarter, jnp.uint32), counter)
    halves = [jax.lax.bitcast_convert_type(word, jnp.uint16) for word in words]  # each [..., n/4, 2]
    return jnp.concatenate(halves, axis=-1).reshape(shape)


def _row_index(rows, ndim: int):
    """The `rows` positions of dropout_keep_mask with trailing unit axes: broadcastable to an ndim-array."""
    axis, positions, _ = rows
    return positions.reshape(*positions.shape, *(1,) * (ndim - axis - 1))


def dropout_keep_mask(rng, shape, rate: float, rows=None):
    """A boolean keep mask with P(keep) = 1 - round(rate * 2^16) / 2^16, and that probability (a Python float).

    jax.random.bernoulli hashes a 32-bit threefry word per element and converts it to a float; on XLA:CPU that was
    about a quarter of a BERT-base training step. Here each threefry call (two words) decides four elements, 16 bits
    each, and the hash is fused with the comparison (see `threefry2x32`). The rate is realised to 1/65536
    (0.1 -> 0.100006), and callers scale by the realised keep probability, so dropout stays exactly unbiased.
    Keys of another PRNG implementation, or a last axis that is not a multiple of 4, use jax.random.bits.

    `rows` = (axis, positions, size): the mask is some rows of a larger one, whose `axis` (not the last) has `size`
    entries, of which element i along `axis` is row `positions[..., i]` (an integer array of shape[:axis + 1], unit
    axes allowed). The values equal those of the larger mask at those rows, so a layer evaluated at a few positions
    drops exactly what it drops evaluated at all of them (the hash is per element: nothing else is computed).
    """
    threshold = int(round(rate * 2 ** DROPOUT_BITS))
    keep_probability = 1.0 - threshold / 2 ** DROPOUT_BITS
    if rows is not None and not 0 <= rows[0] < len(shape) - 1:
        raise ValueError(f"dropout_keep_mask: rows axis {rows[0]} must index one of the leading axes of {shape}")
    full_shape = shape if rows is None else (*shape[:rows[0]], rows[2], *shape[rows[0] + 1:])
    size = int(np.prod(full_shape))
    if size and shape[-1] % 4 == 0 and size // 4 < 2 ** 32 and jax.random.key_data(rng).shape == (2,):
        halves = _dropout_halves(rng, shape, rows)
    else:
        halves = (jax.random.bits(rng, full_shape, jnp.uint32) >> 16).astype(jnp.uint16)
        if rows is not None:
            index = jnp.broadcast_to(_row_index(rows, len(shape)), shape).astype(jnp.int32)
            halves = jnp.take_along_axis(halves, index, axis=rows[0])
    return halves >= threshold, keep_probability


class Dropout(nn.Module):
    """Inverted dropout (as flax.linen.Dropout, 'dropout' RNG stream) with a cheaper random mask: dropout_keep_mask.

    `rows`: x holds some rows of the activation the layer would drop at all positions (dropout_keep_mask's `rows`).
    """

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool, rows=None):
        if deterministic or self.rate == 0.0:
            return x
        if self.rate >= 1.0:
            return jnp.zeros_like(x)
        keep, keep_probability = dropout_keep_mask(self.make_rng("dropout"), x.shape, self.rate, rows)
        return jnp.where(keep, x * jnp.asarray(1.0 / keep_probability, x.dtype), jnp.zeros((), x.dtype))


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
        self.dropout = Dropout(config.dropout_rate)

    def __call__(self, input_ids, segment_ids, position_ids, deterministic: bool):
        x = (self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
             + self.token_type_embeddings(segment_ids))
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        return _constrain(x, ("batch", "length", "act_embed"))

    def attend(self, hidden):
        """Logits over the vocabulary with the word-embedding matrix as the (tied) decoder."""
        if matmul_implementation(self.config, decoder=True) == "blas":
            return cpu_gemm.dot_general(hidden, self.word_embeddings.embedding, (((hidden.ndim - 1,), (1,)), ((), ())))
        return self.word_embeddings.attend(hidden)


_LOGGED_NOTES = set()
_TARGET_PLATFORM = []  # a stack; see compiling_for


def target_platform() -> str:
    """The platform the model is being traced for: jax.default_backend(), unless inside `compiling_for`."""
    return _TARGET_PLATFORM[-1] if _TARGET_PLATFORM else jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str):
    """Trace for `platform` ("cpu", "gpu", "tpu") rather than this process's backend: the attention kernel is then
    chosen as on that platform. For ahead-of-time compilation (bert_jax.aot compiles for TPU on a CPU host)."""
    _TARGET_PLATFORM.append(platform)
    try:
        yield
    finally:
        _TARGET_PLATFORM.pop()


def _log_note(topic: str, message: str) -> None:
    # Traced once per compilation, and every layer traces this: log each distinct note once per process.
    if (topic, message) not in _LOGGED_NOTES:
        _LOGGED_NOTES.add((topic, message))
        logging.info("%s: %s", topic, message)


def _blas_unsupported(config: BertConfig) -> str | None:
    if target_platform() != "cpu":
        return f"the BLAS matmul runs on XLA:CPU only, and the model is traced for {target_platform()}"
    if config.dtype != "float32":
        return f"the BLAS matmul multiplies float32 only, not model.dtype={config.dtype!r}"
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and mesh.size > 1:
        return f"the BLAS matmul runs on one device, and the mesh has {mesh.size}"
    return cpu_gemm.unavailable_reason()


def matmul_implementation(config: BertConfig, decoder: bool = False) -> str:
    """"blas" or "xla" for this trace: config.matmul resolved for the encoder's matmuls or (`decoder`) the MLM
    head's vocab-sized decoder.

    "blas" (bert_jax.cpu_gemm's sgemm custom call) needs XLA:CPU, float32, a mesh of one device (or none) and a
    custom call that could be built; naming "blas" where it cannot run raises a ValueError that says why (and
    BertConfig.validate refuses it with remat="matmuls"). "auto" takes it for every matmul where it can run, except
    the encoder's under remat="matmuls" (that policy saves XLA's dots): XLA:CPU's oneDNN dots ran the decoder's
    [160, 768] x [768, 30522] at about half the BLAS rate and the encoder's shapes at 90-99% of it, and a weight
    gradient through them needs its operand transposed in memory first (the sgemm reads it transposed in place);
    the BERT-base fp32 step on the 2-core benchmark machine was about 0.2 s faster with every matmul on the BLAS.
    """
    if config.matmul == "xla" or (config.matmul == "auto" and not decoder and config.remat == "matmuls"):
        return "xla"
    reason = _blas_unsupported(config)
    if reason is None:
        return "blas"
    if config.matmul == "blas":
        raise ValueError(f"--config.model.matmul='blas' cannot run here: {reason}. Fix: --config.model.matmul=auto "
                         "(XLA's dots wherever the BLAS matmul cannot run) or xla")
    if target_platform() == "cpu":
        _log_note("matmul", f"model.matmul='auto': XLA's dots because {reason}")
    return "xla"


def _dot_general(config: BertConfig):
    """The dot_general for the model's Dense layers: the BLAS matmul's, or None (flax's default, lax.dot_general)."""
    return cpu_gemm.dot_general if matmul_implementation(config) == "blas" else None


@flax.struct.dataclass
class SegmentMask:
    """Attention inside segments: a token attends exactly to the tokens with its own id (`ids`: [batch, length]).

    Packed rows pass their instance ids this way rather than as a [batch, 1, length, length] boolean mask, so that
    kernels with native segment ids (Pallas splash on TPU) can take them; the other paths expand it to the
    block-diagonal mask with `_full_attention_mask`. Padding (id 0) forms a block of its own, so a real token never
    sees padding while no query row is fully masked (fused kernels may return NaN for one); padding outputs are
    never read.
    """

    ids: jax.Array


def _is_padding_mask(attention_mask) -> bool:
    return not isinstance(attention_mask, SegmentMask) and attention_mask.ndim == 2


def _full_attention_mask(attention_mask):
    """A boolean [batch, 1 or heads, query, key] mask from [batch, key] (padding), [batch, query, key] masks or a
    SegmentMask."""
    if isinstance(attention_mask, SegmentMask):
        ids = attention_mask.ids
        return (ids[:, :, None] == ids[:, None, :])[:, None, :, :]
    attention_mask = attention_mask.astype(bool)
    if attention_mask.ndim == 2:
        return attention_mask[:, None, None, :]
    if attention_mask.ndim == 3:
        return attention_mask[:, None, :, :]
    return attention_mask


def _cudnn_unsupported(query, attention_mask, training: bool) -> str | None:
    """Why cuDNN flash attention cannot run this call (None if it can), from its documented constraints."""
    if target_platform() != "gpu":
        return f"cuDNN flash attention needs a GPU; the backend is {target_platform()}"
    if query.dtype not in (jnp.bfloat16, jnp.float16):
        return f"cuDNN flash attention needs bfloat16 or float16 inputs, not {query.dtype} (set model.dtype)"
    head_dim, length = query.shape[-1], query.shape[1]
    capability = getattr(jax.devices()[0], "compute_capability", "0.0")
    max_head_dim = 256 if tuple(int(v) for v in capability.split(".")[:2]) >= (9, 0) else 128
    if head_dim % 8 or head_dim > max_head_dim:
        return f"cuDNN flash attention needs a head dim that is a multiple of 8 and <= {max_head_dim}, not {head_dim}"
    if training and not _is_padding_mask(attention_mask) and length % 2:
        return f"cuDNN flash attention with a full mask needs an even sequence length in training, not {length}"
    return None


def _pallas_unsupported(query, attention_mask) -> str | None:
    if target_platform() != "tpu":
        return f"the Pallas splash-attention kernel needs a TPU; the backend is {target_platform()}"
    if not (isinstance(attention_mask, SegmentMask) or _is_padding_mask(attention_mask)):
        return ("the Pallas splash-attention kernel takes a padding mask ([batch, length]) or a SegmentMask (packed "
                "rows) as segment ids, not a full [batch, ..., query, key] mask")
    if query.shape[1] % 128:
        return f"the Pallas splash-attention kernel needs a sequence length that is a multiple of 128, not " \
               f"{query.shape[1]}"
    return None


def attention_implementation(config: BertConfig, query, attention_mask, deterministic: bool) -> str:
    """The attention path one call takes: config.attention resolved against dropout, platform, dtype and shapes.

    Runs at trace time. "auto" takes the reference path when attention dropout is active (no fused kernel has it),
    else cuDNN on GPU / Pallas splash on TPU where supported (else "xla"), and "reference" on CPU; an unsupported
    named kernel falls back to "xla" with the reason logged.
    """
    training_dropout = config.attention_dropout_rate > 0 and not deterministic
    if config.attention == "reference" or (config.attention == "auto" and training_dropout):
        return "reference"
    if config.attention == "xla":
        return "xla"
    wanted = config.attention
    if wanted == "auto":
        # Elsewhere (CPU) the plain einsum/softmax path: on XLA:CPU its forward + backward took half the time of
        # jax.nn.dot_product_attention(implementation="xla") for BERT-base's attention shapes.
        wanted = {"gpu": "cudnn", "tpu": "pallas"}.get(target_platform(), "reference")
        if wanted == "reference":
            return "reference"
    reason = (_cudnn_unsupported(query, attention_mask, not deterministic) if wanted == "cudnn"
              else _pallas_unsupported(query, attention_mask))
    if reason is not None:
        _log_note("attention", f"model.attention={config.attention!r}: using 'xla' because {reason}")
        return "xla"
    return wanted


def _heads_first(x):
    """[batch, length, heads, head_dim] <-> [batch, heads, length, head_dim]."""
    return jnp.swapaxes(x, 1, 2)


def reference_attention_probs(query, key, attention_mask, head_dim: int, blas: bool = False):
    """softmax(q k^T / sqrt(d)) in float32 with masked keys at exactly zero probability ([batch, heads, q, k]).

    `blas`: the scores through bert_jax.cpu_gemm's batched matmul (float32 operands) instead of XLA's einsum.
    """
    # Scores accumulate and stay in float32 whatever the compute dtype: rounding them to bfloat16 before the
    # softmax would cost precision for nothing.
    # Heads-first operands ([b, h, t, d]): on XLA:CPU this batched layout made the attention core's forward and
    # backward with dropout about a third faster than contracting the [b, t, h, d] projections directly.
    if blas:
        scores = cpu_gemm.matmul(_heads_first(query), _heads_first(key), False, True)
    else:
        scores = jnp.einsum("bhqd,bhkd->bhqk", _heads_first(query), _heads_first(key),
                            preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(head_dim))
    scores = jnp.where(_full_attention_mask(attention_mask), scores, jnp.finfo(jnp.float32).min)
    return jax.nn.softmax(scores, axis=-1)


def _splash_attention(query, key, value, attention_mask, interpret: bool = False):
    """Pallas splash attention (TPU) over [batch, length, heads, head_dim]; the padding mask becomes segment ids.

    Real tokens (segment 1) attend only to real tokens, as in every other path; a padding query attends to the
    padding keys instead of the real ones, which changes only outputs at padding positions (never read by a loss
    or a pooler). The kernel is per example, so it is vmapped over the batch, and under a mesh it runs in a
    shard_map over the batch and head axes the logical rules give (Pallas kernels are not auto-partitioned).
    `interpret` runs the kernel in the Pallas interpreter (any backend; for tests).
    """
    # pylint: disable=import-outside-toplevel
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    scale = 1.0 / np.sqrt(query.shape[-1])
    segment_ids = (attention_mask.ids if isinstance(attention_mask, SegmentMask) else attention_mask).astype(
        jnp.int32)

    def attend(query, key, value, segment_ids):
        _, length, heads, _ = query.shape
        mask = splash.MultiHeadMask([splash.FullMask((length, length)) for _ in range(heads)])
        block = next(size for size in (512, 256, 128) if length % size == 0)
        block_sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block,
                                        block_kv_dq=block)
        kernel = splash.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=block_sizes,
                                        interpret=interpret)
        context = jax.vmap(kernel)(_heads_first(query * jnp.asarray(scale, query.dtype)), _heads_first(key),
                                   _heads_first(value), segment_ids=splash.SegmentIds(segment_ids, segment_ids))
        return _heads_first(context)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, segment_ids)
    spec = nn.logical_to_mesh_axes(("batch", "length", "act_heads", None))
    if spec[1] is not None:
        raise ValueError(f"model.attention='pallas' cannot shard the sequence axis (logical 'length' -> {spec[1]}); "
                         "map 'length' to None in mesh.rules or use model.attention='xla'")
    ids_spec = jax.sharding.PartitionSpec(spec[0], None)
    return jax.shard_map(attend, mesh=mesh, in_specs=(spec, spec, spec, ids_spec), out_specs=spec,
                         check_vma=False)(query, key, value, segment_ids)


def fused_attention(implementation: str, query, key, value, attention_mask):
    """Attention without dropout through jax.nn.dot_product_attention ("xla", "cudnn") or Pallas ("pallas").

    `attention_mask` is [batch, key] (padding), a SegmentMask (packed rows: splash takes its ids as segment ids,
    the others its block-diagonal mask) or a full boolean [batch, 1 or heads, query, key] mask. cuDNN takes a
    padding mask as key lengths, which assumes trailing padding (BERT's input_mask always is), and a full mask as an
    additive bias.
    """
    if implementation == "pallas":
        return _splash_attention(query, key, value, attention_mask)
    if implementation == "cudnn":
        try:
            if _is_padding_mask(attention_mask):
                # At least 1: an all-padding row must not give cuDNN an empty softmax (NaN); its output is unused.
                lengths = jnp.maximum(jnp.sum(attention_mask.astype(jnp.int32), axis=-1), 1)
                return jax.nn.dot_product_attention(query, key, value, key_value_seq_lengths=lengths,
                                                    implementation="cudnn")
            return jax.nn.dot_product_attention(query, key, value, mask=_full_attention_mask(attention_mask),
                                                implementation="cudnn")
        except (NotImplementedError, ValueError, RuntimeError) as error:  # cuDNN's own checks, at trace time
            _log_note("attention", f"cuDNN flash attention refused this call ({error}); using 'xla'")
    return jax.nn.dot_product_attention(query, key, value, mask=_full_attention_mask(attention_mask),
                                        implementation="xla")


def gather_rows(x, positions):
    """x[b, positions[b, i]]: [batch, length, ...] -> [batch, rows, ...]."""
    index = positions.astype(jnp.int32).reshape(*positions.shape, *(1,) * (x.ndim - 2))
    return jnp.take_along_axis(x, index, axis=1)


def _query_rows_mask(attention_mask, query_positions):
    """The attention mask for queries at `query_positions` only (keys: every row): a padding mask ([batch, key]) is
    unchanged; a SegmentMask or a full mask becomes the boolean [batch, 1 or heads, rows, key] mask of those rows."""
    if _is_padding_mask(attention_mask):
        return attention_mask
    if isinstance(attention_mask, SegmentMask):
        ids = attention_mask.ids
        return (gather_rows(ids, query_positions)[:, :, None] == ids[:, None, :])[:, None, :, :]
    full = _full_attention_mask(attention_mask)
    return jnp.take_along_axis(full, query_positions.astype(jnp.int32)[:, None, :, None], axis=2)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with the padding (or any boolean) mask, followed by the output projection.

    `attention_mask` is [batch, length] (1 for real tokens), a SegmentMask (packed rows) or a full [batch, 1,
    length, length] boolean mask. The path is config.attention resolved by `attention_implementation`; every path
    computes the softmax in float32.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool, query_positions=None):
        """`query_positions` ([batch, queries] int): attend from those rows of x only (keys and values are still every
        row); the output is then [batch, queries, hidden], equal to the full output's rows at those positions."""
        config = self.config
        batch, length, _ = x.shape
        queries = x if query_positions is None else gather_rows(x, query_positions)

        def project(name, inputs):
            y = _dense(config, config.hidden_size, ("embed", "heads"), name)(inputs)
            y = y.reshape(batch, inputs.shape[1], config.num_heads, config.head_dim)
            return _constrain(y, ("batch", "length", "act_heads", None))

        query, key, value = project("query", queries), project("key", x), project("value", x)
        if query_positions is not None:
            attention_mask = _query_rows_mask(attention_mask, query_positions)
        implementation = attention_implementation(config, query, attention_mask, deterministic)
        if implementation == "reference":
            blas = matmul_implementation(config) == "blas"
            probs = reference_attention_probs(query, key, attention_mask, config.head_dim, blas=blas)
            probs = probs.astype(config.compute_dtype)
            rows = None if query_positions is None else (2, query_positions[:, None, :], length)
            probs = Dropout(config.attention_dropout_rate)(probs, deterministic=deterministic, rows=rows)
            if blas:
                context = _heads_first(cpu_gemm.matmul(probs, _heads_first(value)))
            else:
                context = _heads_first(jnp.einsum("bhqk,bhkd->bhqd", probs, _heads_first(value)))
        else:
            context = fused_attention(implementation, query, key, value, attention_mask)
        context = _constrain(context, ("batch", "length", "act_heads", None))
        context = context.reshape(batch, queries.shape[1], config.hidden_size)
        return nn.Dense(config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                        kernel_init=_kernel_init(config, ("heads", "embed")), bias_init=_zeros(("norm",)),
                        dot_general=_dot_general(config), name="output")(context)


class BertLayer(nn.Module):
    """One post-LN encoder layer: attention, add & norm, GELU feed-forward, add & norm."""

    config: BertConfig

    @nn.compact
    def __call__(self, x, attention_mask, deterministic: bool, query_positions=None):
        """`query_positions` ([batch, rows] int): compute the layer's output at those rows of x only (attending over
        every row): [batch, rows, hidden], the full output's rows at those positions, dropout included."""
        config = self.config
        attention = BertSelfAttention(config, name="attention")(x, attention_mask, deterministic, query_positions)
        rows = None
        if query_positions is not None:
            rows = (1, query_positions, x.shape[1])
            x = gather_rows(x, query_positions)
        attention = Dropout(config.dropout_rate)(attention, deterministic=deterministic, rows=rows)
        x = _layer_norm(config, "attention_layer_norm")(x + attention)
        x = _constrain(x, ("batch", "length", "act_embed"))

        hidden = _dense(config, config.intermediate_size, ("embed", "mlp"), "intermediate")(x)
        hidden = _constrain(_activation(config, hidden), ("batch", "length", "act_mlp"))
        hidden = nn.Dense(config.hidden_size, dtype=config.compute_dtype, param_dtype=jnp.float32,
                          kernel_init=_kernel_init(config, ("mlp", "embed")), bias_init=_zeros(("norm",)),
                          dot_general=_dot_general(config), name="output")(hidden)
        hidden = Dropout(config.dropout_rate)(hidden, deterministic=deterministic, rows=rows)
        x = _layer_norm(config, "output_layer_norm")(x + hidden)
        return _constrain(x, ("batch", "length", "act_embed"))


def is_encoder_parameter(name: str) -> bool:
    """True for a top-level parameter name the pretraining and downstream models share (embeddings, layers, pooler).

    BertForPreTraining's parameters minus the heads (nsp_head, mlm_*) are exactly those of BertModel, and those of
    BertForSequenceClassification minus `classifier`, so pretrained parameters load by name with no renaming.
    """
    return (name in ("embeddings", "pooler", SCANNED_LAYERS)
            or (name.startswith("layer_") and name[6:].isdigit()))


class _ScannedBertLayer(BertLayer):
    """BertLayer as an nn.scan step: the output is both the carry and the per-layer (stacked) output."""

    def __call__(self, x, attention_mask, deterministic: bool):  # pylint: disable=arguments-differ
        x = super().__call__(x, attention_mask, deterministic)
        return x, x


def _run_layers(config: BertConfig, x, attention_mask, deterministic: bool, output_positions=None):
    """Every encoder layer, created in the CALLING compact module; returns (output, [each layer's output]).

    Unrolled: `layer_{i}` modules. With config.scan_layers: one nn.scan named `layers` whose parameters carry a
    leading layer axis (logical name "layers"), so the step is traced and compiled once whatever the depth
    (`stack_layers` / `unstack_layers` convert between the two layouts). config.remat wraps each layer in
    nn.remat with the REMAT_POLICIES policy.

    `output_positions` ([batch, rows] int): the output is only those rows of the last layer's ([batch, rows,
    hidden]; so is the last entry of the list). The last layer then computes those rows alone (its queries,
    feed-forward and LayerNorms; keys and values still cover every row). Scanned, that layer runs after a scan over
    the others (`_apply_scanned_layers`).
    """
    layer_class = _ScannedBertLayer if config.scan_layers else BertLayer
    if config.remat != "none":
        # deterministic (argument 3, counting self) is a Python bool that selects the dropout code: static.
        layer_class = nn.remat(layer_class, policy=REMAT_POLICIES[config.remat], static_argnums=(3,),
                               prevent_cse=not config.scan_layers)
    if not config.scan_layers:
        outputs = []
        for index in range(config.num_layers):
            last = index == config.num_layers - 1
            x = layer_class(config, name=f"layer_{index}")(x, attention_mask, deterministic,
                                                           output_positions if last else None)
            outputs.append(x)
        return x, outputs
    scanned = nn.scan(layer_class, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
                      in_axes=(nn.broadcast, nn.broadcast), length=config.num_layers,
                      metadata_params={nn.PARTITION_NAME: SCANNED_LAYERS})(config, name=SCANNED_LAYERS)
    if scanned.is_initializing():  # nn.scan creates the stacked parameters (and their "layers" axis metadata)
        x, stacked = scanned(x, attention_mask, deterministic)
        outputs = [stacked[index] for index in range(config.num_layers)]
        if output_positions is not None:
            x = outputs[-1] = gather_rows(x, output_positions)
        return x, outputs
    dropout_rng = None if deterministic else scanned.make_rng("dropout")
    return _apply_scanned_layers(config, nn.meta.unbox(scanned.variables["params"]), x, attention_mask,
                                 deterministic, dropout_rng, output_positions)


def _apply_scanned_layers(config: BertConfig, stacked_params, x, attention_mask, deterministic: bool, dropout_rng,
                          output_positions=None):
    """Scanned layers applied as a function of their stacked parameters: a lax.scan of BertLayer.

    Layer i's dropout key is `jax.random.split(dropout_rng, num_layers)[i]` whichever rows it computes. With
    `output_positions`, the scan covers every layer but the last, and the last layer (its parameters sliced from the
    stack) computes the head rows alone, as unrolled layers do: with one scan over every layer the last layer
    would compute every row (a cond on the layer index inside the scan kept the weights and both branches'
    activations as residuals, and was slower).
    """
    num_layers = config.num_layers
    layer = BertLayer(config, parent=None)

    def apply_layer(params, x, key, query_positions=None):
        rngs = {} if key is None else {"dropout": key}
        return layer.apply({"params": params}, x, attention_mask, deterministic, query_positions, rngs=rngs)

    if config.remat != "none":
        apply_layer = jax.checkpoint(apply_layer, policy=REMAT_POLICIES[config.remat], prevent_cse=False)
    keys = None if dropout_rng is None else jax.random.split(dropout_rng, num_layers)
    scanned_layers = num_layers if output_positions is None else num_layers - 1

    def step(x, layer_inputs):
        params, key = layer_inputs
        x = apply_layer(params, x, key)
        return x, x

    x, stacked = jax.lax.scan(step, x, (jax.tree.map(lambda leaf: leaf[:scanned_layers], stacked_params),
                                        None if keys is None else keys[:scanned_layers]))
    outputs = [stacked[index] for index in range(scanned_layers)]
    if output_positions is not None:
        x = apply_layer(jax.tree.map(lambda leaf: leaf[-1], stacked_params), x,
                        None if keys is None else keys[-1], output_positions)
        outputs.append(x)
    return x, outputs


def _layer_names(params) -> list:
    names = [name for name in params if name.startswith("layer_") and name[6:].isdigit()]
    return sorted(names, key=lambda name: int(name[6:]))


def stack_layers(params, num_layers: int) -> dict:
    """Unrolled parameters (`layer_0` ... `layer_{n-1}`) -> the scan_layers layout (`layers`, leading layer axis).

    Works on the params tree (or a {"params": ...} wrapper) of any model built by `_encode`, with numpy or jax
    arrays (unbox LogicallyPartitioned trees first: nn.meta.unbox); other entries are passed through unchanged.
    """
    if set(params) == {"params"}:
        return {"params": stack_layers(params["params"], num_layers)}
    names = _layer_names(params)
    if names != [f"layer_{index}" for index in range(num_layers)]:
        raise ValueError(f"stack_layers: expected layer_0 ... layer_{num_layers - 1}, found {names or 'none'} "
                         f"(scanned parameters already? they hold '{SCANNED_LAYERS}')")
    stack = np.stack if all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(params[names[0]])) else jnp.stack
    stacked = jax.tree.map(lambda *leaves: stack(leaves), *(params[name] for name in names))
    rest = {name: value for name, value in params.items() if name not in names}
    return {**rest, SCANNED_LAYERS: stacked}


def unstack_layers(params) -> dict:
    """The scan_layers layout (`layers` with a leading layer axis) -> unrolled `layer_{i}` parameters.

    Parameters without `layers` (already unrolled) are returned unchanged, so callers may apply it to either.
    """
    if set(params) == {"params"}:
        return {"params": unstack_layers(params["params"])}
    if SCANNED_LAYERS not in params:
        return params
    stacked = params[SCANNED_LAYERS]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    rest = {name: value for name, value in params.items() if name != SCANNED_LAYERS}
    return {**rest, **{f"layer_{index}": jax.tree.map(lambda leaf, i=index: leaf[i], stacked)
                       for index in range(num_layers)}}


def _encode(config: BertConfig, input_ids, input_mask, segment_ids, deterministic: bool, position_ids=None,
            attention_mask=None, output_positions=None):
    """Embeddings and every encoder layer, created as `embeddings` and `layer_{i}` (or, scanned, `layers`) in the
    CALLING compact module.

    A function rather than a submodule so that the callers (pretraining, classification, features) all own the
    same top-level names. Returns (sequence_output, hidden_states, embeddings module); hidden_states holds the
    embeddings output and every layer's output. Packed rows give `position_ids` (default 0..length-1) and
    `attention_mask`, the SegmentMask of their instance ids (default: input_mask, a padding mask).
    `output_positions`: sequence_output holds only those rows (see _run_layers).
    """
    _, length = input_ids.shape
    if position_ids is None:
        position_ids = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None, :], input_ids.shape)
    if attention_mask is None:
        attention_mask = input_mask.astype(bool)

    embeddings = BertEmbeddings(config, name="embeddings")
    x = embeddings(input_ids, segment_ids, position_ids, deterministic)
    hidden_states = [x]
    x, layer_outputs = _run_layers(config, x, attention_mask, deterministic, output_positions)
    hidden_states.extend(layer_outputs)
    return x, tuple(hidden_states), embeddings


def _pool(config: BertConfig, sequence_output, cls_positions=None):
    """The BERT pooler, created as `pooler` in the calling compact module: tanh(dense([CLS] hidden state)).

    With `cls_positions` ([batch, k], packed rows) it pools the hidden state at each of those positions: [batch, k,
    hidden].
    """
    cls = sequence_output[:, 0] if cls_positions is None else gather_rows(sequence_output, cls_positions)
    return _pooler(config, cls)


def _pooler(config: BertConfig, cls):
    """tanh(dense(cls)), created as `pooler` in the calling compact module."""
    return nn.tanh(_dense(config, config.hidden_size, ("embed", None), "pooler")(cls))


class BertForPreTraining(nn.Module):
    """Encoder plus pooler, MLM head (tied decoder + output bias) and NSP head.

    Inputs follow the original TFRecord layout: `input_ids`, `input_mask` (1 for real tokens), `segment_ids`
    ([batch, length]) and `masked_lm_positions` ([batch, predictions]). Returns a dict with `mlm_logits`
    ([batch, predictions, vocab], float32), `nsp_logits` ([batch, 2], float32), `sequence_output` and
    `pooled_output`, plus `hidden_states` (embeddings output and every layer's output) when asked for.

    Packed rows (bert_jax.data.packing) add `position_ids` (restarting at 0 in each instance), `instance_ids` (1..k per
    instance, 0 for padding: attention stays inside an instance) and `nsp_positions` ([batch, k], each instance's
    [CLS]): then `pooled_output` is [batch, k, hidden] and `nsp_logits` [batch, k, 2]. Without them the model is
    the unpacked one, unchanged.

    `sequence_output=False` (the pretraining train and eval steps): the heads read the last layer at the [CLS]
    rows and the masked positions only, so the last layer computes just those rows (see BertLayer; at seq 128 with
    19 predictions, 20 of 128 rows, which skips 71% of its matmul FLOPs). The logits are the same (dropout included:
    the masks are the full layer's at those rows); `sequence_output` and `hidden_states` are then not returned.
    """

    config: BertConfig

    @nn.compact
    def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, deterministic: bool = True,
                 output_hidden_states: bool = False, position_ids=None, instance_ids=None,
                 nsp_positions=None, sequence_output: bool = True) -> dict[str, Any]:
        config = self.config
        attention_mask = None if instance_ids is None else SegmentMask(instance_ids.astype(jnp.int32))
        masked_lm_positions = masked_lm_positions.astype(jnp.int32)
        head_positions = None
        if not sequence_output:
            if output_hidden_states:
                raise ValueError("BertForPreTraining: output_hidden_states=True needs sequence_output=True (with "
                                 "sequence_output=False the last layer computes only the rows the heads read)")
            cls_rows = head_cls_rows(nsp_positions)
            cls_positions = (jnp.zeros((input_ids.shape[0], cls_rows), jnp.int32) if nsp_positions is None
                             else nsp_positions.astype(jnp.int32))
            head_positions = jnp.concatenate([cls_positions, masked_lm_positions], axis=1)
        x, hidden_states, embeddings = _encode(config, input_ids, input_mask, segment_ids, deterministic,
                                               position_ids=position_ids, attention_mask=attention_mask,
                                               output_positions=head_positions)
        if sequence_output:
            pooled = _pool(config, x, nsp_positions)
            masked = gather_rows(x, masked_lm_positions)
        else:
            pooled = _pooler(config, x[:, 0] if nsp_positions is None else x[:, :cls_rows])
            masked = x[:, cls_rows:]
        nsp_logits = nn.Dense(2, dtype=jnp.float32, param_dtype=jnp.float32,
                              kernel_init=_kernel_init(config, ("embed", "classes")), bias_init=_zeros(("classes",)),
                              name="nsp_head")(pooled)

        # Gathered before the head: the transform and the vocab-sized decoder run on masked positions only.
        masked = _activation(config, _dense(config, config.hidden_size, ("embed", None), "mlm_transform")(masked))
        masked = _layer_norm(config, "mlm_layer_norm")(masked)
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
        dropped = Dropout(config.dropout_rate)(pooled, deterministic=deterministic)
        logits = nn.Dense(self.num_classes, dtype=jnp.float32, param_dtype=jnp.float32,
                          kernel_init=_kernel_init(config, ("embed", "classes")), bias_init=_zeros(("classes",)),
                          name="classifier")(dropped)
        return {"logits": logits, "pooled_output": pooled}
