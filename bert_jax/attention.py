"""Attention back-ends for the BERT encoder, and the one place that chooses between them by platform.

Every back-end takes query, key and value as [batch, length, heads, head_dim] and a mask that is either a padding
mask ([batch, key], true for real tokens) or a `SegmentMask` (packed rows), and returns [batch, queries, heads,
head_dim]. The back-ends:

  "reference"  softmax(q k^T / sqrt(d)) with einsums, float32 scores, and attention dropout (the only path that has
               it, so BERT's training recipe needs it);
  "xla"        jax.nn.dot_product_attention(implementation="xla");
  "cudnn"      jax.nn.dot_product_attention(implementation="cudnn"): cuDNN flash attention on GPU;
  "pallas"     the Pallas splash-attention kernel on TPU.

`attention_implementation` resolves the configured name ("auto" or one of these) for one call. It reads the platform
from `target_platform()`, which `compiling_for` overrides so that ahead-of-time compilation for a TPU on a CPU host
(bert_jax.aot) picks the kernel the TPU run would.

Einsum dimension names: b batch, q query position, k key position (t either), h head, d head dimension.
"""

import contextlib
import contextvars

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "reference")
FUSED_IMPLEMENTATIONS = ("xla", "cudnn", "pallas")  # none of them has attention dropout

_target_platform = contextvars.ContextVar("bert_jax_target_platform", default=None)
_logged_notes = set()


def target_platform() -> str:
    """The platform the model is traced for: jax.default_backend(), unless inside `compiling_for`."""
    return _target_platform.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str):
    """Trace for `platform` ("cpu", "gpu" or "tpu") instead of this process's backend (ahead-of-time compilation)."""
    token = _target_platform.set(platform)
    try:
        yield
    finally:
        _target_platform.reset(token)


def _log_note(message: str) -> None:
    # Every layer traces the choice again: log each distinct note once per process.
    if message not in _logged_notes:
        _logged_notes.add(message)
        logging.info("attention: %s", message)


@flax.struct.dataclass
class SegmentMask:
    """Attention inside segments: a query attends exactly to the keys with its own id.

    `ids` ([batch, key]) are the instance ids of packed rows; `query_ids` ([batch, query]) those of the queries when
    they are some rows only (see `at_queries`), else None (the queries are the keys). Passed as ids rather than as a
    [batch, query, key] boolean mask so that Pallas splash can take them as its segment ids. Padding (id 0) forms a
    block of its own, so no query row is fully masked (fused kernels may return NaN for one); padding outputs are
    never read.
    """

    ids: jax.Array
    query_ids: jax.Array | None = None


def at_queries(mask, query_positions):
    """The mask for queries at `query_positions` ([batch, queries]) only, with every row still a key."""
    if not isinstance(mask, SegmentMask):
        return mask  # a padding mask masks keys only
    query_ids = jnp.take_along_axis(mask.ids, query_positions.astype(jnp.int32), axis=1)
    return SegmentMask(mask.ids, query_ids)


def boolean_mask(mask, window: int | None = None):
    """[batch, 1, query or 1, key] booleans from a padding mask or a SegmentMask; with `window` (every row a query),
    also [1, 1, query, key] |query - key| <= window (a sliding window of 2 * window + 1)."""
    if isinstance(mask, SegmentMask):
        query_ids = mask.ids if mask.query_ids is None else mask.query_ids
        allowed = (query_ids[:, :, None] == mask.ids[:, None, :])[:, None]
    else:
        allowed = mask.astype(bool)[:, None, None, :]
    if window is None:
        return allowed
    rows = np.arange(allowed.shape[-1])
    return allowed & (np.abs(rows[:, None] - rows[None, :]) <= window)[None, None]


def _check_window(query, key, mask, window):
    if window is None:
        return
    if window < 0:
        raise ValueError(f"attention window={window}: must be 0 or more")
    if query.shape[1] != key.shape[1] or (isinstance(mask, SegmentMask) and mask.query_ids is not None):
        raise ValueError("a sliding attention window needs every row as a query (query_positions are not supported)")


def _cudnn_unsupported(query, mask, training: bool) -> str | None:
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
    if training and isinstance(mask, SegmentMask) and length % 2:
        return f"cuDNN flash attention with a full mask needs an even sequence length in training, not {length}"
    return None


def _pallas_unsupported(query, key) -> str | None:
    if target_platform() != "tpu":
        return f"the Pallas splash-attention kernel needs a TPU; the backend is {target_platform()}"
    if query.shape[1] % 128 or key.shape[1] % 128:
        return ("the Pallas splash-attention kernel needs query and key lengths that are multiples of 128, not "
                f"{query.shape[1]} and {key.shape[1]}")
    return None


def attention_implementation(requested: str, query, key, mask, training: bool, dropout_rate: float) -> str:
    """The back-end one call takes: `requested` (config.model.attention) resolved at trace time.

    Attention dropout (`dropout_rate` > 0 in `training`) exists only in "reference", which "auto" then takes;
    otherwise "auto" is cuDNN on GPU, Pallas splash on TPU and "reference" on CPU, where XLA:CPU runs the plain
    einsums faster than dot_product_attention. A named kernel that cannot run this call falls back to "xla", with
    the reason logged.
    """
    if requested == "reference" or (requested == "auto" and training and dropout_rate > 0):
        return "reference"
    if requested == "auto":
        requested = {"gpu": "cudnn", "tpu": "pallas"}.get(target_platform(), "reference")
    if requested in ("reference", "xla"):
        return requested
    reason = _cudnn_unsupported(query, mask, training) if requested == "cudnn" else _pallas_unsupported(query, key)
    if reason is None:
        return requested
    _log_note(f"{requested!r} falls back to 'xla' because {reason}")
    return "xla"


