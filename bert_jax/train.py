"""Train state and the pure train/eval steps.

`train_step(state, batch, rng) -> (state, metrics)` and `eval_step(params, batch) -> sums` are pure functions;
`jit_train_step` jits them with explicit in/out shardings over the mesh and donates the state, so parameters and
optimizer state are created, updated and kept sharded and no device ever holds more than its part. The loop that
runs them is bert_jax.loop's; `Setup` is the one construction of a run that every job, ahead-of-time compilation
and the benchmarks build from.
"""

import collections
import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import arch as arch_lib
from bert_jax import optim
from bert_jax import runtime
from bert_jax import sharding as sharding_lib


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


# train.dropout_rng: the PRNG implementation of the key dropout draws from. threefry keeps the masks independent of
# the mesh (what the sharding parity tests compare); rbg / unsafe_rbg draw with XLA's RngBitGenerator (unsafe_rbg
# also splits with it), which XLA:TPU partitions without replicating the bits when the driver sets
# --xla_tpu_spmd_rng_bit_generator_unsafe=true for unsafe_rbg (then the masks depend on the mesh).
DROPOUT_RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def dropout_key(seed: int, choice: str, platform: str) -> jax.Array:
    """The run's dropout key. threefry: the second half of split(key(seed)), the first seeding initialisation."""
    name = runtime.dropout_rng_name(choice, platform)
    if name == "threefry":
        return jax.random.split(jax.random.key(seed))[1]
    return jax.random.key(seed, impl=DROPOUT_RNG_IMPLS[name])


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


# The model's keyword arguments, named as in the batch; the last three only in packed batches (bert_jax.data.packing).
_MODEL_INPUT_NAMES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "position_ids",
                      "instance_ids", "nsp_positions")


def _model_inputs(batch):
    return {name: batch[name] for name in _MODEL_INPUT_NAMES if name in batch}


def make_grad_fn(model: nn.Module, rules):
    """`grad_fn(params, batch, dropout_rng, mlm_denominator, nsp_denominator) -> ((loss, metrics), grads)`."""
    def loss_fn(params, batch, dropout_rng, mlm_denominator, nsp_denominator):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, **_model_inputs(batch), deterministic=False,
                                  sequence_output=False, rngs={"dropout": dropout_rng})
        return pretraining_loss(outputs, batch, mlm_denominator, nsp_denominator)

    return jax.value_and_grad(loss_fn, has_aux=True)


def batch_denominators(batch):
    """The whole batch's MLM and NSP normalisers (see pretraining_loss): NSP counts instances (packed: real ones)."""
    nsp_count = (jnp.sum(batch["nsp_weights"].astype(jnp.float32)) if "nsp_weights" in batch
                 else jnp.asarray(batch["input_ids"].shape[0], jnp.float32))
    return jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)) + 1e-5, nsp_count


def apply_gradients(state: TrainState, grads, tx: optax.GradientTransformation, schedule, metrics):
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

    def train_step(state: TrainState, batch, rng):
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


# Programs with oneDNN's dots that their owners let go of, kept a little longer (KeptUntilDone.__del__): the last few.
_RETIRED_PROGRAMS = collections.deque(maxlen=8)


class KeptUntilDone:
    """A jitted program that is not freed while it runs, nor just after: letting go of it waits for its last run's
    outputs, then keeps it among the last few programs let go of (_RETIRED_PROGRAMS), to be freed when later ones
    push it out.

    XLA:CPU's oneDNN fusion thunk (runtime.step_compiler_options) aborts the process when a program is freed while
    one of its runs still holds the thunk's oneDNN runtime: when its last owner is its own running execution (a step
    dropped with the job that ran it, an exception between steps), and also just after the run's outputs are ready,
    before the run has handed the runtime back (jaxlib 0.10.2, a loaded 2-core AMD EPYC with AVX-512: 5 of 26 runs of
    tests/test_xla_cpu.py's loop aborted with the wait alone). Calls, .lower and the rest are the jitted function's."""

    def __init__(self, jitted):
        self._jitted = jitted
        self._last = None  # the last output of the last run (the metrics, not the donated state): all of a run's
        # outputs are ready together

    def __call__(self, *args, **kwargs):
        outputs = self._jitted(*args, **kwargs)
        leaves = jax.tree.leaves(outputs)
        self._last = leaves[-1] if leaves and isinstance(leaves[-1], jax.Array) else None
        return outputs

    def __getattr__(self, name):
        if "_jitted" not in self.__dict__:  # not yet initialised (copy, pickle): no recursion through here
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __del__(self):
        last = self.__dict__.get("_last")
        try:
            if last is not None and not last.is_deleted():
                last.block_until_ready()
        except Exception:  # pylint: disable=broad-except  # a failed run's error is raised where its outputs are read
            pass
        # The jitted function holds its compiled programs (even through jax.clear_caches): freed only once several
        # later programs have been let go of, long after this one's runs have handed their oneDNN runtimes back.
        if "_jitted" in self.__dict__:
            _RETIRED_PROGRAMS.append(self._jitted)


