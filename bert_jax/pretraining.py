"""The pretraining job around the pure steps of bert_jax.train: the training loop, and the eval and export modes.

`train_and_evaluate(config, workdir)` builds the model, mesh, optimizer and input from a config that
bert_jax.job_config.prepare made ready (--config.init's architecture, the data made for data.source=corpus, every
field checked), starts from the workdir's checkpoint, --config.init or scratch, and runs the loop: log lines, evaluation, checkpoints, SIGTERM, profiling.
"""

import contextlib
import dataclasses
import functools
import time
from typing import Callable, Iterator

from absl import logging
from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from bert_jax import checkpoint as checkpoint_lib
from bert_jax import divergence
from bert_jax import fileio
from bert_jax import metrics as metrics_lib
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax.interop import init_architecture
from bert_jax.interop import layout
from bert_jax.interop import pretrained
from bert_jax import sharding as sharding_lib
from bert_jax.train import (TrainState, abstract_train_state, dropout_key, create_train_state, jit_eval_step,
                            jit_train_step, make_eval_step, make_train_step)


def evaluate(eval_step, params, batches: Iterator, batch_sharding, num_batches: int | None) -> dict[str, float]:
    """Held-out metrics over `num_batches` global batches (None: the whole held-out set), with "eval_records", the
    number of records (instances) they cover.

    The metrics are weighted sums over weighted counts (see train.make_eval_step), so padding rows count for
    nothing and the result is that of evaluating each record once, on any mesh and number of processes.
    """
    totals, count = None, 0
    while num_batches is None or count < num_batches:
        local = next(batches, None)
        # Every process must run the same number of sharded steps: go on while any one has data; a process whose
        # share has run out feeds batches of weight 0 (its shard may hold a batch fewer than another's).
        if sharding_lib.all_processes_agree(local is None):
            break
        if local is None:
            local = batches.empty_batch()
        sums = eval_step(params, sharding_lib.make_global_batch(local, batch_sharding))
        totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
        count += 1
    if totals is None:
        raise ValueError("evaluation read no batch: the held-out data (--config.data.eval_input_files) is empty")
    sums = {k: float(v) for k, v in jax.device_get(totals).items()}
    records = int(round(sums["nsp_count"]))
    logging.info("evaluation: %d held-out records (%d masked tokens) in %d batches", records,
                 int(round(sums["mlm_weight"])), count)
    return dict(metrics_lib.summarize_eval(sums), eval_records=records)


@dataclasses.dataclass
class _Run:
    """Everything a job needs, built once from the config: model, mesh, optimizer, data."""
    config: ml_collections.ConfigDict
    workdir: str
    model_config: model_lib.BertConfig
    model: nn.Module
    mesh: jax.sharding.Mesh
    rules: tuple  # logical axis name -> mesh axes (sharding.logical_rules)
    tx: optax.GradientTransformation
    schedule: optax.Schedule
    make_iterator: Callable[..., Iterator]  # (split=, seed=) -> the input pipeline's iterator


@dataclasses.dataclass
class _Start:
    """What the loop starts from (see _start_state)."""
    state: TrainState
    shardings: TrainState  # of `state`
    step_rng: jax.Array
    batches: Iterator  # the training input, at the position the state was saved with
    health: divergence.Health  # the checkpoint's record, with a rewind that checkpoint.restore_step asks for added
    position: int  # the input position the checkpoint holds (before any skip; 0 from scratch)


def _require_prepared_data(config) -> None:
    if config.data.source == "corpus":
        raise ValueError("data.source='corpus': make the data first with bert_jax.job_config.prepare(config, "
                         "workdir, mode), as bert_jax.main does; it points the config at the TFRecords it writes")


