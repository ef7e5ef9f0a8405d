"""Train state, the pure train/eval steps, and the training loop.

`train_step(state, batch, rng) -> (state, metrics)` and `eval_step(params, batch) -> sums` are pure functions; the
loop jits them with explicit in/out shardings over the mesh and donates the state, so parameters and optimizer
state are created, updated and kept sharded and no device ever holds more than its part.
"""

import dataclasses
import functools
import math
import time
from typing import Any, Iterator

from absl import logging
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import fileio
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax.data import packing
from bert_jax import sharding as sharding_lib

@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any


class NonFiniteLossError(RuntimeError):
    """Raised when a training step produced a NaN or infinite loss."""


def validate_config(config, num_devices: int, process_count: int = 1) -> None:
    """Checks the whole config once, at start-up, with errors that name the field and the fix."""
    model_config = model_lib.BertConfig.from_config(config.model)
    optim.validate(config.optim, config.train.num_steps)
    mesh_shape = sharding_lib.mesh_shape(config.mesh, num_devices)
    rules = dict(sharding_lib.logical_rules(config.mesh))
    if "batch" not in rules:
        raise ValueError("--config.mesh.rules has no rule for the logical axis 'batch'")
    batch_axes = rules["batch"] or ()
    batch_axes = (batch_axes,) if isinstance(batch_axes, str) else tuple(batch_axes)
    data_parallel = math.prod(mesh_shape[sharding_lib.MESH_AXES.index(axis)] for axis in batch_axes)
    train = config.train
    if train.num_steps <= 0:
        raise ValueError(f"--config.train.num_steps={train.num_steps}: must be positive")
    if train.log_every <= 0:
        raise ValueError(f"--config.train.log_every={train.log_every}: must be positive")
    if train.batch_size <= 0 or train.batch_size % data_parallel:
        raise ValueError(f"--config.train.batch_size={train.batch_size} must be a positive multiple of the "
                         f"{data_parallel} data-parallel devices (mesh axes {batch_axes} of mesh "
                         f"{dict(zip(sharding_lib.MESH_AXES, mesh_shape))})")
    if train.batch_size % process_count:
        raise ValueError(f"--config.train.batch_size={train.batch_size} must be divisible by the "
                         f"{process_count} processes")
    per_replica = train.batch_size // data_parallel
    if per_replica % config.optim.grad_accum_steps:
        raise ValueError(f"--config.optim.grad_accum_steps={config.optim.grad_accum_steps} must divide the "
                         f"per-device batch train.batch_size/{data_parallel} = {per_replica}")
    if train.profile_start_step < 0 or train.profile_steps <= 0:
        raise ValueError(f"--config.train.profile_start_step={train.profile_start_step} must be >= 0 (0: no trace) "
                         f"and --config.train.profile_steps={train.profile_steps} positive")
    ckpt = config.checkpoint
    if ckpt.every_steps < 0:
        raise ValueError(f"--config.checkpoint.every_steps={ckpt.every_steps}: must be >= 0 (0: save only at the "
                         "end and on SIGTERM)")
    if ckpt.max_to_keep <= 0:
        raise ValueError(f"--config.checkpoint.max_to_keep={ckpt.max_to_keep}: must be positive")
    if ckpt.keep_best and not config.data.eval_input_files and config.data.source != "corpus":
        raise ValueError("--config.checkpoint.keep_best=True ranks checkpoints by eval loss: set "
                         "--config.data.eval_input_files, or --config.checkpoint.keep_best=False")
    data = config.data
    if data.max_seq_length > model_config.max_position_embeddings:
        raise ValueError(f"--config.data.max_seq_length={data.max_seq_length} exceeds "
                         f"model.max_position_embeddings={model_config.max_position_embeddings}")
    if not 0 < data.max_predictions_per_seq <= data.max_seq_length:
        raise ValueError(f"--config.data.max_predictions_per_seq={data.max_predictions_per_seq} must be in "
                         f"[1, data.max_seq_length={data.max_seq_length}]")
    if data.source not in ("corpus", "synthetic", "tfrecord"):
        raise ValueError(f"--config.data.source={data.source!r}: choose 'corpus', 'synthetic' or 'tfrecord'")
    if data.source == "corpus" and not data.corpus:
        raise ValueError("--config.data.source=corpus needs --config.data.corpus (text globs, tfds:NAME or demo)")
    if data.source == "tfrecord" and not data.input_files:
        raise ValueError("--config.data.source=tfrecord needs --config.data.input_files=GLOB[,GLOB...]")
    packing.validate_config(data)