def _jit_step(function, mesh, **kwargs):
    """jax.jit with the step's compile options for the mesh's platform; a program with oneDNN's dots is kept alive
    until its runs end (the others skip the wrapper's per-call work)."""
    options = runtime.step_compiler_options(mesh.devices.flat[0].platform)
    jitted = jax.jit(function, compiler_options=options, **kwargs)
    return jitted if options is None else KeptUntilDone(jitted)


def jit_train_step(train_step, state_shardings, mesh, rules):
    """`train_step(state, batch, rng) -> (state, metrics)` jitted as the training loop runs it: the state in its
    shardings and donated (updated in place), the batch in the mesh's batch sharding, the RNG and metrics
    replicated. Pretraining, fine-tuning, the benchmarks and ahead-of-time compilation all jit it this way."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return _jit_step(train_step, mesh,
                     in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh, rules), replicated),
                     out_shardings=(state_shardings, replicated), donate_argnums=0)


def make_eval_step(model: nn.Module, rules):
    """Returns `eval_step(params, batch) -> sums` (no dropout); sums add up across batches.

    The sums are weighted (masked_lm_weights; nsp_weights where the batch has them, else 1 per row), so rows of
    weight 0, such as the padding that fills the last held-out batch, add nothing: summed over batches and divided
    by the summed weights they give each record's metrics exactly once. "nsp_count" counts the weighted records.
    """
    def eval_step(params, batch):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, **_model_inputs(batch), deterministic=True,
                                  sequence_output=False)
        mlm_xent, mlm_correct = _mlm_terms(outputs["mlm_logits"], batch)
        # 0 * NaN is NaN: whatever an all-padding row computes, it must not reach the sums.
        real_predictions = batch["masked_lm_weights"] > 0
        mlm_xent, mlm_correct = (jnp.where(real_predictions, term, 0.0) for term in (mlm_xent, mlm_correct))
        _, nsp_count = batch_denominators(batch)
        sums = {
            "mlm_loss_sum": jnp.sum(mlm_xent),
            "mlm_correct": jnp.sum(mlm_correct),
            "mlm_weight": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp_count": nsp_count,  # the records, which a masked-LM-only model counts too
        }
        if "nsp_logits" not in outputs:
            return sums
        nsp_xent, nsp_correct = _nsp_terms(outputs["nsp_logits"], batch)
        if "nsp_weights" in batch:
            real_instances = batch["nsp_weights"].reshape(-1) > 0
            nsp_xent, nsp_correct = (jnp.where(real_instances, term, 0.0) for term in (nsp_xent, nsp_correct))
        return dict(sums, nsp_loss_sum=jnp.sum(nsp_xent), nsp_correct=jnp.sum(nsp_correct).astype(jnp.float32))
    return eval_step


def jit_eval_step(eval_step, params_shardings, mesh, rules):
    """`eval_step(params, batch) -> sums` jitted as the pretraining job runs it: the parameters in their shardings,
    the batch in the mesh's batch sharding, the sums replicated."""
    return _jit_step(eval_step, mesh, in_shardings=(params_shardings, sharding_lib.batch_sharding(mesh, rules)),
                     out_shardings=NamedSharding(mesh, PartitionSpec()))


def dummy_batch(batch_size: int, seq_length: int, max_predictions: int) -> dict[str, np.ndarray]:
    """An all-zeros batch of the right shapes and dtypes, for initialisation and shape inference."""
    return {
        "input_ids": np.zeros((batch_size, seq_length), np.int32),
        "input_mask": np.ones((batch_size, seq_length), np.int32),
        "segment_ids": np.zeros((batch_size, seq_length), np.int32),
        "masked_lm_positions": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_ids": np.zeros((batch_size, max_predictions), np.int32),
        "masked_lm_weights": np.zeros((batch_size, max_predictions), np.float32),
        "next_sentence_labels": np.zeros((batch_size,), np.int32),
    }


def init_inputs(seq_length: int, max_predictions: int | None = None) -> dict[str, np.ndarray]:
    """Model inputs of one row, for initialisation and shape inference: a pretraining batch's (with
    masked_lm_positions) or, with `max_predictions` None, a downstream model's."""
    if max_predictions is None:
        ids = np.zeros((1, seq_length), np.int32)
        return {"input_ids": ids, "input_mask": ids, "segment_ids": ids}
    return _model_inputs(dummy_batch(1, seq_length, max_predictions))