def _build(config, workdir: str) -> _Run:
    # Imported here so that importing this module does not import TensorFlow.
    from bert_jax.data import input_pipeline  # pylint: disable=import-outside-toplevel
    from bert_jax.data import tokenization  # pylint: disable=import-outside-toplevel
    _require_prepared_data(config)
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
                                       keep_best=ckpt.keep_best, async_save=ckpt.async_save,
                                       compression=ckpt.compression)


def _start_state(run: _Run, checkpointer, train_batches) -> _Start:
    """The state, RNG and input to start from; see bert_jax/checkpoint.py for the order."""
    data, train, ckpt = run.config.data, run.config.train, run.config.checkpoint
    init_rng = jax.random.split(jax.random.key(train.seed))[0]
    step_rng = dropout_key(train.seed, train.dropout_rng, jax.devices()[0].platform)
    abstract, shardings, _ = abstract_train_state(run.model, run.tx, run.mesh, run.rules, data.max_seq_length,
                                                  data.max_predictions_per_seq)
    replicated = NamedSharding(run.mesh, PartitionSpec())
    rewind = bool(ckpt.restore_step) and _rewind_on_request(checkpointer, ckpt.restore_step, ckpt.skip_batches)
    restored = checkpointer.restore_latest(abstract, shardings, replicated, train_batches,
                                           rng_impl=jax.random.key_impl(step_rng))
    if restored is not None:
        step, state, step_rng, record = restored
        health = divergence.Health.from_json(record)
        if train_batches.position == 0 and step > 0:
            # The input position was not restored (another process count): a stream seeded by the step, so the
            # run goes on with data it has not just seen rather than replaying its first batches.
            train_batches = run.make_iterator(split="train", seed=train.seed + step)
        position = train_batches.position
        if rewind:
            if step != ckpt.restore_step:
                raise ValueError(f"--config.checkpoint.restore_step={ckpt.restore_step}: that checkpoint could not "
                                 "be restored (set aside as corrupt, see the warning above); name another step")
            _skip_batches(train_batches, ckpt.skip_batches, "--config.checkpoint.skip_batches")
            health.rewinds.append({"step": step, "skip_batches": ckpt.skip_batches, "automatic": False})
        logging.info("resumed from %s at step %d (input position: batch %d)",
                     fileio.join(checkpointer.directory, str(step)), step, train_batches.position)
        return _Start(state, shardings, step_rng, train_batches, health, position)
    state, shardings = create_train_state(run.model, run.tx, run.mesh, run.rules, init_rng, data.max_seq_length,
                                          data.max_predictions_per_seq)
    if run.config.init:
        params, source = _init_params(run.config.init, run.model_config, abstract.params, shardings.params)
        state = state.replace(params=params)
        logging.info("initialised parameters from %s (--config.init); optimizer and step start afresh", source)
    else:
        logging.info("no checkpoint in %s: starting from scratch (seed %d)", checkpointer.directory, train.seed)
    return _Start(state, shardings, step_rng, train_batches, divergence.Health(), 0)


def _rewind_on_request(checkpointer, step: int, skip_batches: int) -> bool:
    """checkpoint.restore_step: sets aside the checkpoints newer than `step` (as STEP.rewound) so that the run
    resumes from it; True. False when this run's lineage has already done so (the newest checkpoint records the
    rewind): rerunning the same command after a preemption resumes from the newest checkpoint, skipping nothing."""
    steps = checkpointer.all_steps()
    for newest in reversed(steps):
        try:
            record = checkpointer.read_health(newest)
        except Exception:  # pylint: disable=broad-except  # a damaged one: the restore below sets it aside
            continue
        if divergence.Health.from_json(record).has_rewind(step, skip_batches):
            logging.info("--config.checkpoint.restore_step=%d (skip_batches=%d) is already in effect: checkpoint %d "
                         "was written after that rewind; resuming from the newest checkpoint", step, skip_batches,
                         newest)
            return False
        break
    if step not in steps:
        directory = epath.Path(checkpointer.directory)
        aside = sorted(path.name for path in directory.glob(f"{step}.*")) if directory.exists() else []
        raise ValueError(f"--config.checkpoint.restore_step={step}: {directory} has no checkpoint of step {step} "
                         f"(it has steps {steps}" + (f"; set aside: {aside}, rename one back to {step} to use it"
                                                      if aside else "") + ")")
    for newer in (newer for newer in steps if newer > step):
        target = checkpointer.set_aside(newer, "rewound")
        logging.warning("--config.checkpoint.restore_step=%d: checkpoint %d moved aside to %s", step, newer, target)
    return True