def pretraining_loss(outputs, batch, mlm_denominator, nsp_denominator):
    """MLM and NSP losses and accuracies as in the original BERT, over the given normalisers.

    MLM loss = sum(weights * cross-entropy) / (sum(weights) + 1e-5) and NSP loss = mean cross-entropy (over the
    real instances of packed rows, see `_nsp_terms`). The denominators are passed in so that micro-batches of one
    batch, normalised by the whole batch, sum to exactly the whole batch's loss (and gradient).
    """
    mlm_xent, mlm_correct = _mlm_terms(outputs["mlm_logits"], batch)
    mlm_loss = jnp.sum(mlm_xent) / mlm_denominator
    mlm_correct = jnp.sum(mlm_correct)
    nsp_xent, nsp_correct = _nsp_terms(outputs["nsp_logits"], batch)
    nsp_loss = jnp.sum(nsp_xent) / nsp_denominator
    nsp_correct = jnp.sum(nsp_correct)
    metrics = {"loss": mlm_loss + nsp_loss, "mlm_loss": mlm_loss, "nsp_loss": nsp_loss,
               "mlm_accuracy": mlm_correct / mlm_denominator, "nsp_accuracy": nsp_correct / nsp_denominator}
    return mlm_loss + nsp_loss, metrics


def _mlm_terms(mlm_logits, batch):
    """Per-prediction MLM cross-entropy and correctness, weighted by masked_lm_weights (zero for padding slots)."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)
    xent = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
    return weights * xent, weights * (jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"])


def _nsp_terms(nsp_logits, batch):
    """Per-instance NSP cross-entropy and correctness, flat; zero for the empty instance slots of packed rows."""
    labels = batch["next_sentence_labels"].reshape(-1)
    nsp_logits = nsp_logits.reshape(labels.shape[0], -1)  # packed rows: [batch, instances, 2] -> one per instance
    xent = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels)
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
    """One optimizer update; adds grad_norm and learning_rate to `metrics`. Returns (state, metrics)."""
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = dict(metrics, grad_norm=optax.tree.norm(grads), learning_rate=schedule(state.step))
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, schedule, rules, mesh,
                    grad_accum_steps: int = 1):
    """Returns the pure `train_step(state, batch, rng) -> (state, metrics)`.

    Dropout randomness is `fold_in(rng, step)`, so a step's masks depend only on the run's seed and the step number.
    With grad_accum_steps = k the batch is split into k strided micro-batches (each keeps every device's share of
    rows) whose gradients are summed in a scan; the result equals the whole batch's gradient.
    """
    batch_axes = sharding_lib.batch_spec(mesh, rules)[0]
    grad_fn = make_grad_fn(model, rules)

    def train_step(state: TrainState, batch, rng):
        dropout_rng = jax.random.fold_in(rng, state.step)
        mlm_denominator, nsp_denominator = batch_denominators(batch)
        if grad_accum_steps == 1:
            (_, metrics), grads = grad_fn(state.params, batch, dropout_rng, mlm_denominator, nsp_denominator)
        else:
            def split(x):
                x = x.reshape(x.shape[0] // grad_accum_steps, grad_accum_steps, *x.shape[1:]).swapaxes(0, 1)
                return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(None, batch_axes)))

            def accumulate(carry, micro):
                index, micro_batch = micro
                (_, metrics), grads = grad_fn(state.params, micro_batch, jax.random.fold_in(dropout_rng, index),
                                              mlm_denominator, nsp_denominator)
                return jax.tree.map(jnp.add, carry, (grads, metrics)), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            zero_metrics = dict.fromkeys(("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"),
                                         jnp.zeros((), jnp.float32))
            micro_batches = (jnp.arange(grad_accum_steps), jax.tree.map(split, batch))
            (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, zero_metrics), micro_batches)
        return apply_gradients(state, grads, tx, schedule, metrics)

    return train_step


def jit_train_step(train_step, state_shardings, mesh, rules):
    """`train_step(state, batch, rng) -> (state, metrics)` jitted as the training loop runs it: the state in its
    shardings and donated (updated in place), the batch in the mesh's batch sharding, the RNG and metrics
    replicated. Pretraining, fine-tuning, the benchmarks and ahead-of-time compilation all jit it this way."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jax.jit(train_step, in_shardings=(state_shardings, sharding_lib.batch_sharding(mesh, rules), replicated),
                   out_shardings=(state_shardings, replicated), donate_argnums=0)