def reference_attention(query, key, value, mask, dropout=None, window: int | None = None):
    """softmax(q k^T / sqrt(d)) v, with `dropout` (a function, or None) applied to the probabilities; `window`: each
    query attends to the keys at most `window` rows away only (local attention; dot_product_attention checks it).

    The scores and the softmax stay float32 whatever the compute dtype; masked keys get exactly zero probability.
    """
    # Heads-first operands: XLA:CPU ran this batched layout's forward and backward about a quarter faster.
    query, key, value = (jnp.einsum("bthd->bhtd", x) for x in (query, key, value))
    scores = jnp.einsum("bhqd,bhkd->bhqk", query, key, preferred_element_type=jnp.float32)
    scores = scores / np.sqrt(query.shape[-1]).astype(np.float32)
    scores = jnp.where(boolean_mask(mask, window), scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    if dropout is not None:
        probs = dropout(probs)
    return jnp.einsum("bhqd->bqhd", jnp.einsum("bhqk,bhkd->bhqd", probs, value))


def _splash_attention(query, key, value, mask, interpret: bool = False, window: int | None = None):
    """Pallas splash attention (TPU); a padding mask becomes segment ids (1 real, 0 padding); `window` as
    reference_attention's, the kernel's LocalMask (it skips the blocks outside the band).

    A padding query then attends to the padding keys, which changes only outputs nothing reads. The kernel is per
    example, so it is vmapped over the batch, and under a mesh it runs in a shard_map over the batch and head axes
    (Pallas kernels are not auto-partitioned). `interpret` runs it in the Pallas interpreter (any backend; tests).
    """
    # pylint: disable=import-outside-toplevel
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    if isinstance(mask, SegmentMask):
        key_ids = mask.ids.astype(jnp.int32)
        query_ids = key_ids if mask.query_ids is None else mask.query_ids.astype(jnp.int32)
    else:
        query_ids = key_ids = mask.astype(jnp.int32)
    scale = 1.0 / np.sqrt(query.shape[-1])

    def attend(query, key, value, query_ids, key_ids):
        (_, queries, heads, _), keys = query.shape, key.shape[1]
        block_q, block_kv = (next(size for size in (512, 256, 128) if length % size == 0) for length in (queries, keys))
        block_sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                                        block_q_dkv=block_q, block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv,
                                        block_q_dq=block_q, block_kv_dq=block_kv)
        shape = (queries, keys)
        head_mask = (splash.FullMask(shape) if window is None
                     else splash.LocalMask(shape, window_size=(window, window), offset=0))
        kernel = splash.make_splash_mha(splash.MultiHeadMask([head_mask] * heads),
                                        head_shards=1, q_seq_shards=1, block_sizes=block_sizes, interpret=interpret)
        # The kernel wants heads first: [heads, length, head_dim] per example.
        context = jax.vmap(kernel)(jnp.einsum("bqhd->bhqd", query * jnp.asarray(scale, query.dtype)),
                                   jnp.einsum("bkhd->bhkd", key), jnp.einsum("bkhd->bhkd", value),
                                   segment_ids=splash.SegmentIds(query_ids, key_ids))
        return jnp.einsum("bhqd->bqhd", context)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return attend(query, key, value, query_ids, key_ids)
    spec = nn.logical_to_mesh_axes(("batch", "length", "act_heads", None))
    if spec[1] is not None:
        raise ValueError(f"model.attention='pallas' cannot shard the sequence axis (logical 'length' -> {spec[1]}); "
                         "map 'length' to None in mesh.rules or use model.attention='xla'")
    ids_spec = jax.sharding.PartitionSpec(spec[0], None)
    return jax.shard_map(attend, mesh=mesh, in_specs=(spec, spec, spec, ids_spec, ids_spec), out_specs=spec,
                         check_vma=False)(query, key, value, query_ids, key_ids)


def _cudnn_attention(query, key, value, mask, window=None):
    local = None if window is None else (window, window)  # cuDNN's own sliding window
    try:
        if isinstance(mask, SegmentMask):
            return jax.nn.dot_product_attention(query, key, value, mask=boolean_mask(mask), implementation="cudnn",
                                                local_window_size=local)
        # A padding mask as key lengths (BERT's padding is trailing); at least 1, as an empty softmax gives NaN.
        lengths = jnp.maximum(jnp.sum(mask.astype(jnp.int32), axis=-1), 1)
        return jax.nn.dot_product_attention(query, key, value, key_value_seq_lengths=lengths, implementation="cudnn",
                                            local_window_size=local)
    except (NotImplementedError, ValueError, RuntimeError) as error:  # cuDNN's own checks, at trace time
        _log_note(f"cuDNN flash attention refused this call ({error}); using 'xla'")
        return None


def dot_product_attention(implementation: str, query, key, value, mask, dropout=None, window: int | None = None):
    """Attention through `implementation` (an attention_implementation result); `dropout` is for "reference";
    `window`: local attention, each query attending to the keys at most `window` rows away (every back-end)."""
    _check_window(query, key, mask, window)
    if implementation == "reference":
        return reference_attention(query, key, value, mask, dropout, window)
    if implementation == "pallas":
        return _splash_attention(query, key, value, mask, window=window)
    if implementation == "cudnn":
        context = _cudnn_attention(query, key, value, mask, window)
        if context is not None:
            return context
    return jax.nn.dot_product_attention(query, key, value, mask=boolean_mask(mask, window),
                                        implementation="xla")