def _skip_batches(batches, count: int, field: str) -> None:
    """Advances the input by `count` batches (read and dropped): nothing else changes."""
    for skipped in range(count):
        if next(batches, None) is None:
            raise ValueError(f"{field}={count}: the training input ended after {skipped} skipped batches")
    if count:
        logging.info("skipped %d batches of input (%s); the input position is now batch %d", count, field,
                     batches.position)


def _init_params(path: str, model_config: model_lib.BertConfig, abstract_params, params_shardings):
    """Parameters for --config.init: one of our checkpoints, or a HuggingFace / original Google / Flax export
    (bert_jax.interop.pretrained.load_pretrained: heads missing there are initialised and reported). `model_config` has
    the checkpoint's architecture (train_and_evaluate resolved it); the vocabulary may be padded."""
    if checkpoint_lib.is_checkpoint(path):
        return checkpoint_lib.restore_params(path, abstract_params, params_shardings)
    _, params, report = pretrained.load_pretrained(path, vocab_size=model_config.vocab_size)
    for note in report.notes:
        logging.info("--config.init: %s", note)
    if report.initialized:
        logging.warning("--config.init: %s has no %s; initialised afresh", path, ", ".join(report.initialized))
    if model_config.scan_layers:  # imports are in the unrolled layout (layer_0, layer_1, ...)
        params = layout.stack_layers(params, model_config.num_layers)
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


@dataclasses.dataclass
class TrainResult:
    metrics: dict[str, float]  # the last log line's, with "step" (empty when there was nothing to train)
    preempted_at_step: int | None = None  # SIGTERM stopped the run after saving a checkpoint of this step


def train_and_evaluate(config, workdir: str) -> TrainResult:
    """Runs (or resumes) the pretraining job described by `config` (from bert_jax.job_config.prepare).

    On SIGTERM it saves a checkpoint at the current step and returns early (TrainResult.preempted_at_step).
    """
    # Model, mesh, optimizer and input.
    run = _build(config, workdir)
    init_architecture.write_run_model_config(workdir, run.model_config)  # what a later --config.init of this run reads
    checkpointer = _checkpointer(run)
    with jax.set_mesh(run.mesh):
        # State: the workdir's newest checkpoint, else --config.init, else scratch.
        start = _start_state(run, checkpointer, run.make_iterator(split="train", seed=config.train.seed))
        num_params = sum(x.size for x in jax.tree.leaves(start.state.params))
        logging.info("model: %s, %s parameters", run.model_config, f"{num_params:,}")
        if int(start.state.step) >= config.train.num_steps:
            logging.warning("the checkpoint is already at step %d of train.num_steps=%d: nothing to train (raise "
                            "--config.train.num_steps to train on)", int(start.state.step), config.train.num_steps)
        # Steps, and the loop that runs them.
        loop = _Loop(run, checkpointer, start, workdir)
        try:
            result = loop.run()
        except BaseException:
            with contextlib.suppress(Exception):  # a save in flight completes before the error is raised
                checkpointer.close()
            raise
        finally:
            loop.preemption.close()
        checkpointer.close()
    loop.writer.close()
    return result