def make_eval_step(model: nn.Module, rules):
    """Returns `eval_step(params, batch) -> sums` (no dropout); sums add up across batches."""
    def eval_step(params, batch):
        with nn.logical_axis_rules(rules):
            outputs = model.apply({"params": params}, **_model_inputs(batch), deterministic=True,
                                  sequence_output=False)
        mlm_xent, mlm_correct = _mlm_terms(outputs["mlm_logits"], batch)
        nsp_xent, nsp_correct = _nsp_terms(outputs["nsp_logits"], batch)
        _, nsp_count = batch_denominators(batch)
        return {
            "mlm_loss_sum": jnp.sum(mlm_xent),
            "mlm_correct": jnp.sum(mlm_correct),
            "mlm_weight": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "nsp_loss_sum": jnp.sum(nsp_xent),
            "nsp_correct": jnp.sum(nsp_correct).astype(jnp.float32),
            "nsp_count": nsp_count,
        }
    return eval_step


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


def abstract_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, seq_length: int,
                         max_predictions: int):
    """(shapes of the train state, its shardings), without allocating anything; plus the boxed init function."""
    inputs = _model_inputs(dummy_batch(1, seq_length, max_predictions))

    def init_boxed(rng):
        with nn.logical_axis_rules(rules):
            params = model.init({"params": rng}, **inputs, deterministic=True)["params"]
        # The optimizer state is built from the boxed params, so its moments inherit the parameters' axis names.
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))

    boxed = jax.eval_shape(init_boxed, jax.random.key(0))
    shardings = sharding_lib.tree_shardings(boxed, mesh, rules)
    return sharding_lib.unbox(boxed), shardings, init_boxed


def create_train_state(model: nn.Module, tx: optax.GradientTransformation, mesh, rules, rng,
                       seq_length: int, max_predictions: int):
    """Creates the train state already sharded: `jax.jit(init, out_shardings=...)`, so no device holds a full copy.

    Returns (state, state_shardings).
    """
    _, shardings, init_boxed = abstract_train_state(model, tx, mesh, rules, seq_length, max_predictions)
    init = jax.jit(lambda rng: sharding_lib.unbox(init_boxed(rng)), out_shardings=shardings)
    return init(rng), shardings


def evaluate(eval_step, params, batches: Iterator, batch_sharding, num_batches: int | None) -> dict[str, float]:
    """Held-out metrics over `num_batches` batches (None: until the data ends on any process)."""
    totals, count = None, 0
    while num_batches is None or count < num_batches:
        local = next(batches, None)
        # Every process must run the same number of sharded steps: stop when any one has run out.
        if not sharding_lib.all_processes_agree(local is not None):
            break
        sums = eval_step(params, sharding_lib.make_global_batch(local, batch_sharding))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        count += 1
    if totals is None:
        raise ValueError("evaluation read no batch: --config.data.eval_input_files holds fewer records than one "
                         "global batch (train.batch_size)")
    return metrics_lib.summarize_eval({k: float(v) for k, v in jax.device_get(totals).items()})


@dataclasses.dataclass
class _Run:
    """Everything a job needs, built once from the config: model, mesh, optimizer, data."""
    config: Any
    workdir: str
    model_config: model_lib.BertConfig
    model: nn.Module
    mesh: Any
    rules: Any
    tx: Any
    schedule: Any
    make_iterator: Any


def _build(config, workdir: str) -> _Run:
    # Imported here so the step functions above (and the benchmark) work where TensorFlow is not installed.
    from bert_jax.data import input_pipeline
    from bert_jax.data import tokenization
    from bert_jax.data import workdir as workdir_data
    validate_config(config, jax.device_count(), jax.process_count())
    if config.data.source == "corpus":
        workdir_data.prepare(config, workdir)  # makes WORKDIR/data once, then reads it as TFRecords
        validate_config(config, jax.device_count(), jax.process_count())
    model_config = model_lib.BertConfig.from_config(config.model)
    mesh = sharding_lib.create_mesh(config.mesh)
    tx, schedule = optim.create_optimizer(config.optim, config.train.num_steps)
    logging.info("mesh %s over %d devices (%s), %d processes", dict(mesh.shape), jax.device_count(),
                 jax.devices()[0].device_kind, jax.process_count())
    # The tokenizer, where known, bounds dynamic masking's random replacements (the model's vocab may be padded)
    # and tells whole-word masking which pieces continue a word.
    data = config.data
    tokenizer = tokenization.load_tokenizer(data.vocab_file) if data.vocab_file else None
    rules = sharding_lib.logical_rules(config.mesh)
    make_iterator = functools.partial(
        input_pipeline.make_iterator, data, batch_size=config.train.batch_size // jax.process_count(),
        vocab_size=model_config.vocab_size, process_index=jax.process_index(), process_count=jax.process_count(),
        tokenizer_vocab_size=tokenizer.vocab_size if tokenizer else None,
        whole_word_continuation=tokenizer.is_continuation if tokenizer else None,
        process_rows=sharding_lib.process_rows(sharding_lib.batch_sharding(mesh, rules), config.train.batch_size))
    return _Run(config, workdir, model_config, model_lib.BertForPreTraining(model_config), mesh, rules, tx,
                schedule, make_iterator)


