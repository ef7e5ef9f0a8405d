"""The pure step functions of both jobs, which bert_jax.train jits with shardings.

Pretraining: `make_train_step` (MLM and NSP losses as the original BERT, gradient accumulation, the all-reduce
across slices) and `make_eval_step` (weighted sums). Fine-tuning: `make_classification_train_step` and
`make_classification_eval_step` (weighted cross-entropy over rows or scored tokens), and the held-out outputs:
`make_logits_step`, `make_predict_step`, `make_features_step`. A train step is
`train_step(state, batch, rng) -> (state, metrics)`, an eval step `eval_step(params, batch) -> outputs`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import sharding as sharding_lib
from bert_jax.data import conll

MODEL_INPUT_NAMES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "position_ids",
                     "instance_ids", "nsp_positions")


def model_inputs(batch):
    """The pretraining model's keyword arguments, named as in the batch; the last three of MODEL_INPUT_NAMES only in
    packed batches (bert_jax.data.packing)."""
    return {name: batch[name] for name in MODEL_INPUT_NAMES if name in batch}


# ---------------------------------------------------------------------------------------------------------------
# Pretraining.

def pretraining_loss(outputs, batch, mlm_denominator, nsp_denominator):
    """MLM and NSP losses and accuracies as in the original BERT, over the given normalisers (MLM alone for a model
    without an NSP head).

    MLM loss = sum(weights * cross-entropy) / (sum(weights) + 1e-5) and NSP loss = mean cross-entropy (over the
    real instances of packed rows, see `_nsp_terms`). The denominators are passed in so that micro-batches of one
    batch, normalised by the whole batch, sum to exactly the whole batch's loss (and gradient).
    """
    mlm_xent, mlm_correct = _mlm_terms(outputs["mlm_logits"], batch)
    mlm_loss = jnp.sum(mlm_xent) / mlm_denominator
    mlm_correct = jnp.sum(mlm_correct)
    if "nsp_logits" not in outputs:  # a masked-LM-only model (bert_jax.modern)
        return mlm_loss, {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_accuracy": mlm_correct / mlm_denominator}
    nsp_xent, nsp_correct = _nsp_terms(outputs["nsp_logits"], batch)
    nsp_loss = jnp.sum(nsp_xent) / nsp_denominator
    nsp_correct = jnp.sum(nsp_correct)
    metrics = {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
               "mlm_accuracy": mlm_correct / mlm_denominator, "nsp_accuracy": nsp_correct / nsp_denominator}
    return mlm_loss + nsp_loss, metrics


def cross_entropy(logits, labels):
    """optax.softmax_cross_entropy_with_integer_labels, with the label's logit picked by a one-hot product rather
    than a gather: a gather over a vocab sharded over `tensor` crashes XLA's SPMD partitioner in the per-slice
    shard_map of `across_slices` (Check failed in ExpandDeviceGroupsWithIota, jaxlib 0.10.2), and the product
    partitions like the logits themselves."""
    label_logits = jnp.sum(jnp.where(jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.bool_), logits, 0.0), -1)
    return jax.nn.logsumexp(logits, axis=-1) - label_logits


def _mlm_terms(mlm_logits, batch):
    """Per-prediction MLM cross-entropy and correctness, weighted by masked_lm_weights (zero for padding slots)."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    xent = cross_entropy(mlm_logits, batch["masked_lm_ids"])
    return weights * xent, weights * (jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"])


def _nsp_terms(nsp_logits, batch):
    """Per-instance NSP cross-entropy and correctness, flat; zero for the empty instance slots of packed rows."""
    labels = batch["next_sentence_labels"].reshape(-1)
    nsp_logits = nsp_logits.reshape(labels.shape[0], -1)  # packed rows: [batch, instances, 2] -> one per instance
    xent = cross_entropy(nsp_logits, labels)
    correct = jnp.argmax(nsp_logits, -1) == labels
    if "nsp_weights" in batch:
        nsp_weights = batch["nsp_weights"].reshape(-1).astype(jnp.float32)
        return nsp_weights * xent, nsp_weights * correct
    return xent, correct


def make_grad_fn(model: nn.Module, rules):
    """`grad_fn(params, batch, dropout_rng, mlm_denominator, nsp_denominator) -> ((loss, metrics), grads)`."""
    def loss_fn(params, batch, dropout_rng, mlm_denominator, nsp_denominator):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, **model_inputs(batch), deterministic=False,
                                  sequence_output=False, rngs={"dropout": dropout_rng})
        return pretraining_loss(outputs, batch, mlm_denominator, nsp_denominator)

    return jax.value_and_grad(loss_fn, has_aux=True)