class _Window:
    """The host metrics of the steps since the last log line, and their rate. The first step after a (re)start
    compiles: it is judged at once and the clock starts at its end."""

    def __init__(self):
        self.metrics: list[dict[str, float]] = []
        self.timed_steps, self.start = 0, None

    def summary(self) -> tuple[dict[str, float], float]:
        """(the mean of each metric, steps per second: 0.0 when no step was timed)."""
        steps_per_second = self.timed_steps / (time.perf_counter() - self.start) if self.timed_steps else 0.0
        return {k: float(np.mean([m[k] for m in self.metrics])) for k in self.metrics[0]}, steps_per_second

    def restart(self) -> None:
        self.metrics, self.timed_steps, self.start = [], 0, time.perf_counter()


class _Loop:
    """The training loop: one step in flight, each judged by the next step's metrics read (bert_jax.divergence),
    log lines with evaluations, checkpoints saved once their loss is known to be healthy, SIGTERM, rewinds."""

    def __init__(self, run: _Run, checkpointer, start: "_Start", workdir: str):
        config, train = run.config, run.config.train
        self.job, self.checkpointer, self.workdir = run, checkpointer, workdir
        self.state, self.rng, self.batches = start.state, start.step_rng, start.batches
        self.state_shardings = start.shardings
        self.batch_sharding = sharding_lib.batch_sharding(run.mesh, run.rules)
        self.train_step = jit_train_step(make_train_step(run.model, run.tx, run.schedule, run.rules, run.mesh,
                                                         config.optim.grad_accum_steps), start.shardings, run.mesh,
                                         run.rules)
        self.eval_step = jit_eval_step(make_eval_step(run.model, run.rules), start.shardings.params, run.mesh,
                                       run.rules)
        self.flops_per_step = metrics_lib.model_flops_per_sequence(
            run.model_config, config.data.max_seq_length, config.data.max_predictions_per_seq) * train.batch_size
        self.peak = metrics_lib.peak_flops_per_device(jax.devices()[0], train.peak_flops_per_device)
        self.peak *= jax.device_count()
        # Steps after the one resumed from are logged again: their records from an interrupted run go.
        self.writer = metrics_lib.MetricWriter(workdir, resume_step=int(self.state.step))
        self.preemption = checkpoint_lib.PreemptionWatcher()
        self.profiler = _Profiler(workdir, train.profile_start_step, train.profile_steps)
        self.monitor = divergence.Monitor(train.spike_factor, train.spike_window, start.health)
        checkpointer.protect(self.monitor.newest_verified(checkpointer.all_steps()))
        # Checkpoints whose parameters the next step judges: the one resumed from and those saved by this process.
        step = int(self.state.step)
        self.unjudged = {step} if step in checkpointer.all_steps() else set()
        self.positions = {step: start.position}  # checkpoint step -> the input position it holds
        self.fed: dict[int, int] = {}  # step -> the input position of its batch, for the steps not yet judged
        self.last_logged: dict[str, float] = {}

    def run(self) -> TrainResult:
        while True:
            try:
                return self._train()
            except divergence.Diverged as diverged:
                self._rewind(diverged)

    def _train(self) -> TrainResult:
        train = self.job.config.train
        window, pending = _Window(), None  # pending: (step, device metrics) of the step before the one in flight
        for step in range(int(self.state.step) + 1, train.num_steps + 1):
            metrics = self._step(step)
            # Reading the previous step's metrics keeps one step in flight while still naming a bad step exactly.
            if pending is not None:
                self._judge(*pending, window)
            pending = (step, metrics)
            if window.start is None:
                self._judge(*pending, window)
                pending = None
                window.start = time.perf_counter()
            else:
                window.timed_steps += 1
            stop = self.preemption.should_stop(step)
            save = self.checkpointer.should_save(step) or step == train.num_steps or stop
            log = step % train.log_every == 0 or step == train.num_steps or stop
            if (save or log) and pending is not None:  # a state is saved only once its loss is known to be healthy
                self._judge(*pending, window)
                pending = None
            scalars = self._log(step, window) if log else None
            if save:
                self._save(step, scalars)
            if stop:
                self.checkpointer.wait()
                logging.warning("SIGTERM received: saved a checkpoint at step %d in %s; stopping. Run the same "
                                "command again to resume.", step, self.checkpointer.directory)
                return TrainResult(self.last_logged, preempted_at_step=step)
        return TrainResult(self.last_logged)

    def _step(self, step: int):
        """Dispatches step `step`; returns its metrics, still on the devices."""
        self.profiler.before_step(step)
        self.fed[step] = self.batches.position
        self.fed.pop(step - 3, None)
        batch = sharding_lib.make_global_batch(next(self.batches), self.batch_sharding)
        self.state, metrics = self.train_step(self.state, batch, self.rng)
        self.checkpointer.check()  # a background save that failed stops the run now, not at the next save
        self.profiler.after_step(step, metrics)
        return metrics

    def _judge(self, step: int, device_metrics, window: _Window) -> None:
        """Raises divergence.Diverged if step `step` diverged; else verifies the checkpoint it started from."""
        host = {k: float(v) for k, v in jax.device_get(device_metrics).items()}
        self.monitor.check(step, host)
        if step - 1 in self.unjudged:
            self.unjudged.discard(step - 1)
            self.monitor.verify(step - 1)
            self.checkpointer.protect(step - 1)
        del host["params_finite"]
        window.metrics.append(host)

    def _log(self, step: int, window: _Window) -> dict[str, float]:
        """The log line of the steps in `window` (plus an evaluation when one is due): logged and written."""
        config = self.job.config
        data, train = config.data, config.train
        scalars, steps_per_second = window.summary()
        if steps_per_second:
            scalars["sequences_per_second"] = steps_per_second * train.batch_size
            scalars["tokens_per_second"] = scalars["sequences_per_second"] * data.max_seq_length
            if self.peak:
                scalars["mfu"] = self.flops_per_step * steps_per_second / self.peak
        if data.eval_input_files and (step % train.eval_every == 0 or step == train.num_steps):
            eval_batches = self.job.make_iterator(split="eval", seed=train.seed)
            scalars.update(evaluate(self.eval_step, self.state.params, eval_batches, self.batch_sharding,
                                    train.eval_steps))
        logging.info("%s", metrics_lib.log_line(step, train.num_steps, scalars, steps_per_second))
        self.writer.write(step, scalars)
        self.last_logged = dict(scalars, step=step)
        window.restart()  # after the evaluation: it is not training time
        return scalars

    def _save(self, step: int, scalars: dict[str, float] | None) -> None:
        self.checkpointer.save(step, self.state, self.rng, self.batches, metrics=scalars,
                               health=self.monitor.record(self.checkpointer.all_steps()))  # logs how it saved
        self.unjudged.add(step)
        self.positions[step] = self.batches.position

    def _rewind(self, diverged: divergence.Diverged) -> None:
        """Goes on from the newest verified checkpoint past the input that diverged, or raises DivergenceError."""
        self.state, self.rng, self.batches, self.monitor = _rewind_after(
            diverged, self.fed.get(diverged.step), self.job, self.checkpointer, self.monitor, self.state,
            self.state_shardings, self.rng, self.batches, self.positions)
        self.unjudged = {int(self.state.step)}
        self.writer.close()  # its records after the step rewound to go
        self.writer = metrics_lib.MetricWriter(self.workdir, resume_step=int(self.state.step))