def state_spec(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, inputs: dict):
    """(shapes of the train state, its shardings, the boxed init function), allocating nothing. `inputs`: the
    model's keyword inputs (init_inputs)."""
    def init_boxed(rng):
        with nn.logical_axis_rules(rules):
            params = model.init({"params": rng}, **inputs, deterministic=True)["params"]
        # The optimizer state is built from the boxed params, so its moments inherit the parameters' axis names.
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    boxed = jax.eval_shape(init_boxed, jax.random.key(0))
    shardings = sharding_lib.tree_shardings(boxed, mesh, rules)
    return sharding_lib.unbox(boxed), shardings, init_boxed


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, seq_length: int,
                         max_predictions: int):
    """state_spec of a pretraining model."""
    return state_spec(model, tx, mesh, rules, init_inputs(seq_length, max_predictions))


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, rng,
                       seq_length: int, max_predictions: int):
    """Creates the train state already sharded: `jax.jit(init, out_shardings=...)`, so no device holds a full copy.

    Returns (state, state_shardings).
    """
    setup = Setup.build(model, tx, None, mesh, rules, init_inputs(seq_length, max_predictions))
    return setup.create_state(rng), setup.shardings


@dataclasses.dataclass(frozen=True)
class Setup:
    """One run's pieces, built once: model, mesh and rules, optimizer and schedule, the train state's shapes and
    shardings, and the jitted steps over them. Pretraining, fine-tuning, bert_jax.aot and the benchmarks build
    from it."""
    model: nn.Module
    mesh: Any
    rules: tuple  # logical axis name -> mesh axes (sharding.logical_rules)
    tx: optax.GradientTransformation
    schedule: Any  # optax.Schedule (None where nothing trains)
    abstract: TrainState  # shapes and dtypes, nothing allocated
    shardings: TrainState
    init_boxed: Callable  # rng -> the boxed TrainState

    @classmethod
    def build(cls, model: nn.Module, tx, schedule, mesh, rules, inputs: dict) -> "Setup":
        """`inputs`: the model's keyword inputs for shape inference (init_inputs)."""
        abstract, shardings, init_boxed = state_spec(model, tx, mesh, rules, inputs)
        return cls(model, mesh, rules, tx, schedule, abstract, shardings, init_boxed)

    @property
    def batch_sharding(self) -> NamedSharding:
        return sharding_lib.batch_sharding(self.mesh, self.rules)

    def create_state(self, rng, given: dict | None = None) -> TrainState:
        """A fresh state from `rng`, born sharded: no device ever holds a full copy.

        `given`: parameters already placed as `self.shardings.params` (some or all of the top-level names, each whole),
        which the state takes as they are (donated); only the others are initialised, from `rng` as without `given`.
        The initialisers of what `given` replaces are left out of the program (dead code), so a run from
        --config.init neither compiles nor holds a throwaway random copy of them. The optimizer state starts from the
        state's parameters."""
        if not given:
            return jax.jit(lambda key: sharding_lib.unbox(self.init_boxed(key)), out_shardings=self.shardings)(rng)

        def fresh(key, given):
            state = sharding_lib.unbox(self.init_boxed(key))
            params = dict(state.params, **given)
            return state.replace(params=params, opt_state=self.tx.init(params))

        return jax.jit(fresh, out_shardings=self.shardings, donate_argnums=1)(rng, given)

    def jit_train_step(self, train_step):
        return jit_train_step(train_step, self.shardings, self.mesh, self.rules)

    def jit_eval_step(self, eval_step):
        """`eval_step(params, batch) -> replicated outputs` (sums, predictions) jitted over the parameters'
        shardings and the batch sharding."""
        return jit_eval_step(eval_step, self.shardings.params, self.mesh, self.rules)

    def pretraining_step(self, grad_accum_steps: int = 1):
        """The pretraining train step (make_train_step), jitted as the loop runs it."""
        return self.jit_train_step(make_train_step(self.model, self.tx, self.schedule, self.rules, self.mesh,
                                                   grad_accum_steps))


def pretraining_model(model_config) -> nn.Module:
    """The pretraining model of `config.model` (a ConfigDict or an architecture's config): its architecture's
    (BertForPreTraining for BERT, ModernForMaskedLM for arch="modern")."""
    architecture = arch_lib.of(model_config)
    return architecture.pretraining_model(architecture.config(model_config))


def pretraining_setup(config, devices=None, num_steps: int | None = None) -> Setup:
    """The Setup of a pretraining config: pretraining_model of config.model, config.mesh over `devices` (default:
    all), config.optim's optimizer and schedule over `num_steps` (default train.num_steps), the state for
    config.data's shapes. The pretraining job, bert_jax.aot and the benchmarks build from it."""
    model = pretraining_model(config.model)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps if num_steps is None else num_steps)
    return Setup.build(model, tx, schedule, sharding_lib.create_mesh(config.mesh, devices),
                       sharding_lib.logical_rules(config.mesh),
                       init_inputs(config.data.max_seq_length, config.data.max_predictions_per_seq))