def _nsp_count(batch):
    """The instances weighted for NSP: the summed nsp_weights where the batch has them, else one per row."""
    return (jnp.sum(batch["nsp_weights"].astype(jnp.float32)) if "nsp_weights" in batch
            else jnp.asarray(batch["input_ids"].shape[0], jnp.float32))


def batch_denominators(batch):
    """The whole batch's MLM and NSP normalisers (see pretraining_loss): NSP counts instances (packed: real ones)."""
    # At least 1: a batch of MLM-only rows (nsp_weights all 0) has NSP terms of 0, and 0 / 1 is a loss of 0, not NaN.
    return jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5, jnp.maximum(_nsp_count(batch), 1.0)


def apply_gradients(state, grads, tx: optax.GradientTransformation, schedule, metrics):
    """One optimizer update; adds grad_norm, learning_rate and params_finite (1.0 when every new parameter is
    finite) to `metrics`. Returns (state, metrics)."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # So that no checkpoint ever holds a NaN: the loss is computed before the update and misses a step whose update
    # overflowed the parameters. The optimizer's moments need no check of their own: they are finite whenever the
    # previous state and the gradient norm (checked by the loop) are. Parameters only: +1.2% of the BERT-base CPU
    # step where parameters and moments together cost +3.6%.
    finite = jnp.stack([jnp.isfinite(leaf).all() for leaf in jax.tree.leaves(params)
                        if jnp.issubdtype(leaf.dtype, jnp.inexact)]).all()
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step),
                   params_finite=finite.astype(jnp.float32))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, schedule, rules, mesh,
                    grad_accum_steps: int = 1):
    """Returns the pure `train_step(state, batch, rng) -> (state, metrics)`.

    Dropout randomness is `fold_in(rng, step)`, so a step's masks depend only on the run's seed and the step number.
    With grad_accum_steps = k the batch is split into k strided micro-batches (each keeps every device's share of
    rows) whose gradients are summed in a scan; the result equals the whole batch's gradient.

    Over several slices (mesh.dcn_data > 1) each slice computes the gradient of its rows of the batch
    (`across_slices`), and one all-reduce over the slice axis sums them: the only collective that crosses slices.
    """
    slices = mesh.shape.get(sharding_lib.SLICE_AXIS, 1)
    slice_rules = sharding_lib.within_slice_rules(rules) if slices > 1 else rules
    batch_axes = sharding_lib.batch_spec(mesh, slice_rules)[0]
    grad_fn = make_grad_fn(model, slice_rules)

    def gradients(params, batch, dropout_rng, mlm_denominator, nsp_denominator):
        if grad_accum_steps == 1:
            (_, metrics), grads = grad_fn(params, batch, dropout_rng, mlm_denominator, nsp_denominator)
            return grads, metrics

        def split(x):
            x = x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps, *x.shape[1:]).swapaxes(0, 1)
            # Across slices this runs in a shard_map, whose mesh (slice axis manual) a bare spec refers to.
            spec = PartitionSpec(None, batch_axes)
            return jax.lax.with_sharding_constraint(x, spec if slices > 1 else NamedSharding(mesh, spec))

        def accumulate(carry, micro):
            index, micro_batch = micro
            (_, metrics), grads = grad_fn(params, micro_batch, jax.random.fold_in(dropout_rng, index),
                                          mlm_denominator, nsp_denominator)
            return jax.tree.map(jnp.add, carry, (grads, metrics)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        zero_metrics = dict.fromkeys(("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"),
                                     jnp.zeros((), jnp.float32))
        micro_batches = (jnp.arange(grad_accum_steps), jax.tree.map(split, batch))
        (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, zero_metrics), micro_batches)
        return grads, metrics

    if slices > 1:
        gradients = across_slices(gradients, mesh)

    def train_step(state, batch, rng):
        mlm_denominator, nsp_denominator = batch_denominators(batch)
        grads, metrics = gradients(state.params, batch, jax.random.fold_in(rng, state.step), mlm_denominator,
                                   nsp_denominator)
        return apply_gradients(state, grads, tx, schedule, metrics)

    return train_step


def across_slices(gradients, mesh):
    """`gradients(params, batch, dropout_rng, *denominators) -> (grads, metrics)` run on each slice's rows of the
    batch, summed over the slices.

    Left to itself, XLA's partitioner may move activations between slices (for the word-embedding scatter-add it
    gathers the activation gradient over the slice axis); in a shard_map manual over the slice axis alone, each slice
    works on its own rows (sharded over its data, fsdp and tensor axes as usual), and the explicit psum of the
    gradients and metrics, exact because the losses are normalised by the whole batch's denominators, is the one
    transfer between slices. Each slice folds its index into the dropout key, so its masks differ from the others'.
    """
    axis = sharding_lib.SLICE_AXIS

    def per_slice(params, batch, dropout_rng, mlm_denominator, nsp_denominator):
        dropout_rng = jax.random.fold_in(dropout_rng, jax.lax.axis_index(axis))
        partial = gradients(params, batch, dropout_rng, mlm_denominator, nsp_denominator)
        return jax.lax.psum(partial, axis)

    # check_vma=False: the parameters' cotangents stay per-slice partial sums (no implicit psum), summed above.
    return jax.shard_map(per_slice, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec(axis), PartitionSpec(),
                                                         PartitionSpec(), PartitionSpec()),
                         out_specs=PartitionSpec(), axis_names={axis}, check_vma=False)


def make_eval_step(model: nn.Module, rules):
    """Returns `eval_step(params, batch) -> sums` (no dropout); sums add up across batches.

    The sums are weighted (masked_lm_weights; nsp_weights where the batch has them, else 1 per row), so rows of
    weight 0, such as the padding that fills the last held-out batch, add nothing: summed over batches and divided
    by the summed weights they give each record's metrics exactly once. "nsp_count" counts the records weighted for
    NSP, "records" every record (MLM-only rows weigh 0 for NSP).
    """
    def eval_step(params, batch):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, **model_inputs(batch), deterministic=True,
                                  sequence_output=False)
        mlm_xent, mlm_correct = _mlm_terms(outputs["mlm_logits"], batch)
        # 0 * NaN is NaN: whatever an all-padding row computes, it must not reach the sums.
        real_predictions = batch["masked_lm_weights"] > 0
        mlm_xent, mlm_correct = (jnp.where(real_predictions, term, 0.0) for term in (mlm_xent, mlm_correct))
        nsp_count = _nsp_count(batch)
        # Padding rows are all zeros; a packed row holds as many records as its highest instance id.
        records = (jnp.sum(jnp.max(batch["instance_ids"], axis=-1)) if "instance_ids" in batch
                   else jnp.sum(batch["input_mask"][:, 0] > 0)).astype(jnp.float32)
        sums = {
            "mlm_loss_sum": jnp.sum(mlm_xent),
            "mlm_correct": jnp.sum(mlm_correct),
            "mlm_weight": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp_count": nsp_count,
            "records": records,
        }
        if "nsp_logits" not in outputs:
            return sums
        nsp_xent, nsp_correct = _nsp_terms(outputs["nsp_logits"], batch)
        if "nsp_weights" in batch:
            real_instances = batch["nsp_weights"].reshape(-1) > 0
            nsp_xent, nsp_correct = (jnp.where(real_instances, term, 0.0) for term in (nsp_xent, nsp_correct))
        return dict(sums, nsp_loss_sum=jnp.sum(nsp_xent), nsp_correct=jnp.sum(nsp_correct).astype(jnp.float32))
    return eval_step


# ---------------------------------------------------------------------------------------------------------------
# Fine-tuning.

def _logits(model, rules, params, batch, deterministic, rngs=None):
    with nn.logical_axis_rules(rules):
        return model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                           deterministic=deterministic, rngs=rngs)["logits"]


def _labels_and_weights(batch):
    """(labels, weights): each row's weight (0 for padding rows) and, for token labels [batch, length], also 0 where
    nothing is scored (conll.IGNORE: [CLS], [SEP], a word's later pieces, padding)."""
    labels, weights = batch["label_ids"], batch["weights"]
    if labels.ndim == 2:
        weights = weights[:, None] * (labels != conll.IGNORE)
        labels = jnp.maximum(labels, 0)
    return labels, weights


# A fine-tuning task's loss (bert_jax.tasks' Task.loss): cross-entropy over classes, or the squared error of one
# output per row (regression, transformers' problem_type="regression": MSE).
LOSSES = ("cross_entropy", "squared_error")


def _terms(logits, batch, loss: str):
    """(each row's or scored token's loss, its correctness (None for regression), its weight)."""
    if loss == "squared_error":
        error = logits[:, 0].astype(jnp.float32) - batch["label_ids"].astype(jnp.float32)
        return error * error, None, batch["weights"]
    labels, weights = _labels_and_weights(batch)
    return (optax.softmax_cross_entropy_with_integer_labels(logits, labels), jnp.argmax(logits, -1) == labels,
            weights)


def make_classification_train_step(model: nn.Module, tx: optax.GradientTransformation, schedule, rules,
                                   loss: str = "cross_entropy"):
    """`train_step(state, batch, rng) -> (state, metrics)`: the weighted mean of `loss` (LOSSES) over rows, or over
    the scored tokens; dropout from fold_in(rng, step)."""
    def loss_fn(params, batch, dropout_rng):
        logits = _logits(model, rules, params, batch, False, {"dropout": dropout_rng})
        losses, correct, weights = _terms(logits, batch, loss)
        total = jnp.maximum(jnp.sum(weights), 1.0)
        mean = jnp.sum(weights * losses) / total
        if correct is None:
            return mean, {"loss": mean}
        return mean, {"loss": mean, "accuracy": jnp.sum(weights * correct) / total}

    def train_step(state, batch, rng):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, batch, jax.random.fold_in(rng, state.step))
        return apply_gradients(state, grads, tx, schedule, metrics)

    return train_step