def _batches_to_skip(diverged_step: int, diverged_position: int | None, step: int, position: int | None) -> int:
    """Batches to skip after restoring checkpoint `step` (holding input `position`) to be past the batch step
    `diverged_step` was fed (at input `diverged_position`)."""
    if position is None or diverged_position is None:
        return diverged_step - step  # one batch per step since that checkpoint
    return diverged_position + 1 - position


def _rewind_after(diverged: divergence.Diverged, diverged_position: int | None, run: _Run, checkpointer, monitor,
                  state, state_shardings, rng, train_batches, positions: dict[int, int]):
    """After step S diverged: checkpoint S-1, whose parameters S started from, is set aside as diverged; then,
    while checkpoint.max_rewinds allows, the newest verified checkpoint is restored and
    checkpoint.rewind_skip_batches of input skipped (returns (state, rng, input, monitor) to go on from); otherwise
    DivergenceError names the checkpoint to resume from."""
    ckpt = run.config.checkpoint
    checkpointer.wait()  # a save in flight completes: the checkpoints left stay whole
    existing = checkpointer.all_steps()
    aside = ""
    if diverged.step - 1 in existing and diverged.step - 1 not in monitor.health.verified:
        target = checkpointer.set_aside(diverged.step - 1, "diverged")
        aside = (f" Checkpoint {diverged.step - 1}, whose parameters that step started from, is set aside as "
                 f"{target}.")
        existing = checkpointer.all_steps()
    verified = monitor.newest_verified(existing)
    rewinds = monitor.health.automatic_rewinds()
    if verified is not None and rewinds < ckpt.max_rewinds:
        logging.warning("%s; stopped without saving it.%s Rewinding to checkpoint %d, the newest verified one, and "
                        "skipping the input through the batch that diverged, plus checkpoint.rewind_skip_batches=%d "
                        "(automatic rewind %d of checkpoint.max_rewinds=%d)", diverged, aside, verified,
                        ckpt.rewind_skip_batches, rewinds + 1, ckpt.max_rewinds)
        for newer in (newer for newer in existing if newer > verified):  # never judged: a restart must not use them
            checkpointer.set_aside(newer, "rewound")
        # The restore target: the shapes of the state being replaced, and the run's own kind of dropout key.
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        restored = checkpointer.restore_latest(abstract, state_shardings, NamedSharding(run.mesh, PartitionSpec()),
                                               train_batches, rng_impl=jax.random.key_impl(rng))
        if restored is None:
            raise divergence.DivergenceError(f"no checkpoint in {checkpointer.directory} could be restored to rewind "
                                             "to (see the warnings above): rerun to start again")
        step, state, rng, record = restored
        positions[step] = train_batches.position
        # Past the batch that diverged: from the same parameters, with the same dropout, it would diverge again.
        skip = _batches_to_skip(diverged.step, diverged_position, step, positions[step]) + ckpt.rewind_skip_batches
        health = divergence.Health.from_json(record)
        # The lineage this process knows (which may hold rewinds since that checkpoint was saved), plus this one.
        health.rewinds = [*monitor.health.rewinds, {"step": step, "skip_batches": skip, "automatic": True}]
        health.verified = sorted({*health.verified, *(s for s in monitor.health.verified if s <= step), step})
        _skip_batches(train_batches, skip, "--config.checkpoint.rewind_skip_batches")
        logging.info("resumed from %s at step %d (input position: batch %d)",
                     fileio.join(checkpointer.directory, str(step)), step, train_batches.position)
        return state, rng, train_batches, divergence.Monitor(monitor.spike_factor, monitor.spike_window, health)
    past = "--config.checkpoint.restore_step=STEP --config.checkpoint.skip_batches=K"
    if verified is not None:
        past = (f"--config.checkpoint.restore_step={verified} --config.checkpoint.skip_batches="
                f"{_batches_to_skip(diverged.step, diverged_position, verified, positions.get(verified))}")
    fix = "with a lower --config.optim.learning_rate (or stronger clipping, --config.optim.max_grad_norm)"
    if existing:
        fix += f", or past the data that diverged ({past}; or automatically: --config.checkpoint.max_rewinds=N)"
    if verified is not None:
        how = (f"The newest checkpoint whose parameters gave a healthy next step is step {verified} in "
               f"{checkpointer.directory}: rerun to resume from it" if verified == existing[-1] else
               f"The newest checkpoint whose parameters gave a healthy next step is step {verified} in "
               f"{checkpointer.directory}: rerun with --config.checkpoint.restore_step={verified} to resume from it")
    elif existing:
        how = (f"No checkpoint left was verified by a healthy next step; the newest is step {existing[-1]} in "
               f"{checkpointer.directory}: rerun to resume from it")
    else:
        how = "No checkpoint is left to resume from: rerun to start again"
    if verified is not None and ckpt.max_rewinds:
        how = f"checkpoint.max_rewinds={ckpt.max_rewinds} automatic rewinds are used up. " + how
    raise divergence.DivergenceError(f"{diverged}; stopped without saving it.{aside} {how}, {fix}")