def _checkpointer(run: _Run) -> checkpoint_lib.Checkpointer:
    ckpt = run.config.checkpoint
    return checkpoint_lib.Checkpointer(fileio.join(run.workdir, checkpoint_lib.CHECKPOINT_SUBDIR),
                                       every_steps=ckpt.every_steps, max_to_keep=ckpt.max_to_keep,
                                       keep_best=ckpt.keep_best, async_save=ckpt.async_save)


def _start_state(run: _Run, checkpointer, train_batches):
    """The state, RNG and input to start from; see bert_jax/checkpoint.py for the order.

    Returns (state, state_shardings, step_rng, train_batches).
    """
    data, train = run.config.data, run.config.train
    init_rng, step_rng = jax.random.split(jax.random.key(train.seed))
    abstract, shardings, _ = abstract_train_state(run.model, run.tx, run.mesh, run.rules, data.max_seq_length,
                                                  data.max_predictions_per_seq)
    replicated = NamedSharding(run.mesh, PartitionSpec())
    restored = checkpointer.restore_latest(abstract, shardings, replicated, train_batches)
    if restored is not None:
        step, state, step_rng = restored
        if train_batches.position == 0 and step > 0:
            # The input position was not restored (another process count): a stream seeded by the step, so the
            # run goes on with data it has not just seen rather than replaying its first batches.
            train_batches = run.make_iterator(split="train", seed=train.seed + step)
        logging.info("resumed from %s at step %d (input position: batch %d)",
                     fileio.join(checkpointer.directory, str(step)), step, train_batches.position)
        return state, shardings, step_rng, train_batches
    state, shardings = create_train_state(run.model, run.tx, run.mesh, run.rules, init_rng, data.max_seq_length,
                                          data.max_predictions_per_seq)
    if run.config.init:
        params, source = _init_params(run.config.init, run.model_config, abstract.params, shardings.params)
        state = state.replace(params=params)
        logging.info("initialised parameters from %s (--config.init); optimizer and step start afresh", source)
    else:
        logging.info("no checkpoint in %s: starting from scratch (seed %d)", checkpointer.directory, train.seed)
    return state, shardings, step_rng, train_batches


# Architecture fields an imported checkpoint must agree on with config.model (vocab_size may be padded up).
_ARCHITECTURE_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings",
                        "type_vocab_size", "hidden_act")


def _init_params(path: str, model_config: model_lib.BertConfig, abstract_params, params_shardings):
    """Parameters for --config.init: one of our checkpoints, or a HuggingFace / original Google / Flax export
    (bert_jax.export.load_pretrained: heads missing there are initialised and reported)."""
    if checkpoint_lib.is_checkpoint(path):
        return checkpoint_lib.restore_params(path, abstract_params, params_shardings)
    from bert_jax import export  # pylint: disable=import-outside-toplevel
    imported, params, report = export.load_pretrained(path, vocab_size=model_config.vocab_size)
    for field in _ARCHITECTURE_FIELDS:
        if getattr(imported, field) != getattr(model_config, field):
            raise ValueError(f"--config.init={path} has {field}={getattr(imported, field)!r} but "
                             f"--config.model.{field}={getattr(model_config, field)!r}; set "
                             f"--config.model.{field}={getattr(imported, field)!r}")
    for note in report.notes:
        logging.info("--config.init: %s", note)
    if report.initialized:
        logging.warning("--config.init: %s has no %s; initialised afresh", path, ", ".join(report.initialized))
    if model_config.scan_layers:  # imports are in the unrolled layout (layer_0, layer_1, ...)
        params = model_lib.stack_layers(params, model_config.num_layers)
    return jax.device_put(params, params_shardings), path