def make_classification_eval_step(model: nn.Module, rules, loss: str = "cross_entropy"):
    """`eval_step(params, batch) -> sums` of `loss`, correct predictions (not for regression) and real rows
    (padding rows weigh 0)."""
    def eval_step(params, batch):
        losses, correct, weights = _terms(_logits(model, rules, params, batch, True), batch, loss)
        sums = {"loss_sum": jnp.sum(weights * losses), "count": jnp.sum(weights)}
        return sums if correct is None else dict(sums, correct=jnp.sum(weights * correct))
    return eval_step


def make_logits_step(model: nn.Module, rules):
    """`logits_step(params, batch) -> logits` (float32), for question answering's span search on the host."""
    def logits_step(params, batch):
        return _logits(model, rules, params, batch, True).astype(jnp.float32)
    return logits_step


def make_predict_step(model: nn.Module, rules):
    """`predict_step(params, batch) -> [batch, length]` the most likely label of every position."""
    def predict_step(params, batch):
        return jnp.argmax(_logits(model, rules, params, batch, True), -1).astype(jnp.int32)
    return predict_step


def make_features_step(model: nn.Module, rules, pooling: str):
    """`features_step(params, batch) -> [batch, width]` float32 embeddings (see features.pooling)."""
    def features_step(params, batch):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                                  deterministic=True)
        if pooling == "cls":
            return outputs["sequence_output"][:, 0].astype(jnp.float32)
        if pooling == "mean":
            mask = batch["input_mask"][..., None].astype(jnp.float32)
            total = jnp.sum(outputs["sequence_output"].astype(jnp.float32) * mask, axis=1)
            return total / jnp.maximum(jnp.sum(mask, axis=1), 1.0)
        return jnp.concatenate([outputs["hidden_states"][-k][:, 0] for k in range(1, 5)], -1).astype(jnp.float32)
    return features_step