def evaluate_checkpoint(config, workdir: str, checkpoint: str = "") -> dict[str, float]:
    """`--mode=eval`: held-out MLM loss/accuracy/perplexity and NSP loss/accuracy of a checkpoint's parameters.

    `checkpoint` is a step directory or a checkpoints directory (its latest step); default WORKDIR/checkpoints.
    Reads the whole held-out set, each record once (data.eval_input_files, or the workdir's held-out split for
    data=corpus; the synthetic source has no end, so train.eval_steps batches of it), and needs no training data.
    Results, with the number of records evaluated (eval_records), go to the log, to WORKDIR/eval_metrics.jsonl and
    to TensorBoard under WORKDIR/tensorboard_eval.
    """
    run = _build(config, workdir)  # needs held-out data only (job_config checked it for mode "eval")
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    with jax.set_mesh(run.mesh):
        abstract, shardings, _ = abstract_train_state(run.model, run.tx, run.mesh, run.rules,
                                                      config.data.max_seq_length,
                                                      config.data.max_predictions_per_seq)
        params, source = checkpoint_lib.restore_params(checkpoint, abstract.params, shardings.params)
        step = int(source.rstrip("/").rsplit("/", 1)[-1]) if source.rstrip("/").rsplit("/", 1)[-1].isdigit() else 0
        batch_sharding = sharding_lib.batch_sharding(run.mesh, run.rules)
        eval_step = jit_eval_step(make_eval_step(run.model, run.rules), shardings.params, run.mesh, run.rules)
        num_batches = config.train.eval_steps if config.data.source == "synthetic" else None
        results = evaluate(eval_step, params, run.make_iterator(split="eval", seed=config.train.seed),
                           batch_sharding, num_batches)
    writer = metrics_lib.MetricWriter(workdir, tensorboard_subdir="tensorboard_eval",
                                      jsonl_name="eval_metrics.jsonl")
    writer.write(step, dict(results))
    writer.close()
    logging.info("eval of %s: %s", source,
                 " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in results.items()))
    return dict(results, step=step)


def export_checkpoint(config, workdir: str, checkpoint: str = "", export_format: str = "hf", output: str = "") -> str:
    """`--mode=export`: a checkpoint's parameters (default: the workdir's latest) as HuggingFace or Flax files.

    The tokenizer is the run's (data.vocab_file, or the one the workdir's data step trained), so the export carries
    the vocabulary the model was trained with, and the vocab padding is removed.
    """
    from bert_jax.interop import export  # pylint: disable=import-outside-toplevel
    from bert_jax.data import tokenization  # pylint: disable=import-outside-toplevel
    _require_prepared_data(config)  # the tokenizer and the padded vocab size are the data step's
    model_config = model_lib.BertConfig.from_config(config.model)
    tokenizer = tokenization.load_tokenizer(config.data.vocab_file) if config.data.vocab_file else None
    checkpoint = checkpoint or fileio.join(workdir, checkpoint_lib.CHECKPOINT_SUBDIR)
    output = output or fileio.join(fileio.join(workdir, "export"), export_format)
    return export.export_checkpoint(checkpoint, model_config, output, tokenizer=tokenizer,
                                    export_format=export_format)