class _Profiler:
    """A profiler trace of steps [start, start + num_steps) into WORKDIR/profile (TensorBoard's profile tab)."""

    def __init__(self, workdir: str, start: int, num_steps: int):
        self.directory = fileio.join(workdir, "profile")
        self.start, self.stop = start, start + num_steps - 1
        self.active = False

    def before_step(self, step: int) -> None:
        if self.start > 0 and step == self.start:
            jax.profiler.start_trace(self.directory)
            self.active = True

    def after_step(self, step: int, outputs) -> None:
        if self.active and step >= self.stop:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.active = False
            logging.info("profiler trace of steps %d-%d written to %s", self.start, step, self.directory)


def train_and_evaluate(config, workdir: str) -> dict[str, float]:
    """Runs (or resumes) the pretraining job described by `config`; returns the last logged metrics.

    On SIGTERM it saves a checkpoint at the current step and returns early, with "preempted_at_step" set.
    """
    run = _build(config, workdir)
    data, train = config.data, config.train
    train_batches = run.make_iterator(split="train", seed=train.seed)
    writer = metrics_lib.MetricWriter(workdir)
    flops_per_step = model_lib.model_flops_per_sequence(
        run.model_config, data.max_seq_length, data.max_predictions_per_seq) * train.batch_size
    peak = metrics_lib.peak_flops_per_device(jax.devices()[0], train.peak_flops_per_device) * jax.device_count()
    checkpointer = _checkpointer(run)

    with jax.set_mesh(run.mesh):
        state, state_shardings, step_rng, train_batches = _start_state(run, checkpointer, train_batches)
        num_params = sum(x.size for x in jax.tree.leaves(state.params))
        logging.info("model: %s, %s parameters", run.model_config, f"{num_params:,}")
        batch_sharding = sharding_lib.batch_sharding(run.mesh, run.rules)
        replicated = NamedSharding(run.mesh, PartitionSpec())
        train_step = jit_train_step(make_train_step(run.model, run.tx, run.schedule, run.rules, run.mesh,
                                                    config.optim.grad_accum_steps), state_shardings, run.mesh,
                                    run.rules)
        eval_step = jax.jit(make_eval_step(run.model, run.rules),
                            in_shardings=(state_shardings.params, batch_sharding), out_shardings=replicated)
        if int(state.step) >= train.num_steps:
            logging.warning("the checkpoint is already at step %d of train.num_steps=%d: nothing to train (raise "
                            "--config.train.num_steps to train on)", int(state.step), train.num_steps)
        preemption = checkpoint_lib.PreemptionWatcher()
        profiler = _Profiler(workdir, train.profile_start_step, train.profile_steps)

        window: list[dict[str, float]] = []  # host metrics of the steps since the last log line
        timed_steps, window_start = 0, None
        last_logged: dict[str, float] = {}
        pending = None  # (step, device metrics) of the step before the one in flight

        def consume(step, device_metrics):
            host = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
            if not math.isfinite(host["loss"]):
                raise NonFiniteLossError(f"non-finite loss {host['loss']} at step {step}; stopping without "
                                         "saving this state (lower optim.learning_rate or check the data)")
            window.append(host)

        for step in range(int(state.step) + 1, train.num_steps + 1):
            profiler.before_step(step)
            batch = sharding_lib.make_global_batch(next(train_batches), batch_sharding)
            state, metrics = train_step(state, batch, step_rng)
            profiler.after_step(step, metrics)
            # Reading the previous step's metrics keeps one step in flight while still naming a bad step exactly.
            if pending is not None:
                consume(*pending)
            pending = (step, metrics)
            if window_start is None:  # the first step includes compilation: time from its end
                consume(*pending)
                pending, window_start = None, time.perf_counter()
            else:
                timed_steps += 1
            stop = preemption.should_stop(step)
            save = checkpointer.should_save(step) or step == train.num_steps or stop
            scalars = None
            if save or step % train.log_every == 0 or stop:
                if pending is not None:  # a state is saved only once its loss is known to be finite
                    consume(*pending)
                    pending = None
            if step % train.log_every == 0 or step == train.num_steps or stop:
                steps_per_second = timed_steps / (time.perf_counter() - window_start) if timed_steps else 0.0
                scalars = {k: float(np.mean([m[k] for m in window])) for k in window[0]}
                if steps_per_second:
                    scalars["sequences_per_second"] = steps_per_second * train.batch_size
                    scalars["tokens_per_second"] = scalars["sequences_per_second"] * data.max_seq_length
                    if peak:
                        scalars["mfu"] = flops_per_step * steps_per_second / peak
                if data.eval_input_files and (step % train.eval_every == 0 or step == train.num_steps):
                    eval_batches = run.make_iterator(split="eval", seed=train.seed)
                    scalars.update(evaluate(eval_step, state.params, eval_batches, batch_sharding,
                                            train.eval_steps))
                logging.info("%s", metrics_lib.log_line(step, train.num_steps, scalars, steps_per_second))
                writer.write(step, scalars)
                last_logged = dict(scalars, step=step)
                window, timed_steps, window_start = [], 0, time.perf_counter()
            if save:
                blocked = checkpointer.save(step, state, step_rng, train_batches, metrics=scalars)
                logging.info("checkpoint: saving step %d to %s in the background (the loop waited %.3f s)", step,
                             checkpointer.directory, blocked)
            if stop:
                checkpointer.wait()
                logging.warning("SIGTERM received: saved a checkpoint at step %d in %s; stopping. Run the same "
                                "command again to resume.", step, checkpointer.directory)
                last_logged["preempted_at_step"] = step
                break
        checkpointer.close()
        preemption.close()
    writer.close()
    return last_logged


def evaluate_checkpoint(config, workdir: str, checkpoint: str = "") -> dict[str, float]:
    """`--mode=eval`: held-out MLM loss/accuracy/perplexity and NSP loss/accuracy of a checkpoint's parameters.

    `checkpoint` is a step directory or a checkpoints directory (its latest step); default WORKDIR/checkpoints.
    Reads the whole held-out set (data.eval_input_files, or the workdir's held-out split for data=corpus; the
    synthetic source has no end, so train.eval_steps batches of it). Results go to the log, to
    WORKDIR/eval_metrics.jsonl and to TensorBoard under WORKDIR/tensorboard_eval.
    """
    run = _build(config, workdir)
    if not config.data.eval_input_files and config.data.source != "synthetic":
        raise ValueError("--mode=eval needs held-out data: set --config.data.eval_input_files (or use "
                         "data=corpus with data.eval_every_nth_document > 0)")
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    with jax.set_mesh(run.mesh):
        abstract, shardings, _ = abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                                      config.data.max_seq_length,
                                                      config.data.max_predictions_per_seq)
        params, source = checkpoint_lib.restore_params(checkpoint, abstract.params, shardings.params)
        step = int(source.rstrip("/").rsplit("/", 1)[-1]) if source.rstrip("/").rsplit("/", 1)[-1].isdigit() else 0
        batch_sharding = sharding_lib.batch_sharding(run.mesh, run.rules)
        eval_step = jax.jit(make_eval_step(run.model, run.rules), in_shardings=(shardings.params, batch_sharding),
                            out_shardings=NamedSharding(run.mesh, PartitionSpec()))
        num_batches = config.train.eval_steps if config.data.source == "synthetic" else None
        results = evaluate(eval_step, params, run.make_iterator(split="eval", seed=config.train.seed),
                           batch_sharding, num_batches)
    writer = metrics_lib.MetricWriter(workdir, tensorboard_subdir="tensorboard_eval",
                                      jsonl_name="eval_metrics.jsonl")
    writer.write(step, dict(results))
    writer.close()
    logging.info("eval of %s: %s", source, " | ".join(f"{k} {v:.4f}" for k, v in results.items()))
    return dict(results, step=step)


def export_checkpoint(config, workdir: str, checkpoint: str = "", export_format: str = "hf", output: str = "") -> str:
    """`--mode=export`: a checkpoint's parameters (default: the workdir's latest) as HuggingFace or Flax files.

    The tokenizer is the run's (data.vocab_file, or the one the workdir's data step trained), so the export carries
    the vocabulary the model was trained with, and the vocab padding is removed.
    """
    from bert_jax import export  # pylint: disable=import-outside-toplevel
    from bert_jax.data import tokenization  # pylint: disable=import-outside-toplevel
    from bert_jax.data import workdir as workdir_data  # pylint: disable=import-outside-toplevel
    if config.data.source == "corpus":
        workdir_data.prepare(config, workdir)  # finds WORKDIR/data: the tokenizer and the padded vocab size
    model_config = model_lib.BertConfig.from_config(config.model)
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file) if config.data.vocab_file else None
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    output = output or fileio.join(fileio.join(workdir, "export"), export_format)
    return export.export_checkpoint(checkpoint, model_config, output, tokenizer=tokenizer,
                                    export_format=export_format)
